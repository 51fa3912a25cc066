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
    // Rebuild when HEAD moves (a branch ref changes on commit). Git names
    // the files: in a worktree `.git` is a file, and a path that does not
    // exist would make every build rerun this and rebuild every crate
    // depending on this one.
    let paths = std::process::Command::new("git")
        .args(["rev-parse", "--path-format=absolute"])
        .args(["--git-path", "HEAD", "--git-path", "refs/heads"])
        .args(["--git-path", "packed-refs"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for path in paths.lines().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    println!(
        "cargo:rustc-env=DAEMON_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
