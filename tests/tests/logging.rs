//! Log lines and logging flags of the real binaries (issue 13.2, 15.7):
//! proxy-server and proxy-agent write klog's text lines and apply klog's
//! flags with klog's meaning (upstream's `-v` default 4, `--vmodule`,
//! `--logtostderr`, `--alsologtostderr`, `--log-file`, `--log-dir`) or
//! component-base's JSON; nodeport-proxy, lb-updater and tunnel-agent
//! write KKP's zap JSON or console lines and honour `-log-debug`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::procs::{Proc, loopback};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `I1124 12:00:00.000000    1234 file.rs:12] "message" key="value"`:
/// severity, month and day, time with microseconds, the pid right-aligned
/// in seven columns, file:line, then the quoted message.
fn assert_klog_line(line: &str, pid: u32) {
    let b = line.as_bytes();
    let ok = b.len() > 32
        && b"IWEF".contains(&b[0])
        && b[1..5].iter().all(u8::is_ascii_digit)
        && b[5] == b' '
        && b[6..8].iter().all(u8::is_ascii_digit)
        && b[8] == b':'
        && b[11] == b':'
        && b[14] == b'.'
        && b[15..21].iter().all(u8::is_ascii_digit)
        && line[21..30] == format!(" {pid:>7} ")
        && line[30..].contains(".rs:")
        && line[30..].contains("] \"");
    assert!(ok, "not a klog line of pid {pid}: {line:?}");
}

fn server_args(pki: &Pki, dir: &Path, mode: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![format!("--mode={mode}")];
    args.extend(pki.local_server_args(&dir.join("s.sock"), extra));
    args
}

/// Sends a GET to the HTTP-CONNECT frontend: the server refuses it (405)
/// and logs that at debug level, klog's V(3).
async fn provoke_debug_line(sock: &Path) {
    let mut c = tokio::net::UnixStream::connect(sock).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let _ = c.read(&mut buf).await;
}

/// Starts an HTTP-CONNECT server with `extra` flags, provokes one debug
/// event, stops it (SIGTERM) and returns its pid and everything it wrote to
/// standard error. Readiness is the frontend socket accepting, which works
/// whether the lines go to stderr or to a file.
async fn server_lines(extra: &[&str]) -> (u32, Vec<String>) {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Proc::spawn(
        "proxy-server",
        &server_args(&pki, dir.path(), "http-connect", extra),
    );
    let sock = dir.path().join("s.sock");
    // Some of these flags send the log elsewhere: the socket accepting is
    // the one readiness signal every variant gives.
    integration_tests::eventually(
        &format!("proxy-server {extra:?} serving {}", sock.display()),
        Duration::from_secs(30),
        || async { tokio::net::UnixStream::connect(&sock).await.is_ok() },
    )
    .await;
    provoke_debug_line(&sock).await;
    let pid = srv.child.id().unwrap();
    srv.signal(15);
    assert_eq!(srv.wait_exit().await, Some(0), "{:#?}", srv.log);
    while let Some(l) = srv.next_line().await {
        srv.log.push(l);
    }
    (pid, srv.log.clone())
}

#[tokio::test]
async fn proxy_server_writes_klog_lines_at_upstreams_default_verbosity() {
    let (pid, lines) = server_lines(&[]).await;
    for l in &lines {
        assert_klog_line(l, pid);
    }
    let listening = lines.iter().find(|l| l.contains("\"listening\"")).unwrap();
    assert!(
        listening.contains("] \"listening\" listener=\"agent\" addr=\"127.0.0.1:"),
        "{listening}"
    );
    // -v defaults to 4 (upstream's mains set it), so per-connection debug
    // lines (klog V(3)) are written.
    assert!(
        lines.iter().any(|l| l.contains("\"non-CONNECT request\"")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn v_and_vmodule_pick_what_is_written() {
    let (_, quiet) = server_lines(&["-v=2"]).await;
    assert!(
        !quiet.iter().any(|l| l.contains("non-CONNECT request")),
        "-v=2 must hide V(3) lines: {quiet:#?}"
    );
    assert!(quiet.iter().any(|l| l.contains("\"listening\"")));
    let (_, module) = server_lines(&["-v=0", "--vmodule=http_conn*=3"]).await;
    assert!(
        module.iter().any(|l| l.contains("non-CONNECT request")),
        "--vmodule=http_conn*=3 must show http_connect.rs's V(3) lines: {module:#?}"
    );
    let (_, other) = server_lines(&["-v=0", "--vmodule=core=9"]).await;
    assert!(!other.iter().any(|l| l.contains("non-CONNECT request")));
}

#[tokio::test]
async fn log_file_and_stderr_as_klog_routes_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.log");
    let log_file = format!("--log-file={}", file.display());
    // --logtostderr (the default) wins over --log-file: the file is untouched.
    let (_, lines) = server_lines(&[&log_file]).await;
    assert!(lines.iter().any(|l| l.contains("\"listening\"")));
    assert!(!file.exists(), "--logtostderr=true must ignore --log-file");

    // Files only: stderr gets ERROR and above (none here), the file all.
    let (pid, lines) = server_lines(&[&log_file, "--logtostderr=false"]).await;
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("Log file created at: "),
        "klog's file header: {text}"
    );
    let logged: Vec<&str> = text.lines().filter(|l| l.contains("] \"")).collect();
    assert!(logged.iter().any(|l| l.contains("\"listening\"")), "{text}");
    logged.iter().for_each(|l| assert_klog_line(l, pid));
    assert!(
        !lines.iter().any(|l| l.contains("\"listening\"")),
        "only ERROR and above go to stderr: {lines:#?}"
    );
}

#[tokio::test]
async fn alsologtostderr_writes_both() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("both.log");
    let (_, lines) = server_lines(&[
        &format!("--log-file={}", file.display()),
        "--logtostderr=false",
        "--alsologtostderr",
        "--skip-log-headers",
    ])
    .await;
    assert!(lines.iter().any(|l| l.contains("\"listening\"")));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with('I'), "--skip-log-headers: {text}");
    assert!(text.contains("\"listening\""), "{text}");
}

#[tokio::test]
async fn log_dir_gets_klogs_per_severity_files() {
    let dir = tempfile::tempdir().unwrap();
    let _ = server_lines(&[
        &format!("--log-dir={}", dir.path().display()),
        "--logtostderr=false",
        "--alsologtostderr",
    ])
    .await;
    let info = dir.path().join("proxy-server.INFO");
    let target = std::fs::read_link(&info).unwrap();
    let name = target.to_string_lossy().to_string();
    assert!(
        name.starts_with("proxy-server.") && name.contains(".log.INFO."),
        "{name}"
    );
    let text = std::fs::read_to_string(&info).unwrap();
    assert!(text.contains("\"listening\""), "{text}");
}

#[tokio::test]
async fn logging_format_json_is_component_base_json() {
    let (_, lines) = server_lines(&["--logging-format=json"]).await;
    let mut saw_listening = false;
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        assert!(v["ts"].as_f64().is_some_and(|t| t > 1.6e12), "{l}");
        assert!(
            v["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{l}"
        );
        assert!(v["msg"].is_string(), "{l}");
        if v["msg"] == "listening" && v["listener"] == "agent" {
            saw_listening = true;
            assert_eq!(v["v"], 0, "{l}");
            assert!(v["addr"].as_str().unwrap().starts_with("127.0.0.1:"));
        }
        if v["msg"] == "non-CONNECT request" {
            assert_eq!(v["v"], 3, "{l}");
        }
    }
    assert!(saw_listening, "{lines:#?}");
}

#[tokio::test]
async fn proxy_agent_writes_klog_lines() {
    let pki = Pki::new();
    let mut a = Proc::spawn(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            "--proxy-server-port=1".into(),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
        ],
    );
    let addrs = a.listening(2).await;
    assert!(addrs.contains_key("health"), "{addrs:?}");
    let warn = a.wait_line("cannot connect to proxy server").await;
    let pid = a.child.id().unwrap();
    assert_klog_line(&warn, pid);
    assert!(warn.starts_with('W'), "{warn}");
}

/// A free loopback port: bound, released, then given to the binary.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn nodeport_lines(extra: &[&str]) -> Vec<String> {
    let tunnel = free_port();
    let mut args = vec![
        "-source=demo".to_string(),
        "-bind-address=127.0.0.1".into(),
        "-envoy-stats-port=0".into(),
        format!("-envoy-tunneling-port={tunnel}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut np = Proc::spawn("nodeport-proxy", &args);
    np.wait_line("tunneling listener").await;
    // A CONNECT to a host no route knows: refused, logged at debug level.
    let mut c = tokio::net::TcpStream::connect(loopback(&format!("127.0.0.1:{tunnel}")))
        .await
        .unwrap();
    c.write_all(b"CONNECT nowhere.invalid:443 HTTP/1.1\r\nHost: nowhere.invalid:443\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 ") && !buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    np.signal(15);
    let _ = np.wait_exit().await;
    while let Some(l) = np.next_line().await {
        np.log.push(l);
    }
    np.log.clone()
}

#[tokio::test]
async fn kkp_binaries_write_zap_json_by_default_and_honour_log_debug() {
    let lines = nodeport_lines(&[]).await;
    for l in &lines {
        assert!(
            l.starts_with("{\"level\":\""),
            "zap JSON starts with the level: {l}"
        );
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        let time = v["time"].as_str().unwrap();
        assert!(
            time.len() >= 24 && &time[10..11] == "T" && &time[19..20] == ".",
            "{l}"
        );
        assert!(
            v["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{l}"
        );
        assert!(v["msg"].is_string(), "{l}");
        assert_ne!(v["level"], "debug", "debug lines need -log-debug: {l}");
    }
    let debug = nodeport_lines(&["-log-debug"]).await;
    assert!(
        debug
            .iter()
            .any(|l| l.contains("\"level\":\"debug\"") && l.contains("CONNECT refused")),
        "{debug:#?}"
    );
    let console = nodeport_lines(&["-log-format=Console"]).await;
    let listening = console
        .iter()
        .find(|l| l.contains("tunneling listener"))
        .unwrap();
    let cols: Vec<&str> = listening.split('\t').collect();
    assert_eq!(cols.len(), 5, "{listening:?}");
    assert_eq!(cols[1], "info");
    assert!(
        cols[4].starts_with('{') && cols[4].contains("\": "),
        "{listening}"
    );
    let (code, out) =
        integration_tests::procs::run("nodeport-proxy", &["-source=demo", "-log-format=xml"]).await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("log-format"), "{out}");
}
