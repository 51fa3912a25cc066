//! What an endpoint handler sees of a request ([`Head`]) and gives back
//! ([`Reply`]): the vocabulary shared by the endpoint servers
//! ([`crate::endpoints`]) and the handlers that live elsewhere (pprof,
//! `/debug/connections`), so those need not import the servers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

/// A reply: status, content type and body; plus an optional `Location`.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Bytes,
    pub location: Option<String>,
    /// Makes the body instead, on a blocking thread, chunk by chunk as the
    /// client takes them: for bodies that take long to render and are large
    /// (metrics at scale), so no runtime worker stalls and the body is
    /// never held whole.
    pub render: Option<Render>,
}

/// Where a streamed body's chunks go, in order; `false` once the client is
/// gone (rendering should stop).
pub type Sink<'a> = &'a mut dyn FnMut(Bytes) -> bool;

/// A body rendered on a blocking thread (see [`Reply::render`]).
#[derive(Clone)]
pub struct Render(pub Arc<dyn Fn(Sink<'_>) + Send + Sync>);

/// Size a [`ChunkWriter`] gathers before handing a chunk on.
pub const CHUNK: usize = 64 * 1024;

/// Text written in pieces, handed to a [`Sink`] in chunks of about
/// [`CHUNK`] bytes. A write after the client left fails, so a renderer
/// using `?` stops early.
pub struct ChunkWriter<'a> {
    buf: String,
    sink: Sink<'a>,
    gone: bool,
}

impl<'a> ChunkWriter<'a> {
    pub fn new(sink: Sink<'a>) -> Self {
        ChunkWriter {
            buf: String::with_capacity(CHUNK + CHUNK / 4),
            sink,
            gone: false,
        }
    }

    fn send(&mut self) -> std::fmt::Result {
        let chunk = std::mem::replace(&mut self.buf, String::with_capacity(CHUNK + CHUNK / 4));
        if self.gone || !(self.sink)(Bytes::from(chunk)) {
            self.gone = true;
            return Err(std::fmt::Error);
        }
        Ok(())
    }

    /// Hands on what is left.
    pub fn finish(mut self) -> std::fmt::Result {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

impl std::fmt::Write for ChunkWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.gone {
            return Err(std::fmt::Error);
        }
        self.buf.push_str(s);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(())
    }
}

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

    /// Metrics whose text `render` writes, chunk by chunk, on a blocking
    /// thread (see [`ChunkWriter`]).
    pub fn metrics_streamed(render: impl Fn(Sink<'_>) + Send + Sync + 'static) -> Self {
        Reply {
            render: Some(Render(Arc::new(render))),
            ..Self::metrics(String::new())
        }
    }

    /// The answer to a client that is not on loopback asking for `path`,
    /// which is served only to such clients (see [`Head::from_loopback`]).
    pub fn loopback_only(path: &str) -> Self {
        Reply::text(
            StatusCode::FORBIDDEN,
            format!(
                "{path} is served on loopback addresses only (curl it from inside the pod, or through kubectl port-forward)\n"
            ),
        )
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
    /// The client's address.
    pub peer: Option<SocketAddr>,
}

impl Head<'_> {
    /// Whether the client is on this host, in this network namespace: its
    /// address is a loopback one (`::ffff:127.0.0.1`, as an IPv4 client of
    /// a listener on `::` appears, included). Only such a client can have
    /// sent from a loopback address (a reply to it goes nowhere else), so
    /// this holds whatever the listener is bound to; `kubectl port-forward`
    /// and `kubectl exec … curl localhost` qualify.
    pub fn from_loopback(&self) -> bool {
        self.peer.is_some_and(|a| is_loopback(a.ip()))
    }
}

/// A loopback address, IPv4-mapped IPv6 ones included.
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}
