//! Support for the end-to-end tests: throw-away PKI, loopback destinations
//! (echo, server-speaks-first, never-answering), and a runner for the built
//! binaries that waits on their readiness instead of sleeping.
//!
//! Test code may panic: a panic is how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod certs;
pub mod client;
pub mod dest;
pub mod h2raw;
pub mod k8s;
pub mod konnectivity;
pub mod netns;
pub mod nodeport;
pub mod procs;

/// Polls `probe` until it holds or `patience` passes, then panics naming
/// `what`. Only for state that gives no signal to wait on (a counter in a
/// metrics scrape, an API object, a socket that starts accepting while the
/// process's log goes elsewhere); a log line or readiness answer is waited on
/// instead (`procs::Proc::wait_line`, `k8s::wait_ready`).
pub async fn eventually<F, Fut>(what: &str, patience: std::time::Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_some(what, patience, || {
        let held = probe();
        async move { held.await.then_some(()) }
    })
    .await
}

/// [`eventually`] for a probe that yields something once it holds (a
/// connection that was finally admitted, say).
pub async fn eventually_some<T, F, Fut>(
    what: &str,
    patience: std::time::Duration,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// GETs `path` from a plain HTTP/1.1 endpoint (`Connection: close`); returns
/// the status and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let out = http_get_raw(addr, path).await;
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

/// A chunked HTTP/1.1 body's content (a streamed metrics scrape); stops at
/// the last chunk or at anything malformed.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        let (Some(chunk), Some(after)) = (rest.get(..n), rest.get(n..)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(chunk);
        body = after.strip_prefix("\r\n").unwrap_or(after);
    }
    out
}

/// The whole response to a GET, head included.
pub async fn http_get_raw(addr: std::net::SocketAddr, path: &str) -> String {
    http_get_as(addr, path, &addr.to_string()).await
}

/// The whole response to a GET sent with the given `Host` header.
pub async fn http_get_as(addr: std::net::SocketAddr, path: &str, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

/// Ends the whole test process if a test runs longer than `limit`: a hung
/// test must fail CI with a message, not stall it until its time limit.
/// Dropping the returned guard disarms it.
pub fn watchdog(limit: std::time::Duration) -> Watchdog {
    let (disarm, disarmed) = std::sync::mpsc::channel::<()>();
    let name = std::thread::current().name().unwrap_or("test").to_string();
    std::thread::spawn(move || {
        // Dropping the guard disconnects the channel and ends this thread.
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = disarmed.recv_timeout(limit) {
            eprintln!("{name}: still running after {limit:?}; aborting the test process");
            std::process::exit(101);
        }
    });
    Watchdog { _disarm: disarm }
}

/// Held for its drop: dropping the sender disarms the watchdog.
pub struct Watchdog {
    _disarm: std::sync::mpsc::Sender<()>,
}
