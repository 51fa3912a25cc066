//! Runs the built binaries as child processes. Readiness is a log line (each
//! binary logs `listening listener=… addr=…` for every bound socket), never a
//! sleep; children are killed when the handle drops.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Every line the child writes to stdout or stderr, in arrival order per
/// stream; `seen` also gets each line (e.g. to keep a log).
pub fn output_lines(
    child: &mut Child,
    seen: impl Fn(&str) + Clone + Send + 'static,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, lines) = mpsc::unbounded_channel();
    let outputs = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child.stderr.take().map(|e| Box::new(e) as _),
    ];
    for out in outputs.into_iter().flatten() {
        let (tx, seen) = (tx.clone(), seen.clone());
        tokio::spawn(async move {
            let mut r = BufReader::new(out).lines();
            while let Ok(Some(l)) = r.next_line().await {
                seen(&l);
                // Keep draining after the reader is gone so the child never
                // blocks on a full pipe.
                let _ = tx.send(l);
            }
        });
    }
    lines
}

/// `target/<profile>/<name>`, next to the test executable's directory, or
/// in `$BIN_DIR` when that is set (the soak compares builds that way).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test> -> target/debug/<name>
    let dir = match std::env::var_os("BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf(),
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not built: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

pub struct Proc {
    pub child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line seen so far, for failure messages.
    pub log: Vec<String>,
}

/// Longest a test waits for an expected log line before failing.
const PATIENCE: Duration = Duration::from_secs(30);

impl Proc {
    pub fn spawn(name: &str, args: &[String]) -> Proc {
        Self::spawn_path(&binary(name), args)
    }

    /// Like [`Proc::spawn`] for a binary at `path`.
    pub fn spawn_path(path: &std::path::Path, args: &[String]) -> Proc {
        Self::spawn_env(path, args, &[])
    }

    /// Like [`Proc::spawn_path`] with extra environment variables.
    pub fn spawn_env(path: &std::path::Path, args: &[String], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(path)
            .args(args)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = output_lines(&mut child, |_| {});
        Proc {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; panics with the log if the
    /// process exits or says nothing of the sort in time.
    pub async fn wait_line(&mut self, needle: &str) -> String {
        self.wait_line_within(needle, PATIENCE).await
    }

    /// [`Proc::wait_line`] with another patience.
    pub async fn wait_line_within(&mut self, needle: &str, patience: Duration) -> String {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(l)) => {
                    self.log.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Ok(None) => panic!(
                    "process ended before logging {needle:?}:\n{}",
                    self.log.join("\n")
                ),
                Err(_) => panic!(
                    "no {needle:?} within {patience:?}:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// The lines logged since the last look, without waiting (they are kept
    /// in `log` too).
    pub fn lines_so_far(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(l) = self.lines.try_recv() {
            self.log.push(l.clone());
            out.push(l);
        }
        out
    }

    /// The next line the process writes; `None` once its output is closed.
    pub async fn next_line(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    /// Waits until `n` `listening` lines were logged; returns listener → address.
    pub async fn listening(&mut self, n: usize) -> HashMap<String, String> {
        let mut out = HashMap::new();
        while out.len() < n {
            let l = self.wait_line("listening").await;
            if let (Some(name), Some(addr)) = (log_field(&l, "listener"), log_field(&l, "addr")) {
                out.insert(name, addr);
            }
        }
        out
    }

    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .status();
        }
    }

    /// Waits for exit (bounded) and returns the exit code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .ok()?
            .ok()?;
        status.code()
    }
}

/// The `proxy-server` binary with its frontend on a Unix socket in `dir` and
/// every TCP port picked on 127.0.0.1, plus `extra` flags; returns it once
/// its four listeners are bound, with the socket path and the bound
/// addresses by listener name.
pub async fn server_on_socket(
    pki: &crate::certs::Pki,
    dir: &std::path::Path,
    extra: &[String],
) -> (Proc, PathBuf, HashMap<String, String>) {
    let cert = pki.server("server", &[]);
    let sock = dir.join("konnectivity-server.socket");
    let mut args = vec![
        format!("--uds-name={}", sock.display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", cert.cert.display()),
        format!("--cluster-key={}", cert.key.display()),
        "--agent-port=0".into(),
        "--agent-bind-address=127.0.0.1".into(),
        "--health-port=0".into(),
        "--health-bind-address=127.0.0.1".into(),
        "--admin-port=0".into(),
    ];
    args.extend_from_slice(extra);
    let mut server = Proc::spawn("proxy-server", &args);
    let addrs = server.listening(4).await;
    (server, sock, addrs)
}

/// The value of `key` in one of our log lines, whatever its format: klog
/// text (`key="value"` or `key=5`), or JSON (component-base's or KKP's zap,
/// possibly after zap console's tab-separated columns).
pub fn log_field(line: &str, key: &str) -> Option<String> {
    if let Some(i) = line.find('{')
        && let Ok(serde_json::Value::Object(map)) =
            serde_json::from_str::<serde_json::Value>(line[i..].trim_end())
    {
        return map.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim_matches('"').to_string())
}

/// A `host:port` a test can connect to, from a logged bind address such as
/// `[::]:1234` or `0.0.0.0:1234`.
pub fn loopback(addr: &str) -> SocketAddr {
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Runs a binary to completion with `args`; returns exit code and output.
pub async fn run(name: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(binary(name))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS`, `VmHWM`, …).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}
