//! The tunneling listener (`-envoy-tunneling-port`, 8088): HTTP/2 with prior
//! knowledge (h2c) and HTTP/1.1 on one port, told apart by the HTTP/2 preface.
//! Only CONNECT is served; the tunnel goes to the route whose authority equals
//! the request's exactly. 200 is sent once the upstream is connected; bytes the
//! client sent before that are kept and forwarded.

use std::sync::Arc;

use bytes::Bytes;
use daemon::prefixed::PrefixedIo;
use link::debug_connections::{CloseReason, Tracked};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::limits::{MAX_CONNECT_HEAD, MAX_REFUSAL_DRAIN, REFUSAL_DRAIN_TIME};
use crate::listeners::tunnel_open::{TunnelError, TunnelListener, open, record_refusal};
use crate::relay::access_log::Access;
use crate::relay::connect_request::{self, Parsed};
use crate::relay::first_bytes;
use crate::relay::session::{Active, Downstream};

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
/// HTTP/2's initial SETTINGS_MAX_FRAME_SIZE: the largest first frame a client
/// may send before it has seen ours.
const MAX_FIRST_FRAME: usize = 16 * 1024;
/// Magic, frame header and the largest SETTINGS payload: the most read while
/// waiting for the client preface.
const MAX_CLIENT_PREFACE: usize = 24 + FRAME_HEADER + MAX_FIRST_FRAME;

/// Whether `buf` (starting with the magic) holds the whole client preface:
/// the magic and the first frame, which must be SETTINGS (RFC 9113 §3.4).
/// Anything else counts as complete: HTTP/2 itself refuses it then.
fn client_preface_complete(buf: &[u8]) -> bool {
    let Some(header) = buf.get(H2_PREFACE.len()..H2_PREFACE.len() + FRAME_HEADER) else {
        return false;
    };
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let settings = header[3] == 0x4;
    !settings || len > MAX_FIRST_FRAME || buf.len() >= H2_PREFACE.len() + FRAME_HEADER + len
}

pub async fn handle(mut client: TcpStream, l: Arc<TunnelListener>) {
    let shared = &l.shared;
    let http = &shared.metrics.http;
    l.stats.downstream_cx_total.increment(1);
    let _listener_active = Active::new(&l.stats.downstream_cx_active);
    http.downstream_cx_total.increment(1);
    let _active = Active::new(&http.downstream_cx_active);
    if let Err(e) = shared.config.connection.downstream_keepalive.apply(&client) {
        tracing::debug!(error = %e, "client keepalive not set");
    }
    let expect = shared.config.accept_proxy_protocol.tunneling;
    let peer = client.peer_addr().ok();
    let conn = shared.connections.open("tunneling", peer);
    conn.set_state("handshake");
    // Nothing is buffered until the client sends.
    let (downstream, mut buf) = match Box::pin(Downstream::of(&client, peer, expect, shared)).await
    {
        Ok(d) => d,
        Err(e) => {
            conn.set_close(e.cause(), e.reason());
            l.stats.reject(e.reason());
            tracing::debug!(error = %e, "tunneling connection closed");
            return;
        }
    };
    conn.set_source(downstream.source);
    if let Some(penalty) = &l.penalty {
        let waited = penalty.admit(downstream.source.ip(), |wait| {
            shared.metrics.flood_penalty_delayed.increment(1);
            conn.set_state("flood penalty");
            tracing::debug!(
                ?wait,
                "client address flooded recently: this connection waits for its turn"
            );
        });
        if let Err(e) = waited.await {
            l.stats.reject("flood_penalty");
            conn.set_close(CloseReason::Overloaded, "flood_penalty");
            tracing::debug!(error = %e, "tunneling connection closed");
            return;
        }
        conn.set_state("handshake");
    }
    // Written for a request only, as Envoy's HTTP connection manager does:
    // a connection that never sent one leaves no line.
    let mut access = Access::start(
        shared.access_log.as_ref(),
        Some(downstream.local),
        Some(downstream.source),
    );
    access.skip_unless_answered();
    let deadline = Instant::now() + shared.config.request_header_timeout;
    // Read until the bytes either are the HTTP/2 preface or cannot be.
    while buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf) {
        match read_head(&client, &mut buf, MAX_CONNECT_HEAD, deadline).await {
            HeadRead::Closed => return conn.set_cause(CloseReason::ClientClosed),
            HeadRead::More => {}
            HeadRead::TimedOut => {
                http.downstream_rq_header_timeout.increment(1);
                l.stats.reject("request_header_timeout");
                conn.set_close(CloseReason::ClientTimeout, "request_header_timeout");
                if !buf.is_empty() {
                    access.protocol("HTTP/1.1");
                    access.answer(408, "-", "request_header_timeout");
                    reply_h1(&mut client, 408).await;
                }
                return;
            }
        }
    }
    // Each protocol's state is allocated only once it is known, so a
    // connection that has sent nothing stays small.
    if buf.starts_with(H2_PREFACE) {
        // The client's preface ends with its SETTINGS frame; until that is in,
        // the connection is still opening and the head deadline applies.
        while !client_preface_complete(&buf) {
            let max = MAX_CLIENT_PREFACE.max(buf.len() + 1);
            match read_head(&client, &mut buf, max, deadline).await {
                HeadRead::Closed => return conn.set_cause(CloseReason::ClientClosed),
                HeadRead::More => {}
                HeadRead::TimedOut => {
                    http.downstream_rq_header_timeout.increment(1);
                    l.stats.reject("request_header_timeout");
                    conn.set_close(CloseReason::ClientTimeout, "request_header_timeout");
                    return;
                }
            }
        }
        let _h2 = Active::new(&http.downstream_cx_http2_active);
        conn.set_state("http2");
        // h2 bounds reset and CONTINUATION floods itself; the guard bounds
        // the other control frames.
        // Sent away for a flood, by the guard or by h2: count it, and slow
        // the client's address.
        let flooded = {
            let (floods, penalty) = (shared.metrics.tunneling_floods.clone(), l.penalty.clone());
            let source = downstream.source.ip();
            move || {
                floods.increment(1);
                if let Some(p) = &penalty {
                    p.flag(source);
                }
            }
        };
        let io = link::h2flood::FloodGuard::server(PrefixedIo::new(buf.into(), client))
            .on_flood(flooded.clone());
        let calmed = Box::pin(crate::listeners::tunnel_h2::serve(
            io,
            l.clone(),
            deadline,
            &access,
            downstream,
            &conn,
        ))
        .await;
        if calmed {
            flooded();
        }
    } else {
        let _h1 = Active::new(&http.downstream_cx_http1_active);
        access.protocol("HTTP/1.1");
        Box::pin(http1(client, buf, deadline, &l, access, &downstream, &conn)).await;
    }
}

async fn http1(
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
    l: &TunnelListener,
    mut access: Access,
    downstream: &Downstream,
    conn: &Tracked,
) {
    let shared = &l.shared;
    let http = &shared.metrics.http;
    // A head is parsed again only when a line has ended since the last try.
    let mut unparsed_from = 0;
    let head = loop {
        if buf[unparsed_from..].contains(&b'\n') || buf.len() >= MAX_CONNECT_HEAD {
            match connect_request::parse(&buf) {
                Ok(Parsed::Connect(head)) => break head,
                Ok(Parsed::Incomplete) => {}
                Err(e) => {
                    http.downstream_rq_total.increment(1);
                    http.downstream_cx_protocol_error.increment(1);
                    let e = TunnelError::Request(e);
                    conn.set_close(e.cause(), e.reason());
                    return refuse_h1(&mut client, e, l, &mut access).await;
                }
            }
        }
        unparsed_from = buf.len();
        match read_head(&client, &mut buf, MAX_CONNECT_HEAD, deadline).await {
            HeadRead::Closed => return conn.set_cause(CloseReason::ClientClosed),
            HeadRead::More => {}
            HeadRead::TimedOut => {
                http.downstream_rq_header_timeout.increment(1);
                let e = TunnelError::HeaderTimeout;
                conn.set_close(e.cause(), e.reason());
                return refuse_h1(&mut client, TunnelError::HeaderTimeout, l, &mut access).await;
            }
        }
    };
    daemon::listen::settle();
    http.downstream_rq_total.increment(1);
    let _rq = Active::new(&http.downstream_rq_active);
    access.authority(&head.authority.to_string());
    conn.set_target(&head.authority);
    conn.set_state("connecting");
    let opened = open(&head.authority, l, *downstream, conn, &mut access).await;
    let (mut session, upstream, _permit) = match opened {
        Ok(o) => o,
        Err(e) => {
            conn.set_close(e.cause(), e.reason());
            return refuse_h1(&mut client, e, l, &mut access).await;
        }
    };
    session.access.answer(200, "-", "-");
    if client.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_err() {
        session.access.answer(200, "DC", "client_error");
        conn.set_close(CloseReason::ClientLost, "client_error");
        return;
    }
    http.downstream_rq_2xx.increment(1);
    let early = Bytes::copy_from_slice(&buf[head.head_len..]);
    drop(buf);
    let _up_rq = Active::new(&session.route.cluster.stats.upstream_rq_active());
    session
        .relay(link::duplex::Plain(client), early, upstream)
        .await;
}

/// What one read of a request head (or preface) before its deadline gave.
enum HeadRead {
    More,
    Closed,
    TimedOut,
}

async fn read_head(
    client: &TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
    deadline: Instant,
) -> HeadRead {
    match tokio::time::timeout_at(deadline, first_bytes::read_some(client, buf, max)).await {
        Ok(Ok(0)) | Ok(Err(_)) => HeadRead::Closed,
        Ok(Ok(_)) => HeadRead::More,
        Err(_) => HeadRead::TimedOut,
    }
}

async fn refuse_h1(
    client: &mut TcpStream,
    e: TunnelError,
    l: &TunnelListener,
    access: &mut Access,
) {
    record_refusal(&e, l, access);
    reply_h1(client, e.status()).await;
}

/// Writes a final response and closes; reads (and drops) a bounded amount of
/// what the client still sends so the close does not reset the response away.
async fn reply_h1(client: &mut TcpStream, status: u16) {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let body = format!("{status} {reason}\n");
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    head.push_str(&body);
    if client.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let _ = client.shutdown().await;
    let _ = tokio::time::timeout(
        REFUSAL_DRAIN_TIME,
        first_bytes::discard(client, MAX_REFUSAL_DRAIN),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_preface_needs_the_whole_settings_frame() {
        let mut p = H2_PREFACE.to_vec();
        assert!(!client_preface_complete(&p));
        // SETTINGS with one 6-byte entry.
        p.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0]);
        for _ in 0..5 {
            assert!(!client_preface_complete(&p));
            p.push(1);
        }
        p.push(1);
        assert!(client_preface_complete(&p));
        // An empty SETTINGS frame completes it too.
        let mut empty = H2_PREFACE.to_vec();
        empty.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert!(client_preface_complete(&empty));
        // Not SETTINGS, or too long: complete, for HTTP/2 to refuse.
        let mut ping = H2_PREFACE.to_vec();
        ping.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]);
        assert!(client_preface_complete(&ping));
        let mut huge = H2_PREFACE.to_vec();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0]);
        assert!(client_preface_complete(&huge));
    }
}
