//! HTTP CONNECT frontend: `CONNECT host:port HTTP/1.1`, then raw bytes.
//!
//! The request head is parsed with httparse and every response is written by
//! hand because upstream's exact bytes matter to kube-apiserver: a bare
//! `HTTP/1.1 200 Connection Established` with no headers, and nothing after it
//! that is not tunnel data. One task owns the socket; the 200 line and the
//! agent's data go through the same queue, so the 200 always comes first.
//! Like upstream, `stream_packets_total` counts only gRPC frontends' packets.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use daemon::drain::Drain;
use daemon::hangup::{Hangup, SplitConn, hung_up};
use daemon::listen::Reset;
use konnectivity_proto::ids::{ConnectId, DialId};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt, PacketType};
use link::chunks::ChunkReader;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::backend::Backend;
use crate::core::{Core, DialRefused};
use crate::frontend::connect_head::{Head, HeadError, method_not_allowed, parse_head};
use crate::limits::{MAX_CONNECT_HEAD as MAX_HEAD, MAX_EARLY_DATA};
use crate::tunnel::{Abort, FrontendQueue, Tunnel, TunnelState};

/// How long a tunnel is held back before its client's connection is watched
/// for a hang-up: a wait this long is a stalled destination, not a round
/// trip, and the watch costs a descriptor and a registration.
const HANGUP_WATCH_AFTER: Duration = Duration::from_secs(1);

/// How long a client may take to send its request head (Go's ReadHeaderTimeout).
const HEAD_TIMEOUT: Duration = Duration::from_secs(60);

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// The status upstream maps an agent's dial error text to.
pub fn status_for_dial_error(error: &str) -> u16 {
    let e = error.to_ascii_lowercase();
    if e.contains("timeout") || e.contains("deadline exceeded") {
        504
    } else if e.contains("too many open files") {
        503
    } else {
        502
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A response the way Go's `http.Response.Write` renders one with an unsized body.
fn go_response(code: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {code} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}",
        reason(code)
    )
    .into_bytes()
}

fn refused_response(why: &DialRefused) -> Vec<u8> {
    match why {
        DialRefused::NoAgent => {
            format!("HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: {why}")
                .into_bytes()
        }
        DialRefused::TimedOut => format!(
            "HTTP/1.1 504 Gateway Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nFailed to tunnel dial request: {why}\r\n"
        )
        .into_bytes(),
        DialRefused::TooManyPending { .. } => format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nFailed to tunnel dial request: {why}\r\n"
        )
        .into_bytes(),
        other => format!(
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nFailed to tunnel dial request: {other}\r\n"
        )
        .into_bytes(),
    }
}

/// How long ending a connection cleanly may wait for the client.
const SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How a client connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Shut down: the client reads the end of the stream.
    Clean,
    /// The tunnel was cut short (its agent lost, or the agent closed it with
    /// an error): reset, so the client reads an error, not a clean end of
    /// data it might take for complete. Upstream closes cleanly here.
    Reset,
}

/// Serves one client connection.
/// `source`: the client's address (TCP); `None` on the Unix socket.
pub async fn serve_conn<IO>(
    core: Arc<Core>,
    mut io: IO,
    source: Option<std::net::SocketAddr>,
    drain: Drain,
) where
    IO: SplitConn + Reset,
{
    let gauge = core.metrics.http_connections.clone();
    gauge.increment(1.0);
    match serve_inner(&core, &mut io, source, &drain).await {
        // Bounded: a TLS close_notify waits for room in the send buffer,
        // which a client that stopped reading never makes.
        Ending::Clean => {
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, io.shutdown()).await;
        }
        // No TLS close_notify either: it would read as a clean end.
        Ending::Reset => io.reset_on_close(),
    }
    drop(io);
    gauge.decrement(1.0);
}

/// How reading a request head ended.
enum HeadRead {
    Head(Head, usize),
    Refused(HeadError),
    /// Closed, failed or silent: Go's server hangs up without an answer.
    Gone,
}

/// Reads one request head into `buf` (which may already hold bytes).
async fn read_head<IO>(io: &mut IO, buf: &mut BytesMut) -> HeadRead
where
    IO: AsyncRead + Unpin,
{
    let mut reader = ChunkReader::new();
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        if !buf.is_empty() {
            match parse_head(buf) {
                Ok(Some((h, len))) => return HeadRead::Head(h, len),
                Ok(None) => {}
                Err(e) => return HeadRead::Refused(e),
            }
        }
        loop {
            let chunk = match reader.read(io).await {
                Ok(c) if !c.is_empty() => c,
                _ => return HeadRead::Gone,
            };
            buf.extend_from_slice(&chunk);
            // Only a line end can complete a head or reveal a bad line, and
            // a head has at most MAX_CONNECT_HEADERS lines: one sent a byte
            // at a time is parsed a bounded number of times.
            if !chunk.contains(&b'\n') && buf.len() <= MAX_HEAD {
                continue;
            }
            match parse_head(buf) {
                Ok(None) => {}
                Ok(Some((h, len))) => return HeadRead::Head(h, len),
                Err(e) => return HeadRead::Refused(e),
            }
        }
    })
    .await;
    read.unwrap_or_else(|_| {
        tracing::debug!("client did not send a request head in time");
        HeadRead::Gone
    })
}

async fn serve_inner<IO>(
    core: &Arc<Core>,
    io: &mut IO,
    source: Option<std::net::SocketAddr>,
    drain: &Drain,
) -> Ending
where
    IO: SplitConn,
{
    // Only the bytes received so far are held while a client sends its head.
    let mut buf = BytesMut::new();
    // Requests other than CONNECT are answered 405 and, as Go's server
    // does, the connection is read for the next request.
    let (authority, user_agent, traceparent, len) = loop {
        match read_head(io, &mut buf).await {
            HeadRead::Head(
                Head::Connect {
                    authority,
                    user_agent,
                    traceparent,
                },
                len,
            ) => break (authority, user_agent, traceparent, len),
            HeadRead::Head(
                Head::OtherMethod {
                    method,
                    close,
                    close_header,
                    has_body,
                },
                len,
            ) => {
                tracing::debug!(method = %method, "non-CONNECT request");
                if io
                    .write_all(&method_not_allowed(close_header))
                    .await
                    .is_err()
                    || close
                    || has_body
                {
                    return Ending::Clean;
                }
                let _ = buf.split_to(len);
            }
            HeadRead::Refused(e) => {
                tracing::debug!(error = %e, "bad CONNECT request");
                let _ = io.write_all(&e.response()).await;
                return Ending::Clean;
            }
            HeadRead::Gone => return Ending::Clean,
        }
    };
    let early = buf.split_off(len);
    tracing::debug!(host = %authority.0, user_agent = %user_agent, "CONNECT");

    let (tunnel, queue) = Tunnel::tracked(Some(core.debug.open("http-connect", source)));
    if let (Some(tp), Some(d)) = (traceparent, tunnel.debug()) {
        tp.record(d);
    }
    core.start_trace(&tunnel, "http-connect", traceparent);
    let dial = DialId::random();
    let req = Packet::dial_request("tcp", &authority.0, dial.0);
    if let Err(why) = core.dial(&tunnel, req).await {
        tracing::debug!(host = %authority.0, error = %why, "dial refused");
        let _ = io.write_all(&refused_response(&why)).await;
        core.frontend_gone(&tunnel).await;
        return Ending::Clean;
    }
    let ending = run_tunnel(core, &tunnel, queue, io, early, drain).await;
    core.frontend_gone(&tunnel).await;
    ending
}

async fn run_tunnel<IO>(
    core: &Core,
    tunnel: &Arc<Tunnel>,
    queue: FrontendQueue,
    io: &mut IO,
    early: BytesMut,
    drain: &Drain,
) -> Ending
where
    IO: SplitConn,
{
    let (rd, wr) = io.split_conn();
    let (est_tx, est_rx) = watch::channel(None);
    tokio::select! {
        e = write_loop(core, tunnel, queue, wr, est_tx) => e,
        _ = read_loop(core, tunnel, rd, early, est_rx) => Ending::Clean,
        _ = drain.stopping() => Ending::Clean,
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Everything the client receives is written here, in queue order.
async fn write_loop<W>(
    core: &Core,
    tunnel: &Arc<Tunnel>,
    queue: FrontendQueue,
    mut wr: W,
    est_tx: watch::Sender<Option<(Arc<Backend<Tunnel>>, ConnectId)>>,
) -> Ending
where
    W: AsyncWrite + Unpin,
{
    loop {
        let deadline = Core::dial_deadline(tunnel);
        let pkt = tokio::select! {
            biased;
            p = queue.rx.recv() => p,
            _ = queue.finished.cancelled() => queue.rx.try_recv(),
            _ = sleep_until_opt(deadline) => {
                if core.expire_dial(tunnel).await.is_some() {
                    let msg = format!(
                        "HTTP/1.1 504 Gateway Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nBackend dial timeout: {}\r\n",
                        DialRefused::TimedOut
                    );
                    let _ = wr.write_all(msg.as_bytes()).await;
                    return Ending::Clean;
                }
                continue;
            }
        };
        let Some(pkt) = pkt else {
            return ending_of(tunnel);
        };
        if tunnel.aborted().is_some() {
            return ending_of(tunnel);
        }
        let written = match (PacketType::try_from(pkt.r#type), pkt.payload) {
            (Ok(PacketType::DialRsp), Some(Payload::DialResponse(rsp))) if rsp.error.is_empty() => {
                let r = write_or_abort(tunnel, &mut wr, ESTABLISHED).await;
                // The connection may already be closing (a destination that
                // spoke and hung up at once); its data and close are queued
                // behind this and still go out in order.
                if let TunnelState::Established { backend, connect } = tunnel.state() {
                    let _ = est_tx.send(Some((backend, connect)));
                }
                r
            }
            (Ok(PacketType::DialRsp), Some(Payload::DialResponse(rsp))) => {
                let resp = go_response(status_for_dial_error(&rsp.error), &rsp.error);
                let _ = write_or_abort(tunnel, &mut wr, &resp).await;
                return Ending::Clean;
            }
            (Ok(PacketType::Data), Some(Payload::Data(d))) => {
                let written = write_or_abort(tunnel, &mut wr, &d.data).await;
                tunnel.consumed(d.data.len());
                written
            }
            (Ok(PacketType::CloseRsp), Some(Payload::CloseResponse(c))) if !c.error.is_empty() => {
                tracing::debug!(error = %c.error, "tunnel cut short; resetting the client connection");
                return Ending::Reset;
            }
            (Ok(PacketType::CloseRsp | PacketType::DialCls), _) => return Ending::Clean,
            _ => true,
        };
        if !written {
            return ending_of(tunnel);
        }
    }
}

/// A tunnel aborted by the agent's fault or by a client that stopped
/// reading is cut short; one ended by our shutdown closes cleanly, as
/// upstream's does.
fn ending_of(tunnel: &Tunnel) -> Ending {
    match tunnel.aborted() {
        None | Some(Abort::Shutdown) => Ending::Clean,
        Some(_) => Ending::Reset,
    }
}

/// Writes unless the tunnel is aborted meanwhile (a client that stopped
/// reading must not pin this task forever).
async fn write_or_abort<W: AsyncWrite + Unpin>(tunnel: &Tunnel, wr: &mut W, data: &[u8]) -> bool {
    tokio::select! {
        r = async { wr.write_all(data).await?; wr.flush().await } => r.is_ok(),
        _ = tunnel.aborted_wait() => false,
    }
}

/// Everything the client sends goes to the agent from here. Bytes that arrive
/// before the 200 are kept (up to [`MAX_EARLY_DATA`]) and sent once the dial
/// succeeds. No read buffer is held while the client is quiet.
async fn read_loop<R>(
    core: &Core,
    tunnel: &Tunnel,
    mut rd: R,
    early: BytesMut,
    mut est_rx: watch::Receiver<Option<(Arc<Backend<Tunnel>>, ConnectId)>>,
) where
    R: AsyncRead + Hangup + Unpin,
{
    let mut reader = ChunkReader::new();
    let mut early = early;
    let (backend, connect) = loop {
        if let Some(v) = est_rx.borrow_and_update().clone() {
            break v;
        }
        if early.len() >= MAX_EARLY_DATA {
            if est_rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            continue;
        }
        tokio::select! {
            r = est_rx.changed() => if r.is_err() { return std::future::pending().await },
            r = reader.read(&mut rd) => match r {
                Ok(c) if !c.is_empty() => early.extend_from_slice(&c),
                _ => return,
            },
        }
    };
    if !early.is_empty() && !send(core, tunnel, &backend, connect, early.freeze()).await {
        return;
    }
    loop {
        let limit = tunnel.next_read();
        let chunk = match reader.read_at_most(&mut rd, limit).await {
            Ok(c) if !c.is_empty() => c,
            _ => return,
        };
        let sending = send(core, tunnel, &backend, connect, chunk);
        tokio::pin!(sending);
        // Held back this long, the tunnel watches its client for a hang-up
        // (`daemon::hangup`): a client gone behind its unread bytes would
        // otherwise keep the tunnel until the agent's connection ends.
        // Most sends finish at once: no timer is made for them.
        let first = std::future::poll_fn(|cx| Poll::Ready(sending.as_mut().poll(cx))).await;
        let sent = match first {
            Poll::Ready(sent) => sent,
            Poll::Pending => tokio::select! {
            biased;
            sent = &mut sending => sent,
            () = tokio::time::sleep(HANGUP_WATCH_AFTER) => {
                let watch = rd.hangup_watch();
                tokio::select! {
                    biased;
                    sent = &mut sending => sent,
                    () = hung_up_or_never(watch) => {
                        tracing::debug!("the client closed its connection while its tunnel was held back");
                        false
                    }
                }
            }
            },
        };
        if !sent {
            return;
        }
    }
}

async fn hung_up_or_never(watch: Option<std::os::fd::OwnedFd>) {
    if let Some(fd) = watch
        && hung_up(fd).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

async fn send(
    core: &Core,
    tunnel: &Tunnel,
    backend: &Backend<Tunnel>,
    connect: ConnectId,
    data: Bytes,
) -> bool {
    core.frontend_bytes(tunnel, backend, connect, data).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dial_errors_map_like_upstream() {
        assert_eq!(
            status_for_dial_error("dial tcp 10.0.0.1:80: i/o timeout"),
            504
        );
        assert_eq!(status_for_dial_error("context deadline exceeded"), 504);
        assert_eq!(
            status_for_dial_error("dial tcp: socket: too many open files"),
            503
        );
        assert_eq!(
            status_for_dial_error("dial tcp 127.0.0.1:1: connect: connection refused"),
            502
        );
        assert_eq!(
            status_for_dial_error("dial tcp: lookup x.invalid: no such host"),
            502
        );
        assert_eq!(status_for_dial_error("something else"), 502);
    }
}
