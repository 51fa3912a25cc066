//! The OCI image archives deploy/image/build.sh makes (scripts/test builds
//! them and names the directory in `IMAGE_ARCHIVE_DIR`; built here
//! otherwise), one per target deploy/docker/Dockerfile describes, KKP's two
//! layouts included: each archive is a well-formed OCI layout whose blobs
//! match their digests; each image's config names a numeric non-root user,
//! the Dockerfile's entrypoint and the version; its file system holds the
//! files the Dockerfile copies, the pinned base (C library, CA bundle, time
//! zones, the 65532 user) and no shell; the entrypoint runs from the
//! unpacked file system (chroot, as that user) and prints the version the
//! image is tagged with; and a second build of the same inputs gives the
//! same digests. Needs root (chroot), as the test command has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const UID: u32 = 65532;
/// Programs that would make a shell available in the image.
const SHELLS: [&str; 7] = ["sh", "bash", "dash", "ash", "zsh", "ksh", "busybox"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no image architecture for {other}"),
    }
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The binaries the images hold (`IMAGE_BIN_DIR`, as scripts/test builds
/// them; built here otherwise).
fn image_bins() -> PathBuf {
    if let Some(d) = std::env::var_os("IMAGE_BIN_DIR") {
        return PathBuf::from(d);
    }
    run(&mut Command::new(
        repo().join("deploy/docker/build-binaries.sh"),
    ));
    repo().join("target/image").join(host_arch())
}

fn build(out: &Path, bins: &Path) {
    run(Command::new(repo().join("deploy/image/build.sh"))
        .arg(out)
        .arg(format!("{}={}", host_arch(), bins.display())));
}

/// The archives to check: `IMAGE_ARCHIVE_DIR`, or built here once.
fn archives() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("IMAGE_ARCHIVE_DIR") {
            return PathBuf::from(d);
        }
        let out = repo().join("target/image-archives/test");
        build(&out, &image_bins());
        out
    })
    .clone()
}

/// What deploy/docker/Dockerfile says of one image: entrypoint and the
/// files it copies (destination to source: `bin:NAME` for a binary of the
/// build stage, `repo:PATH` for a repository file), its parents' included.
#[derive(Debug, Clone, Default)]
struct Target {
    entrypoint: String,
    files: BTreeMap<String, String>,
}

fn dockerfile_targets() -> BTreeMap<String, Target> {
    let text = std::fs::read_to_string(repo().join("deploy/docker/Dockerfile")).unwrap();
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with('#') || (l.is_empty() && cur.is_empty()) {
            continue;
        }
        match l.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                lines.push(std::mem::take(&mut cur));
            }
        }
    }
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    let mut current: Option<String> = None;
    for l in lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        match words.first().copied() {
            Some("FROM") => {
                let name = words[words.len() - 1].to_string();
                let parent = words[words.len() - 3];
                // An image is a stage built on `runtime` or on another image.
                let base = match parent {
                    "runtime" => Some(Target::default()),
                    p => targets.get(p).cloned(),
                };
                current = base.map(|t| {
                    targets.insert(name.clone(), t);
                    name
                });
            }
            Some("COPY") if current.is_some() => {
                let t = targets.get_mut(current.as_ref().unwrap()).unwrap();
                let (src, dest) = (words[words.len() - 2], words[words.len() - 1]);
                let src = match src.strip_prefix("/out/") {
                    Some(bin) if words.contains(&"--from=build") => format!("bin:{bin}"),
                    _ => format!("repo:{src}"),
                };
                t.files.insert(dest.to_string(), src);
            }
            Some("ENTRYPOINT") if current.is_some() => {
                let t = targets.get_mut(current.as_ref().unwrap()).unwrap();
                let list: Vec<String> = serde_json::from_str(&l["ENTRYPOINT".len()..]).unwrap();
                assert_eq!(list.len(), 1, "{l}");
                t.entrypoint = list[0].clone();
            }
            _ => {}
        }
    }
    targets
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// One image of an archive, unpacked.
struct Unpacked {
    config: Value,
    rootfs: PathBuf,
}

/// Unpacks `archive` into `dir`: checks the layout and every blob's digest,
/// and extracts the image for `arch` layer by layer.
fn unpack(archive: &Path, dir: &Path, arch: &str) -> Unpacked {
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    assert_eq!(
        json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let path = entry.unwrap().path();
        let sum = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
        assert_eq!(
            path.file_name().unwrap().to_str().unwrap(),
            sum,
            "blob {} does not match its digest",
            path.display()
        );
    }
    let top = json(&layout.join("index.json"));
    let manifests = top["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "one image index per archive: {top}");
    assert_eq!(
        manifests[0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let index = json(&blob(&layout, manifests[0]["digest"].as_str().unwrap()));
    let mine: Vec<&Value> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["platform"]["architecture"] == arch)
        .collect();
    assert_eq!(mine.len(), 1, "{arch} in {index}");
    assert_eq!(mine[0]["platform"]["os"], "linux");
    let manifest = json(&blob(&layout, mine[0]["digest"].as_str().unwrap()));
    let config = json(&blob(
        &layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    assert_eq!(config["architecture"], arch);
    assert_eq!(config["os"], "linux");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let path = blob(&layout, layer["digest"].as_str().unwrap());
        // Numeric owners as recorded (root extracts them as they are).
        run(Command::new("tar")
            .args([
                "--numeric-owner",
                "--same-owner",
                "--same-permissions",
                "-xzf",
            ])
            .arg(&path)
            .arg("-C")
            .arg(&rootfs));
    }
    Unpacked { config, rootfs }
}

/// Runs `args` from the unpacked file system as the image's user.
fn chroot(rootfs: &Path, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(format!("--userspec={UID}:{UID}"))
        .arg(rootfs)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap()
}

fn files_named(dir: &Path, names: &[&str], found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            files_named(&path, names, found);
        } else if names.contains(&entry.file_name().to_str().unwrap_or_default()) {
            found.push(path);
        }
    }
}

#[test]
fn every_dockerfile_image_is_an_archive_that_runs_unpacked() {
    let targets = dockerfile_targets();
    let names: BTreeSet<&str> = targets.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "kkp-envoy",
            "kkp-nodeport-proxy",
            "lb-updater",
            "nodeport-proxy",
            "proxy-agent",
            "proxy-server",
            "tunnel-agent",
        ]),
        "deploy/docker/Dockerfile's images; deploy/image/build.sh must build each one"
    );
    let dir = archives();
    let bins = image_bins();
    let arch = host_arch();
    for (name, target) in &targets {
        let archive = dir.join(format!("{name}.oci.tar"));
        let tmp = tempfile::tempdir().unwrap();
        let img = unpack(&archive, tmp.path(), arch);

        // The config.
        let c = &img.config["config"];
        assert_eq!(
            c["User"],
            format!("{UID}:{UID}"),
            "{name}: numeric, not root"
        );
        assert_eq!(
            c["Entrypoint"],
            serde_json::json!([target.entrypoint]),
            "{name}"
        );
        let labels = &c["Labels"];
        assert_eq!(labels["org.opencontainers.image.title"], name.as_str());
        assert_eq!(
            labels["org.opencontainers.image.version"], VERSION,
            "{name}"
        );
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        assert!(
            labels["org.opencontainers.image.revision"]
                .as_str()
                .is_some_and(|r| r.len() == 12),
            "{name}: {labels}"
        );

        // The files the Dockerfile copies, as built.
        let fs = &img.rootfs;
        for (dest, src) in &target.files {
            let path = fs.join(dest.trim_start_matches('/'));
            let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {dest}: {e}"));
            let (want, mode) = match src.split_once(':').unwrap() {
                ("bin", b) => (std::fs::read(bins.join(b)).unwrap(), 0o755),
                (_, p) => (std::fs::read(repo().join(p)).unwrap(), 0o644),
            };
            assert!(got == want, "{name}: {dest} is not {src}");
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{name}: {dest}");
            assert_eq!((meta.uid(), meta.gid()), (0, 0), "{name}: {dest}");
        }

        // The base: no shell, the user, certificates, time zones.
        let mut shells = Vec::new();
        files_named(fs, &SHELLS, &mut shells);
        assert!(shells.is_empty(), "{name} has a shell: {shells:?}");
        let passwd = std::fs::read_to_string(fs.join("etc/passwd")).unwrap();
        assert!(
            passwd
                .lines()
                .any(|l| l.starts_with(&format!("nonroot:x:{UID}:{UID}:"))),
            "{passwd}"
        );
        let home = std::fs::metadata(fs.join("home/nonroot")).unwrap();
        assert_eq!((home.uid(), home.gid()), (UID, UID));
        assert_eq!(
            std::fs::metadata(fs.join("tmp"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o1777
        );
        let bundle = std::fs::read_to_string(fs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        assert!(
            bundle.matches("BEGIN CERTIFICATE").count() > 100,
            "{name}: CA bundle"
        );
        assert!(fs.join("usr/share/zoneinfo/Europe/Berlin").is_file());
        assert!(
            fs.join("var/lib/dpkg/status.d/libc6").is_file(),
            "SBOM scanners' list"
        );

        // Runs from the unpacked file system, with the image's C library,
        // as the image's user, and says the version the image is tagged with.
        let out = chroot(fs, &[&target.entrypoint, "--version"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {out:?}");
        let program = target.files[&target.entrypoint].trim_start_matches("bin:");
        assert!(
            text.starts_with(&format!("{program} {VERSION} (commit ")),
            "{name}: {text}"
        );
        eprintln!("{name} ({arch}): {}", text.trim());

        match name.as_str() {
            // KKP's init container: `/bin/cp /envoy.yaml /etc/envoy/envoy.yaml`.
            "kkp-nodeport-proxy" => {
                let out = chroot(fs, &["/bin/cp", "/envoy.yaml", "/tmp/envoy.yaml"]);
                assert!(out.status.success(), "{out:?}");
                assert_eq!(
                    std::fs::read(fs.join("tmp/envoy.yaml")).unwrap(),
                    std::fs::read(repo().join("deploy/docker/kkp-envoy.yaml")).unwrap()
                );
            }
            // The released binaries have no profiler, and say so.
            "proxy-agent" => {
                let out = chroot(
                    fs,
                    &[
                        "/proxy-agent",
                        "--enable-profiling",
                        "--ca-cert=/etc/ssl/certs/ca-certificates.crt",
                        "--server-count-source=bogus",
                    ],
                );
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success(), "{out:?}");
                assert!(err.contains("this build has no profiler"), "{err}");
            }
            _ => {}
        }
    }
}

/// Same binaries, a second build in another directory with other file
/// times: the same image digests, byte for byte the same archives.
#[test]
fn two_builds_give_the_same_digests() {
    let first = archives();
    let tmp = tempfile::tempdir().unwrap();
    let bins = tmp.path().join("bins");
    std::fs::create_dir_all(&bins).unwrap();
    for entry in std::fs::read_dir(image_bins()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), bins.join(entry.file_name())).unwrap();
    }
    let second = tmp.path().join("out");
    build(&second, &bins);
    let digests = |d: &Path| std::fs::read_to_string(d.join("digests.txt")).unwrap();
    assert_eq!(digests(&first), digests(&second));
    assert!(digests(&first).lines().count() >= 14, "{}", digests(&first));
    let sums = |d: &Path| std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
    for line in sums(&second).lines() {
        assert!(
            sums(&first).contains(line),
            "{line} differs between two builds"
        );
    }
}
