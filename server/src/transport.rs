//! Serving the gRPC services over any byte stream with hyper's HTTP/2 server:
//! one accept loop per listener (from `daemon`), TLS where configured, GOAWAY
//! on drain, and the stream cut when the grace period ends.

use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;

use crate::limits;

/// How long a client may take to complete a TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a refused TLS client is read from before its connection is
/// closed (see `linger_after_alert`).
const ALERT_LINGER: Duration = Duration::from_secs(1);

/// HTTP/2 settings for one listener.
#[derive(Debug, Clone)]
pub struct H2Settings {
    /// PING interval when the connection is idle (`--keepalive-time`).
    pub keepalive: Duration,
    /// How long a PING may stay unanswered.
    pub keepalive_timeout: Duration,
    /// Per-stream receive window: the most a peer's stream may have
    /// buffered in this server while it is not being read.
    pub stream_window: u32,
    /// Receive window shared by all streams of one connection.
    pub connection_window: u32,
}

impl H2Settings {
    /// kube-apiserver's side: one stream per connection, and a stream whose
    /// agent-side connection is out of credit buffers here up to its window,
    /// so the window is what one slow destination can park in this server
    /// per tunnel (4 MiB × 64 uploads measured 415 MiB peak RSS).
    pub fn frontend(keepalive: Duration) -> Self {
        H2Settings {
            keepalive,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            stream_window: 1 << 20,
            connection_window: 2 << 20,
        }
    }
}

/// The agent listener's HTTP/2 (served with `link::h2grpc`): one stream
/// carries all of an agent's connections, so the connection window is the
/// stream window; it grows from 1 MiB with the link up to
/// `--agent-http2-max-window`, reserved from the process budget. With our
/// agents each connection is bounded by its own credit too; with upstream's
/// the window is what an agent may park here while frontends do not read.
pub fn agent_h2(
    keepalive: Duration,
    keepalive_timeout: Duration,
    core: &crate::core::Core,
) -> link::h2grpc::H2Config {
    let max = core.flow.settings.http2_max_window;
    let initial = link::flow::HTTP2_INITIAL_WINDOW.min(max);
    link::h2grpc::H2Config {
        window: link::h2window::WindowSettings {
            initial,
            max,
            connection_budget: i64::from(max),
            idle: AGENT_WINDOW_IDLE,
            single_stream: true,
        },
        keepalive: Some(link::h2window::Keepalive {
            interval: keepalive,
            timeout: keepalive_timeout,
            // grpc-go's client (upstream's agent) enforces no ping policy.
            min_gap: Duration::ZERO,
        }),
        max_frame_size: limits::MAX_FRAME_SIZE,
        max_header_list_size: limits::MAX_HEADER_LIST_SIZE as u32,
        max_concurrent_streams: 1000,
        max_send_buffer: 1 << 20,
        process_budget: core.flow.budget.clone(),
        stats: core.flow.http2.clone(),
        control_frames: link::h2flood::Limits {
            burst: limits::AGENT_H2_CONTROL_BURST,
            ..link::h2flood::Limits::default()
        },
    }
}

/// How long an agent link's data may stop before its HTTP/2 window shrinks.
/// grpc-go's windows never shrink; growing again costs a round trip per
/// doubling, so only a link idle for half a minute gives its budget back.
const AGENT_WINDOW_IDLE: Duration = Duration::from_secs(30);

/// How long a PING may stay unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

impl H2Settings {
    fn builder(&self) -> hyper::server::conn::http2::Builder<TokioExecutor> {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .keep_alive_interval(Some(self.keepalive))
            .keep_alive_timeout(self.keepalive_timeout)
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(limits::MAX_FRAME_SIZE)
            .max_send_buf_size(1 << 20)
            .max_concurrent_streams(Some(1000))
            .max_header_list_size(limits::MAX_HEADER_LIST_SIZE as u32);
        b
    }
}

/// A tower service as tonic's generated servers are.
pub trait GrpcService:
    tower_service::Service<
        Request<Incoming>,
        Response = Response<tonic::body::Body>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower_service::Service<
            Request<Incoming>,
            Response = Response<tonic::body::Body>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Serves gRPC on one connection until it ends or the drain stops it. True
/// when h2 itself sent the client away for a flood (GOAWAY
/// `ENHANCE_YOUR_CALM` for rapid resets, CONTINUATION frames or an oversize
/// header list).
///
/// Not an `async fn`: hyper's connection is built, and boxed, before the
/// future, so `io` is held once, inside it; an `async fn` would also keep
/// it in a slot of its own for the connection's life (512 bytes on the
/// Unix socket, 1.5 KiB with TLS, in every idle tunnel's connection;
/// BENCHMARKS.md, P5). The future itself is small.
pub fn serve_h2<'a, IO, S>(
    io: IO,
    svc: S,
    settings: &H2Settings,
    drain: &'a Drain,
) -> impl Future<Output = bool> + Send + 'a
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: GrpcService,
{
    let mut conn = Box::pin(
        settings
            .builder()
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc)),
    );
    async move {
        tokio::select! {
            r = conn.as_mut() => {
                return r.is_err_and(|e| {
                    tracing::debug!(error = %e, "connection ended with error");
                    calmed(&e)
                });
            }
            _ = drain.draining() => conn.as_mut().graceful_shutdown(),
        }
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = drain.stopping() => {}
        }
        false
    }
}

/// Whether h2 ended the connection with its own GOAWAY `ENHANCE_YOUR_CALM`.
fn calmed(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && h2.is_library()
                && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        cause = c.source();
    }
    false
}

/// Completes a TLS handshake within [`HANDSHAKE_TIMEOUT`].
pub async fn tls_handshake<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
) -> Option<tokio_rustls::server::TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io).into_fallible()).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err((e, io))) => {
            match daemon::tls::find_rustls_error(&e) {
                Some(t) => tracing::info!(error = %daemon::tls::explain(t), "TLS handshake failed"),
                None => tracing::info!(error = %e, "TLS handshake failed"),
            }
            linger_after_alert(io).await;
            None
        }
        Err(_) => {
            tracing::info!("TLS handshake timed out");
            None
        }
    }
}

/// After a refused handshake (its alert already written): ends our side and
/// reads what the client had sent meanwhile. With TLS 1.3 a client whose
/// certificate we refuse has finished its handshake and sent its first
/// bytes (an HTTP/2 preface) before our alert arrives; closing with those
/// unread would reset the connection, and the reset can destroy the alert
/// before the client reads it, leaving it "connection closed" instead of
/// the reason. Bounded by [`ALERT_LINGER`] and [`limits::MAX_ALERT_DRAIN`].
async fn linger_after_alert<IO: AsyncRead + AsyncWrite + Unpin>(mut io: IO) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = io.shutdown().await;
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    let _ = tokio::time::timeout(ALERT_LINGER, async {
        while drained < limits::MAX_ALERT_DRAIN {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

pub fn acceptor(config: Arc<rustls::ServerConfig>) -> TlsAcceptor {
    TlsAcceptor::from(config)
}
