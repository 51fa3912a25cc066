//! The small HTTP/1.1 servers every binary runs for health, readiness and
//! metrics. Handlers are plain functions from the request head to a reply.

#[cfg(feature = "pprof")]
pub mod pprof;
pub mod reply;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::drain::Drain;
use crate::limits::{ENDPOINT_HEAD_TIMEOUT, ENDPOINT_MAX_BUF, ENDPOINT_MAX_CONNECTIONS};
use crate::listen::{AcceptOptions, Slots, accept_loop};

pub use crate::endpoints::reply::{CHUNK, ChunkWriter, Head, Render, Reply, Sink, is_loopback};

/// Chunks of a streamed body held at once between the rendering thread and
/// the connection: with [`CHUNK`], what a large body costs in memory.
const CHUNKS_AHEAD: usize = 2;

/// A body whose chunks a blocking thread renders (see [`Render`]).
struct Streamed(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

type Body = Either<Full<Bytes>, Streamed>;

pub type Handler = Arc<dyn Fn(&Head<'_>) -> Reply + Send + Sync>;

/// Serves `handler` on `listener` until the drain starts. At most
/// [`ENDPOINT_MAX_CONNECTIONS`] at once, the oldest closed for a newcomer.
pub async fn serve(listener: TcpListener, name: &'static str, handler: Handler, drain: Drain) {
    serve_with(listener, name, handler, false, drain).await
}

/// Whether this build serves `/debug/pprof/` (the `pprof` feature, which
/// the release binaries leave out): `--enable-profiling` warns without it.
pub const PROFILER_BUILT_IN: bool = cfg!(feature = "pprof");

/// The warning `--enable-profiling` gives in a build without the profiler.
pub const NO_PROFILER: &str = "--enable-profiling has no effect: this build has no profiler (cargo feature `profiling`, which the released binaries and images leave out; docs/konnectivity.md)";

/// [`serve`], plus `/debug/pprof/` when `profiling` is set (upstream's
/// `--enable-profiling`; needs the `pprof` feature, else it is ignored and
/// the binaries warn at start, [`NO_PROFILER`]).
pub async fn serve_with(
    listener: TcpListener,
    name: &'static str,
    handler: Handler,
    profiling: bool,
    drain: Drain,
) {
    tracing::info!(listener = name, addr = %crate::listen::Listener::local(&listener), "serving");
    let stop = drain.clone();
    let options = AcceptOptions {
        shed_oldest: Some(Slots::new(ENDPOINT_MAX_CONNECTIONS)),
        ..AcceptOptions::default()
    };
    accept_loop(listener, name, drain, options, move |io, _, _| {
        let handler = handler.clone();
        let stop = stop.clone();
        async move {
            let local = io.local_addr().ok();
            let peer = io.peer_addr().ok();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    #[cfg(feature = "pprof")]
                    if profiling && req.uri().path().starts_with("/debug/pprof") {
                        // A profile shows what the process does: for the
                        // host's eyes only, as /debug/connections.
                        let reply = if peer.is_some_and(|a| is_loopback(a.ip())) {
                            crate::endpoints::pprof::handle(req.uri().path(), req.uri().query()).await
                        } else {
                            Reply::loopback_only("/debug/pprof")
                        };
                        return Ok::<_, Infallible>(into_response(reply).0.map(Either::Left));
                    }
                    let _ = profiling;
                    let (resp, render) = respond(&handler, &req, local, peer);
                    let Some(Render(make)) = render else {
                        return Ok::<_, Infallible>(resp.map(Either::Left));
                    };
                    // Rendered as the client reads: a few chunks ahead at
                    // most; a client that leaves stops the rendering.
                    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
                    tokio::task::spawn_blocking(move || {
                        make(&mut |chunk| tx.blocking_send(chunk).is_ok())
                    });
                    Ok::<_, Infallible>(resp.map(|_| -> Body { Either::Right(Streamed(rx)) }))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ENDPOINT_HEAD_TIMEOUT)
                .max_buf_size(ENDPOINT_MAX_BUF)
                .serve_connection(TokioIo::new(io), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => { if let Err(e) = r { tracing::debug!(error = %e, "endpoint connection"); } }
                _ = stop.draining() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                }
            }
        }
    })
    .await
}

/// The response, and what renders its body if that is left to do.
fn respond(
    handler: &Handler,
    req: &Request<Incoming>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
) -> (Response<Full<Bytes>>, Option<Render>) {
    let head = Head {
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        local,
        peer,
    };
    into_response(handler(&head))
}

fn into_response(reply: Reply) -> (Response<Full<Bytes>>, Option<Render>) {
    let render = reply.render;
    let mut resp = Response::new(Full::new(reply.body));
    *resp.status_mut() = reply.status;
    if let Ok(v) = http::HeaderValue::from_str(reply.content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    if let Some(loc) = reply
        .location
        .and_then(|l| http::HeaderValue::from_str(&l).ok())
    {
        resp.headers_mut().insert(http::header::LOCATION, loc);
    }
    (resp, render)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn routes_and_stops() {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let drain = Drain::new();
        let handler: Handler = Arc::new(|h| match h.path {
            "/healthz" => Reply::ok(),
            _ => Reply::not_found(),
        });
        let server = tokio::spawn(serve(l, "health", handler, drain.clone()));
        for (path, want) in [("/healthz", "200 OK"), ("/nope", "404 Not Found")] {
            let mut c = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            c.write_all(req.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut out = String::new();
            let _ = c.read_to_string(&mut out).await;
            assert!(
                out.starts_with(&format!("HTTP/1.1 {want}")),
                "{path}: {out}"
            );
        }
        drain.start();
        assert!(server.await.is_ok());
    }

    /// A streamed body arrives whole and in order, while the renderer is
    /// never more than a few chunks ahead of the client; a client that
    /// leaves stops the rendering.
    #[tokio::test]
    async fn streamed_bodies_follow_the_client() {
        const LINES: usize = 1_000_000;
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let drain = Drain::new();
        let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let handler: Handler = Arc::new(move |_| {
            let done_tx = done_tx.clone();
            Reply::metrics_streamed(move |sink| {
                use std::fmt::Write as _;
                let mut out = ChunkWriter::new(sink);
                let mut lines = 0;
                for i in 0..LINES {
                    if writeln!(out, "line {i:>14}").is_err() {
                        break;
                    }
                    lines += 1;
                }
                let _ = out.finish();
                let _ = done_tx.send(lines);
            })
        });
        let server = tokio::spawn(serve(l, "stats", handler, drain.clone()));
        // Read whole: every line, in order.
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        c.write_all(b"GET /m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw).await;
        assert_eq!(done.recv().await, Some(LINES));
        let raw = String::from_utf8(raw).unwrap_or_else(|e| panic!("{e}"));
        let (head, mut body) = raw
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{raw}"));
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        let mut text = String::new();
        while let Some((size, rest)) = body.split_once("\r\n") {
            let n = usize::from_str_radix(size, 16).unwrap_or_else(|e| panic!("{size}: {e}"));
            text.push_str(&rest[..n]);
            body = &rest[n..];
            body = body.strip_prefix("\r\n").unwrap_or(body);
            if n == 0 {
                break;
            }
        }
        let want: String = (0..LINES).map(|i| format!("line {i:>14}\n")).collect();
        assert!(text == want, "the body differs from what was rendered");
        // A client that reads the head and leaves: the renderer, a few
        // chunks ahead at most (never the whole body), stops.
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        c.write_all(b"GET /m HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut first = [0u8; 64];
        let _ = c.read(&mut first).await;
        drop(c);
        let lines = tokio::time::timeout(Duration::from_secs(10), done.recv())
            .await
            .unwrap_or_else(|_| panic!("the renderer went on after its client left"));
        assert!(lines.is_some_and(|n| n < LINES), "{lines:?}");
        drain.start();
        assert!(server.await.is_ok());
    }
}
