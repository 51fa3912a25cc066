//! Request/response services (tonic's gRPC) over the `h2` crate directly,
//! for the Konnectivity agent link on both ends.
//!
//! Why not hyper's HTTP/2, as the other listeners use: hyper owns the h2
//! connection and offers only a fixed window or its own BDP estimator, whose
//! 16 MiB ceiling cannot be configured, which no budget can bound and whose
//! window cannot be read for metrics. Here the task that drives the
//! connection also drives a [`Controller`] and applies its window sizes;
//! the rest is what hyper does for gRPC: bodies in both directions with
//! flow control, trailers, GOAWAY on drain, keepalive PINGs.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::{Request, Response};
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::budget::Budget;
use crate::h2window::{Action, Controller, Keepalive, Meter, Start, WindowSettings, WindowStats};
use daemon::drain::Drain;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long the HTTP/2 preface and first SETTINGS may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One end's HTTP/2 settings.
#[derive(Debug, Clone)]
pub struct H2Config {
    pub window: WindowSettings,
    pub keepalive: Option<Keepalive>,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
    /// Server only: streams a client may open at once.
    pub max_concurrent_streams: u32,
    /// Bytes queued per stream for sending before a writer waits.
    pub max_send_buffer: usize,
    pub process_budget: Arc<Budget>,
    pub stats: Arc<WindowStats>,
    /// Server only: the control-frame budget of each client connection
    /// ([`crate::h2flood`]).
    pub control_frames: crate::h2flood::Limits,
}

/// A received HTTP/2 body: DATA frames (their window released as they are
/// taken, and counted for the window controller), then trailers.
pub struct RecvBody {
    recv: RecvStream,
    meter: Arc<Meter>,
    data_done: bool,
}

impl RecvBody {
    pub fn new(recv: RecvStream, meter: Arc<Meter>) -> Self {
        RecvBody {
            recv,
            meter,
            data_done: false,
        }
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match self.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.meter.record(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => self.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// Sends `body` on `send`: DATA within the peer's window, then trailers or
/// END_STREAM. Resets the stream if the body fails; returns when done or
/// when the peer reset the stream.
pub async fn send_body<B>(body: B, mut send: SendStream<Bytes>)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError> + Send,
{
    let mut body = std::pin::pin!(body);
    loop {
        let frame = std::future::poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            body.as_mut().poll_frame(cx).map(Some)
        })
        .await;
        let frame = match frame {
            // The peer reset the stream: nothing more to send.
            None => return,
            Some(None) => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Some(Some(Err(e))) => {
                tracing::debug!(error = %e.into(), "HTTP/2 body failed; resetting the stream");
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
            Some(Some(Ok(f))) => f,
        };
        match frame.into_data() {
            Ok(data) => {
                if send_data(&mut send, data).await.is_err() {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = send.send_trailers(trailers);
                    return;
                }
            }
        }
    }
}

/// Sends `data` as the peer's window allows.
async fn send_data(send: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let n = std::future::poll_fn(|cx| send.poll_capacity(cx)).await;
        let n = match n {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
        };
        if n == 0 {
            continue;
        }
        let chunk = data.split_to(n.min(data.len()));
        send.send_data(chunk, false)?;
    }
    Ok(())
}

fn apply_server<IO>(conn: &mut h2::server::Connection<IO, Bytes>, ctl: &mut Controller, a: Action)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    if let Action::Resize { stream, connection } = a {
        conn.set_target_window_size(connection);
        if stream.is_some_and(|s| conn.set_initial_window_size(s).is_err()) {
            ctl.retry(a);
        }
    }
}

/// Serves `svc` on one connection until it ends, the drain stops it (GOAWAY
/// first), or a keepalive PING goes unanswered.
pub async fn serve<IO, S, B>(io: IO, svc: S, cfg: &H2Config, drain: &Drain)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower_service::Service<Request<RecvBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let start = Start::new(cfg.window, &cfg.process_budget, cfg.stats.clone());
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(start.stream())
        .initial_connection_window_size(start.connection())
        .max_frame_size(cfg.max_frame_size)
        .max_header_list_size(cfg.max_header_list_size)
        .max_concurrent_streams(cfg.max_concurrent_streams)
        .max_send_buffer_size(cfg.max_send_buffer);
    let meter = Meter::new();
    // h2 bounds reset and CONTINUATION floods itself; the guard bounds the
    // other control frames.
    let io = meter.counted(crate::h2flood::FloodGuard::with_limits(
        io,
        cfg.control_frames,
    ));
    let mut conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, builder.handshake(io)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "client: HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!("client: HTTP/2 handshake timed out");
            return;
        }
    };
    let Some(pings) = conn.ping_pong() else {
        return;
    };
    let mut ctl = Controller::new(pings, start, cfg.keepalive, meter.clone());
    let mut going_away = false;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let mut svc = svc.clone();
                    let req = req.map(|recv| RecvBody::new(recv, meter.clone()));
                    tokio::spawn(async move {
                        let Ok(resp) = svc.call(req).await else { return };
                        respond_with(resp, respond).await;
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "HTTP/2 connection ended with error");
                    return;
                }
                None => return,
            },
            a = ctl.next() => match a {
                Action::KeepaliveTimedOut => {
                    tracing::info!("keepalive PING unanswered; closing the connection");
                    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                    // Let the GOAWAY out, briefly.
                    let _ = tokio::time::timeout(Duration::from_secs(1), std::future::poll_fn(|cx| conn.poll_closed(cx))).await;
                    return;
                }
                a => apply_server(&mut conn, &mut ctl, a),
            },
            _ = drain.draining(), if !going_away => {
                going_away = true;
                conn.graceful_shutdown();
            }
            _ = drain.stopping() => return,
        }
    }
}

async fn respond_with<B>(resp: Response<B>, mut respond: h2::server::SendResponse<Bytes>)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError> + Send,
{
    let (parts, body) = resp.into_parts();
    let end = body.is_end_stream();
    let Ok(send) = respond.send_response(Response::from_parts(parts, ()), end) else {
        return;
    };
    if !end {
        send_body(body, send).await;
    }
}

/// The client end: requests on one HTTP/2 connection, as a tower service
/// (what tonic's generated clients take).
#[derive(Clone)]
pub struct Channel {
    send: h2::client::SendRequest<Bytes>,
    meter: Arc<Meter>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel")
    }
}

/// Opens an HTTP/2 connection over `io` and drives it (windows, keepalive)
/// on a task of its own until it ends or a keepalive PING goes unanswered.
pub async fn connect<IO>(io: IO, cfg: &H2Config) -> Result<Channel, h2::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let meter = Meter::new();
    let start = Start::new(cfg.window, &cfg.process_budget, cfg.stats.clone());
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(start.stream())
        .initial_connection_window_size(start.connection())
        .max_frame_size(cfg.max_frame_size)
        .max_header_list_size(cfg.max_header_list_size)
        .max_send_buffer_size(cfg.max_send_buffer)
        .handshake(meter.counted(io))
        .await?;
    let pings = conn
        .ping_pong()
        .ok_or_else(|| h2::Error::from(h2::Reason::INTERNAL_ERROR))?;
    let mut ctl = Controller::new(pings, start, cfg.keepalive, meter.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = &mut conn => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "HTTP/2 connection ended with error");
                    }
                    return;
                }
                a = ctl.next() => match a {
                    Action::KeepaliveTimedOut => {
                        tracing::info!("keepalive PING unanswered; closing the connection");
                        return;
                    }
                    Action::Resize { stream, connection } => {
                        conn.set_target_window_size(connection);
                        if stream.is_some_and(|s| conn.set_initial_window_size(s).is_err()) {
                            ctl.retry(a);
                        }
                    }
                },
            }
        }
    });
    Ok(Channel { send, meter })
}

impl<B> tower_service::Service<Request<B>> for Channel
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    type Response = Response<RecvBody>;
    type Error = h2::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<RecvBody>, h2::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let end = body.is_end_stream();
        let sent = self.send.send_request(Request::from_parts(parts, ()), end);
        let meter = self.meter.clone();
        Box::pin(async move {
            let (response, send) = sent?;
            if !end {
                tokio::spawn(send_body(body, send));
            }
            let resp = response.await?;
            Ok(resp.map(|recv| RecvBody::new(recv, meter)))
        })
    }
}
