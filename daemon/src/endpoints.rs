//! The small HTTP/1.1 servers every binary runs for health, readiness and
//! metrics. Handlers are plain functions from the request head to a reply.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::drain::Drain;
use crate::limits::{ENDPOINT_HEAD_TIMEOUT, ENDPOINT_MAX_BUF, ENDPOINT_MAX_CONNECTIONS};
use crate::listen::{AcceptOptions, Slots, accept_loop};

/// A reply: status, content type and body; plus an optional `Location`.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Bytes,
    pub location: Option<String>,
    /// Makes the body instead, on a blocking thread: for bodies that take
    /// long to render (metrics at scale), so no runtime worker stalls.
    pub render: Option<Render>,
}

/// A body rendered on a blocking thread (see [`Reply::render`]).
#[derive(Clone)]
pub struct Render(pub Arc<dyn Fn() -> Bytes + Send + Sync>);

impl std::fmt::Debug for Render {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Render")
    }
}

impl Reply {
    pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Self {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            location: None,
            render: None,
        }
    }

    pub fn ok() -> Self {
        Self::text(StatusCode::OK, "ok")
    }

    pub fn not_found() -> Self {
        Self::text(StatusCode::NOT_FOUND, "404 page not found\n")
    }

    pub fn metrics(body: String) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: body.into(),
            location: None,
            render: None,
        }
    }

    /// Metrics as client_golang's promhttp serves them (its content type
    /// names the escaping of names it applied).
    pub fn go_metrics(body: String) -> Self {
        Reply {
            content_type: "text/plain; version=0.0.4; charset=utf-8; escaping=underscores",
            ..Self::metrics(body)
        }
    }

    /// Metrics whose text `render` makes on a blocking thread.
    pub fn metrics_rendered(render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Reply {
            render: Some(Render(Arc::new(move || Bytes::from(render())))),
            ..Self::metrics(String::new())
        }
    }

    pub fn redirect(location: String) -> Self {
        Reply {
            status: StatusCode::MOVED_PERMANENTLY,
            content_type: "text/html; charset=utf-8",
            body: Bytes::new(),
            location: Some(location),
            render: None,
        }
    }
}

/// What a handler sees of a request.
pub struct Head<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The address the client connected to.
    pub local: Option<SocketAddr>,
}

pub type Handler = Arc<dyn Fn(&Head<'_>) -> Reply + Send + Sync>;

/// Serves `handler` on `listener` until the drain starts. At most
/// [`ENDPOINT_MAX_CONNECTIONS`] at once, the oldest closed for a newcomer.
pub async fn serve(listener: TcpListener, name: &'static str, handler: Handler, drain: Drain) {
    serve_with(listener, name, handler, false, drain).await
}

/// [`serve`], plus `/debug/pprof/` when `profiling` is set (upstream's
/// `--enable-profiling`; needs the `pprof` feature, else it is ignored).
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
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    #[cfg(feature = "pprof")]
                    if profiling && req.uri().path().starts_with("/debug/pprof") {
                        let reply = crate::pprof::handle(req.uri().path(), req.uri().query()).await;
                        return Ok::<_, Infallible>(into_response(reply).0);
                    }
                    let _ = profiling;
                    let mut resp = respond(&handler, &req, local);
                    if let Some(Render(make)) = resp.1.take() {
                        let body = tokio::task::spawn_blocking(move || make())
                            .await
                            .unwrap_or_default();
                        *resp.0.body_mut() = Full::new(body);
                    }
                    Ok::<_, Infallible>(resp.0)
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
) -> (Response<Full<Bytes>>, Option<Render>) {
    let head = Head {
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        local,
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
}
