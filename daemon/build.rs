//! Records the git commit the binaries are built from, for `--version`.
//! `SOURCE_COMMIT` overrides it (image builds without a .git directory).

fn main() {
    println!("cargo:rerun-if-env-changed=SOURCE_COMMIT");
    let commit = std::env::var("SOURCE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        });
    // Rebuild when HEAD moves (a branch ref changes on commit).
    for f in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!(
        "cargo:rustc-env=DAEMON_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
