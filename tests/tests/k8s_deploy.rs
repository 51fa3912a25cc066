//! deploy/: renders the kustomize tree with kubectl, checks that every flag
//! a manifest passes to one of our binaries is accepted by that binary's
//! flag set (names and Go value syntax), that every binary is deployed, and
//! that a real apiserver accepts the objects (server-side dry run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use daemon::flags::FlagSet;
use integration_tests::k8s::{Cluster, ClusterOpts, bins};
use integration_tests::watchdog;

fn flag_set(binary: &str) -> Option<FlagSet> {
    Some(match binary {
        "proxy-server" => proxy_server::options::flags(),
        "proxy-agent" => proxy_agent::options::flags(),
        "nodeport-proxy" => nodeport_proxy::cli::flag_set(),
        "tunnel-agent" => tunnel_agent::cli::flag_set(),
        "lb-updater" => lb_updater::flags(),
        _ => return None,
    })
}

async fn render() -> String {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let out = tokio::process::Command::new(&bins().kubectl)
        .arg("kustomize")
        .arg(&deploy)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_render_and_every_flag_is_accepted() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(300));
    let text = render().await;
    let mut deployed = BTreeSet::new();
    let mut checked = 0;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        let kind = v["kind"].as_str().unwrap_or_default();
        let spec = match kind {
            "Deployment" | "DaemonSet" | "StatefulSet" => &v["spec"]["template"]["spec"],
            "Pod" => &v["spec"],
            _ => continue,
        };
        let containers = spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten();
        for c in containers {
            let mut argv: Vec<String> = c["command"]
                .as_array()
                .into_iter()
                .chain(c["args"].as_array())
                .flatten()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            if argv.is_empty() {
                continue;
            }
            let program = argv.remove(0);
            let name = program.rsplit('/').next().unwrap().to_string();
            let Some(flags) = flag_set(&name) else {
                continue;
            };
            let image = c["image"].as_str().unwrap_or_default();
            assert!(image.starts_with(&name), "{name} runs from image {image}");
            if let Err(e) = flags.parse(argv.iter().map(String::as_str)) {
                panic!(
                    "{kind} {}: {name} rejects its flags: {e}\n{argv:?}",
                    v["metadata"]["name"]
                );
            }
            deployed.insert(name);
            checked += argv.len();
        }
    }
    assert_eq!(
        deployed.into_iter().collect::<Vec<_>>(),
        [
            "lb-updater",
            "nodeport-proxy",
            "proxy-agent",
            "proxy-server",
            "tunnel-agent"
        ]
    );
    assert!(checked > 50, "only {checked} flags checked");

    // The objects are valid for a real apiserver (server-side dry run).
    let cluster = Cluster::start(ClusterOpts::default()).await;
    cluster
        .kubectl_ok(&["create", "namespace", "nodeport-proxy"])
        .await;
    let (code, out, err) = cluster
        .kubectl_stdin(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(text.as_bytes()),
        )
        .await;
    assert_eq!(code, Some(0), "dry run failed:\n{err}\n{out}");
    cluster.stop().await;
}

#[test]
fn dockerfiles_build_every_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/docker");
    for name in [
        "proxy-server",
        "proxy-agent",
        "nodeport-proxy",
        "tunnel-agent",
        "lb-updater",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.Dockerfile"))).unwrap();
        assert!(text.contains(&format!("--bin {name}")), "{name}");
        assert!(
            text.contains(&format!("ENTRYPOINT [\"/{name}\"]")),
            "{name}"
        );
    }
}
