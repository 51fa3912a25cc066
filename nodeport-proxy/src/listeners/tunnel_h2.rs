//! CONNECT over HTTP/2 (h2c): many tunnels as streams of one connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use http::{Method, Request, Response, StatusCode};
use link::debug_connections::{CloseReason, Tracked};
use link::h2io::H2Io;
use link::h2window::{Action, Controller, Meter};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::limits;
use crate::listeners::tunnel_open::{TunnelError, TunnelListener, open, record_refusal};
use crate::relay::access_log::Access;
use crate::relay::connect_request::RequestError;
use crate::relay::session::{Active, Downstream};
use crate::routing::names::ConnectAuthority;

/// `deadline` bounded the client preface (read before this is called); it
/// also bounds our side of the handshake. Returns whether h2 itself ended the
/// connection for a flood (GOAWAY `ENHANCE_YOUR_CALM` for rapid resets or
/// CONTINUATION frames; the other floods are the transport's guard's).
pub async fn serve<T>(
    io: T,
    l: Arc<TunnelListener>,
    deadline: Instant,
    access: &Access,
    downstream: Downstream,
    record: &Tracked,
) -> bool
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = &l.shared;
    let http = &shared.metrics.http;
    // The windows are reserved from the budget before they are advertised.
    let start = shared.windows.start(shared.config.tunnel_windows);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(shared.config.max_streams_per_connection)
        .initial_window_size(start.stream())
        .initial_connection_window_size(start.connection())
        .max_header_list_size(limits::MAX_HEADER_LIST_SIZE)
        .header_table_size(limits::HEADER_TABLE_SIZE)
        .max_frame_size(limits::MAX_FRAME_SIZE)
        .max_pending_accept_reset_streams(limits::MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(Some(limits::MAX_LOCAL_ERROR_RESET_STREAMS))
        .max_send_buffer_size(shared.config.buffer_size);
    let mut conn = match tokio::time::timeout_at(deadline, builder.handshake::<_, Bytes>(io)).await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            http.downstream_cx_protocol_error.increment(1);
            l.stats.reject("bad_request");
            tracing::debug!(error = %e, "client: HTTP/2 handshake failed");
            return false;
        }
        Err(_) => {
            http.downstream_rq_header_timeout.increment(1);
            l.stats.reject("request_header_timeout");
            return false;
        }
    };
    let Some(pings) = conn.ping_pong() else {
        return false;
    };
    // Windows that follow the link, bounded by the budgets; the seed side
    // sends no keepalive PINGs (KKP's Envoy sets none on this listener).
    let meter = Meter::new();
    let mut windows = Controller::new(pings, start, None, meter.clone());
    let streams = Arc::new(watch::Sender::new(0usize));
    let idle = shared.config.connection.tunneling_connection_idle_timeout;
    // The request-head deadline ended with the preface: an open connection
    // waiting for its next stream is idle, not slow (tunnel-agent keeps one
    // such connection per node), and only the connection idle timeout
    // applies to it, as with KKP's Envoy, which sets no header timeout.
    let mut going_away = false;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    // A request came: no longer a half-open connection that
                    // a newcomer may displace when the listener is full.
                    daemon::listen::settle();
                    streams.send_modify(|n| *n += 1);
                    let l = l.clone();
                    let streams = streams.clone();
                    let access = access.stream("HTTP/2");
                    let tracked = shared.connections.open("tunneling-stream", Some(downstream.source));
                    tracked.set("connection", record.id());
                    let meter = meter.clone();
                    shared.drain.spawn(async move {
                        stream(req, respond, &l, access, &downstream, &tracked, &meter).await;
                        streams.send_modify(|n| *n = n.saturating_sub(1));
                    });
                }
            Some(Err(e)) => {
                    if !e.is_go_away() && !e.is_io() {
                        http.downstream_cx_protocol_error.increment(1);
                    }
                    tracing::debug!(error = %e, "client: HTTP/2 connection ended");
                    return e.is_go_away()
                        && e.is_library()
                        && e.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
                }
                None => break,
            },
            a = windows.next() => {
                if let Action::Resize { stream, connection } = a {
                    conn.set_target_window_size(connection);
                    if stream.is_some_and(|s| conn.set_initial_window_size(s).is_err()) {
                        windows.retry(a);
                    }
                }
            }
            _ = idle_for(streams.subscribe(), idle), if !going_away => {
                tracing::debug!("HTTP/2 connection idle; going away");
                conn.graceful_shutdown();
                going_away = true;
            }
            _ = shared.drain.draining(), if !going_away => {
                conn.graceful_shutdown();
                going_away = true;
            }
            _ = shared.drain.stopping() => break,
        }
    }
    false
}

/// Resolves once the connection has had no open stream for `idle`.
async fn idle_for(mut count: watch::Receiver<usize>, idle: Duration) {
    if idle.is_zero() {
        return std::future::pending().await;
    }
    loop {
        if count.wait_for(|n| *n == 0).await.is_err() {
            return std::future::pending().await;
        }
        if tokio::time::timeout(idle, count.wait_for(|n| *n > 0))
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn stream(
    req: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
    l: &TunnelListener,
    mut access: Access,
    downstream: &Downstream,
    conn: &Tracked,
    meter: &Arc<Meter>,
) {
    let shared = &l.shared;
    let http = &shared.metrics.http;
    http.downstream_rq_total.increment(1);
    let _rq = Active::new(&http.downstream_rq_active);
    let authority = match request_authority(&req) {
        Ok(a) => a,
        Err(e) => {
            let e = TunnelError::Request(e);
            conn.set_close(e.cause(), e.reason());
            return refuse(&mut respond, e, l, &mut access);
        }
    };
    access.authority(&authority.to_string());
    conn.set_target(&authority);
    conn.set_state("connecting");
    let (mut session, upstream, _permit) =
        match open(&authority, l, *downstream, conn, &mut access).await {
            Ok(o) => o,
            Err(e) => {
                conn.set_close(e.cause(), e.reason());
                return refuse(&mut respond, e, l, &mut access);
            }
        };
    session.access.answer(200, "-", "-");
    let send = match respond.send_response(Response::new(()), false) {
        Ok(s) => s,
        Err(e) => {
            session.access.answer(200, "DC", "client_error");
            conn.set_close(CloseReason::ClientLost, "client_error");
            tracing::debug!(error = %e, "client: stream gone before 200");
            return;
        }
    };
    http.downstream_rq_2xx.increment(1);
    let _up_rq = Active::new(&session.route.cluster.stats.upstream_rq_active());
    let io = H2Io::metered(send, req.into_body(), meter);
    session.relay(io, Bytes::new(), upstream).await;
}

fn request_authority(req: &Request<h2::RecvStream>) -> Result<ConnectAuthority, RequestError> {
    if req.method() != Method::CONNECT {
        return Err(RequestError::NotConnect(req.method().to_string()));
    }
    let a = req
        .uri()
        .authority()
        .ok_or_else(|| RequestError::BadTarget(String::new()))?;
    ConnectAuthority::parse(a.as_str()).map_err(|_| RequestError::BadTarget(a.to_string()))
}

fn refuse(
    respond: &mut SendResponse<Bytes>,
    e: TunnelError,
    l: &TunnelListener,
    access: &mut Access,
) {
    record_refusal(&e, l, access);
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    let _ = respond.send_response(resp, true);
}
