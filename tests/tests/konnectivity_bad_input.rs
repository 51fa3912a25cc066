//! Bad input from frontends and agents: each gets a clear error for its own
//! stream or connection, and everyone else keeps being served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use integration_tests::certs::Pki;
use integration_tests::client::{grpc_dial, http_connect, open_stream};
use integration_tests::dest;
use integration_tests::h2raw;
use integration_tests::konnectivity::{ServerOpts, Stack, init_logging, raw_agent, start_server};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

async fn still_serves(stack: &Stack) {
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"alive").await;
    assert_eq!(t.read_exact(5).await, b"alive");
}

fn close_rsp(p: &Packet) -> Option<(i64, String)> {
    match &p.payload {
        Some(Payload::CloseResponse(c)) => Some((c.connect_id, c.error.clone())),
        _ => None,
    }
}

/// Writes `garbage` and waits for the server to close the connection (it
/// answers at most a GOAWAY or a TLS alert first).
async fn closed_after<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, garbage: &[u8]) {
    s.write_all(garbage).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("connection must be closed");
}

#[tokio::test]
async fn garbage_on_the_unix_socket_closes_that_connection_only() {
    let stack = Stack::start(ServerOpts::default()).await;
    let s = stack.server.frontend.connect().await.unwrap();
    closed_after(s, b"\x00\x01garbage that is not HTTP/2 at all\r\n\r\n").await;
    still_serves(&stack).await;
}

#[tokio::test]
async fn garbage_on_the_agent_port_closes_that_connection_only() {
    let stack = Stack::start(ServerOpts::default()).await;
    let s = tokio::net::TcpStream::connect(stack.server.agent_addr)
        .await
        .unwrap();
    closed_after(s, b"GET / HTTP/1.1\r\n\r\nnot a TLS record").await;
    still_serves(&stack).await;
}

#[tokio::test]
async fn data_before_dial_gets_close_rsp() {
    let stack = Stack::start(ServerOpts::default()).await;
    let (tx, mut rx) = open_stream(&stack.server.frontend).await;
    tx.send(Packet::data_copy(5, b"too early")).await.unwrap();
    let p = rx.message().await.unwrap().unwrap();
    assert_eq!(close_rsp(&p), Some((5, "backend not initialized".into())));
    assert!(
        rx.message().await.unwrap().is_none(),
        "the stream ends after the CLOSE_RSP"
    );
    still_serves(&stack).await;
}

#[tokio::test]
async fn close_req_before_dial_gets_close_rsp() {
    let stack = Stack::start(ServerOpts::default()).await;
    let (tx, mut rx) = open_stream(&stack.server.frontend).await;
    tx.send(Packet::close_request(9)).await.unwrap();
    let p = rx.message().await.unwrap().unwrap();
    assert_eq!(close_rsp(&p), Some((9, "backend uninitialized".into())));
}

#[tokio::test]
async fn mismatched_connect_id_closes_only_the_offending_stream() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let mut victim = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    let mut bad = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    // `bad` writes with `victim`'s connection id.
    bad.tx
        .send(Packet::data_copy(victim.connect_id, b"hijack"))
        .await
        .unwrap();
    let mut closes = Vec::new();
    while let Some(Ok(Some(p))) = Some(bad.rx.message().await) {
        if let Some(c) = close_rsp(&p) {
            closes.push(c);
        }
    }
    closes.sort();
    let mut want = vec![
        (victim.connect_id, "mismatched connection IDs".to_string()),
        (bad.connect_id, "mismatched connection IDs".to_string()),
    ];
    want.sort();
    assert_eq!(closes, want);
    // The victim's connection was not touched (upstream would close it too).
    victim.write(b"mine").await;
    assert_eq!(victim.read_exact(4).await, b"mine");
    assert_eq!(stack.server.handle.established(), 1);
}

#[tokio::test]
async fn oversize_frontend_message_fails_that_stream_only() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.tx.send(Packet::data(t.connect_id, Bytes::from(vec![0u8; 5 << 20])))
        .await
        .unwrap();
    let status = loop {
        match t.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without an error"),
            Err(s) => break s,
        }
    };
    // tonic's code for a message over the 4 MiB limit grpc-go also enforces.
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    still_serves(&stack).await;
}

#[tokio::test]
async fn misbehaving_agent_gets_close_requests_and_others_are_served() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let mut raw = raw_agent(&pki, server.agent_addr, "raw", "").await;
    assert_eq!(raw.server_count, 1);
    // A DIAL_RSP nobody asked for, with a connection: the server closes it.
    raw.tx
        .send(Packet::dial_response(424242, 7, String::new()))
        .await
        .unwrap();
    let p = raw.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(p.payload, Some(Payload::CloseRequest(ref c)) if c.connect_id == 7),
        "{p:?}"
    );
    // DATA for a connection the server does not know: closed too.
    raw.tx.send(Packet::data_copy(8, b"??")).await.unwrap();
    let p = raw.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(p.payload, Some(Payload::CloseRequest(ref c)) if c.connect_id == 8),
        "{p:?}"
    );
    // A CLOSE_RSP for nothing and DATA without an id are dropped silently;
    // the next answer the agent sees is for the DIAL_RSP after them.
    raw.tx
        .send(Packet::close_response(99, String::new()))
        .await
        .unwrap();
    raw.tx.send(Packet::data_copy(0, b"no id")).await.unwrap();
    raw.tx
        .send(Packet::dial_response(515151, 11, String::new()))
        .await
        .unwrap();
    let p = raw.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(p.payload, Some(Payload::CloseRequest(ref c)) if c.connect_id == 11),
        "{p:?}"
    );
    // An oversize message ends this agent's stream only.
    raw.tx
        .send(Packet::data(8, Bytes::from(vec![1u8; 5 << 20])))
        .await
        .unwrap();
    server.handle.wait_until(|h| h.agent_streams() == 0).await;
    let agent =
        integration_tests::konnectivity::start_agent(&pki, server.agent_addr, Default::default())
            .await;
    agent.handle.wait_connected(1).await;
    server.handle.wait_for_agents(1).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"ok").await;
    assert_eq!(t.read_exact(2).await, b"ok");
}

/// A frontend that stops reading while its destination keeps sending, and
/// another connection of the same agent moving 10 MiB meanwhile.
async fn stuck_reader_beside_a_bulk_transfer(
    stack: &Stack,
) -> (integration_tests::client::GrpcTunnel, usize) {
    let src = dest::source(64 << 20).await;
    let stuck = grpc_dial(&stack.server.frontend, &src.to_string())
        .await
        .unwrap();
    let src2 = dest::source(10 << 20).await;
    let mut t = grpc_dial(&stack.server.frontend, &src2.to_string())
        .await
        .unwrap();
    let total = t.read_to_end_len().await;
    (stuck, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_flow_control_a_reader_that_stops_costs_nobody_anything() {
    // A stall limit so short that, without flow control, the reader that
    // stops would be cut off at once (see the next test).
    let opts = ServerOpts {
        stall_timeout: Duration::from_millis(1),
        ..Default::default()
    };
    let stack = Stack::start(opts).await;
    assert_eq!(stack.server.handle.flow_controlled_agents(), 1);
    let (mut stuck, other) = stuck_reader_beside_a_bulk_transfer(&stack).await;
    assert_eq!(other, 10 << 20, "the other connection moved all its bytes");
    // The stalled connection is still open (our agent simply held its data
    // back): it reads everything, nothing lost.
    assert_eq!(stack.server.handle.established(), 1);
    assert_eq!(stuck.read_to_end_len().await, 64 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_upstream_style_agent_a_stalled_frontend_is_closed_alone() {
    init_logging();
    let pki = Pki::new();
    let opts = ServerOpts {
        stall_timeout: Duration::from_millis(300),
        frontend_queue: 4,
        ..Default::default()
    };
    let server = start_server(&pki, opts).await;
    // Our agent with flow control off speaks exactly upstream's protocol.
    let agent_opts = integration_tests::konnectivity::AgentOpts {
        flow_control: false,
        ..Default::default()
    };
    let agent =
        integration_tests::konnectivity::start_agent(&pki, server.agent_addr, agent_opts).await;
    agent.handle.wait_connected(1).await;
    server.handle.wait_for_agents(1).await;
    assert_eq!(server.handle.flow_controlled_agents(), 0);
    let src = dest::source(64 << 20).await;
    let mut stuck = grpc_dial(&server.frontend, &src.to_string()).await.unwrap();
    let src2 = dest::source(10 << 20).await;
    let mut t = grpc_dial(&server.frontend, &src2.to_string())
        .await
        .unwrap();
    assert_eq!(t.read_to_end_len().await, 10 << 20);
    // Both are gone: the finished one by CLOSE_RSP, the stuck one by the stall limit.
    server.handle.wait_until(|h| h.established() == 0).await;
    // The stuck frontend, when it finally reads, finds its stream ended with
    // an error naming the cause.
    let status = loop {
        match stuck.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stalled stream must end with an error"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("did not read"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn raw_socket_path_authority_is_accepted() {
    let stack = Stack::start(ServerOpts::default()).await;
    let path = stack.server.uds.clone().unwrap();
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    h2raw::start(&mut s).await.unwrap();
    // Old grpc-go sends the socket path itself; new grpc-go percent-encodes it.
    let raw = path.to_str().unwrap().to_string();
    let encoded = raw.replace('/', "%2F");
    s.write_all(&h2raw::grpc_headers(1, "/ProxyService/Proxy", &raw))
        .await
        .unwrap();
    s.write_all(&h2raw::grpc_headers(3, "/ProxyService/Proxy", &encoded))
        .await
        .unwrap();
    s.write_all(&h2raw::grpc_data(
        1,
        &Packet::dial_request("tcp", "127.0.0.1:1", 77).encode_to_vec(),
    ))
    .await
    .unwrap();
    s.write_all(&h2raw::grpc_data(
        3,
        &Packet::dial_request("tcp", "127.0.0.1:1", 78).encode_to_vec(),
    ))
    .await
    .unwrap();
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 2 {
        let (kind, _, stream, payload) =
            tokio::time::timeout(Duration::from_secs(10), h2raw::read_frame(&mut s))
                .await
                .expect("server went silent")
                .unwrap();
        // RST_STREAM(NO_ERROR) after a complete response is normal HTTP/2.
        assert!(
            kind != h2raw::RST_STREAM || payload == [0, 0, 0, 0],
            "stream {stream} was reset: {payload:?}"
        );
        assert_ne!(kind, h2raw::GOAWAY, "connection refused: {payload:?}");
        if kind == h2raw::DATA && payload.len() > 5 {
            let p = Packet::decode(&payload[5..]).unwrap();
            let want = if stream == 1 { 77 } else { 78 };
            assert!(
                matches!(p.payload, Some(Payload::DialResponse(ref r)) if r.random == want),
                "{p:?}"
            );
            answered.insert(stream);
        }
    }
}

#[tokio::test]
async fn a_dial_id_in_use_cannot_be_taken_over() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let mut agent = raw_agent(&pki, server.agent_addr, "quiet", "").await;
    server.handle.wait_for_agents(1).await;
    let (tx1, _rx1) = open_stream(&server.frontend).await;
    tx1.send(Packet::dial_request("tcp", "127.0.0.1:1", 4242))
        .await
        .unwrap();
    // The agent sees the first DIAL_REQ and keeps it pending.
    let first = agent.rx.message().await.unwrap().unwrap();
    assert!(matches!(first.payload, Some(Payload::DialRequest(ref d)) if d.random == 4242));
    let (tx2, mut rx2) = open_stream(&server.frontend).await;
    tx2.send(Packet::dial_request("tcp", "127.0.0.1:2", 4242))
        .await
        .unwrap();
    let p = rx2.message().await.unwrap().unwrap();
    assert!(
        matches!(p.payload, Some(Payload::DialResponse(ref r)) if r.error == "dial id is already in use by another pending dial"),
        "{p:?}"
    );
    assert_eq!(server.handle.pending_dials(), 1);
}

/// What the server answered a header block: a response status on the
/// stream, or a GOAWAY error code for the connection.
#[derive(Debug, PartialEq)]
enum Answer {
    Status(u16),
    GoAway(u32),
}

async fn answer_to(s: &mut tokio::net::UnixStream, input: &[u8]) -> Answer {
    s.write_all(input).await.unwrap();
    loop {
        let (kind, _, stream, payload) =
            tokio::time::timeout(Duration::from_secs(10), h2raw::read_frame(&mut *s))
                .await
                .expect("server went silent")
                .unwrap();
        match kind {
            h2raw::GOAWAY => {
                return Answer::GoAway(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
            }
            h2raw::HEADERS if stream == 1 => {
                return Answer::Status(h2raw::response_status(&payload).unwrap());
            }
            _ => {}
        }
    }
}

/// The HPACK bomb (issue 14): a header list over 64 KiB is refused with 431
/// on its stream, one far beyond it ends the connection with GOAWAY
/// ENHANCE_YOUR_CALM (0xb), as h2 does on the TLS frontend, with or without
/// an `:authority` that must be replaced; the server serves everyone else.
#[tokio::test]
async fn header_bombs_on_the_unix_socket_get_http2_errors() {
    let stack = Stack::start(ServerOpts::default()).await;
    let path = stack.server.uds.clone().unwrap();
    for authority in ["localhost", "/tmp/konnectivity.sock"] {
        for (refs, want) in [(20, Answer::Status(431)), (30_000, Answer::GoAway(0xb))] {
            let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
            h2raw::start(&mut s).await.unwrap();
            let got = answer_to(&mut s, &h2raw::header_bomb(1, authority, refs)).await;
            assert_eq!(got, want, "{refs} references, authority {authority}");
        }
    }
    still_serves(&stack).await;
}

/// A client that goes away while its upload is held back (the destination
/// stopped reading, so the server stopped reading the client, whose end of
/// stream now sits behind unread bytes) is noticed on the Unix socket: the
/// tunnel ends and the agent closes the destination, instead of both being
/// held, with their windows, until the agent's connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_behind_a_held_back_upload_ends_its_tunnel() {
    let stack = Stack::start(ServerOpts {
        mode: proxy_server::Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = tokio::spawn(async move { l.accept().await.unwrap().0 });
    let r = http_connect(&stack.server.frontend, &addr.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let mut client = r.stream;
    // Not read until the tunnel has ended.
    let mut dest = accepted.await.unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut sent = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_millis(500), client.write_all(&chunk)).await {
            Ok(r) => r.unwrap(),
            Err(_) => break,
        }
        sent += chunk.len();
        assert!(sent < 1 << 30, "the upload was never held back");
    }
    assert_eq!(stack.server.handle.established(), 1);
    drop(client);
    integration_tests::eventually("the tunnel ended", Duration::from_secs(15), || async {
        stack.server.handle.established() == 0
    })
    .await;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), dest.read_to_end(&mut got))
        .await
        .expect("the agent did not close the destination")
        .unwrap();
    assert!(got.len() <= sent + chunk.len());
    // The agent's other tunnels are served.
    let echo = dest::echo().await;
    let mut r = http_connect(&stack.server.frontend, &echo.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.head);
    r.stream.write_all(b"alive").await.unwrap();
    let mut back = [0u8; 5];
    r.stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"alive");
}
