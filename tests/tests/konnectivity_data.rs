//! Bytes through server and agent, both frontend modes, both transports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::client::{grpc_dial, http_connect, http_connect_on};
use integration_tests::dest;
use integration_tests::konnectivity::{ServerOpts, Stack};
use proxy_server::Mode;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn opts(mode: Mode, tcp: bool) -> ServerOpts {
    ServerOpts {
        mode,
        tcp_frontend: tcp,
        ..Default::default()
    }
}

async fn grpc_echo(tcp: bool) {
    let stack = Stack::start(opts(Mode::Grpc, tcp)).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    assert!(t.connect_id > 0);
    t.write(b"hello through the tunnel").await;
    assert_eq!(t.read_exact(24).await, b"hello through the tunnel");
    assert_eq!(t.close().await, Some(String::new()));
    assert_eq!(stack.server.handle.established(), 0);
}

#[tokio::test]
async fn grpc_echo_over_unix_socket() {
    grpc_echo(false).await;
}

#[tokio::test]
async fn grpc_echo_over_mtls_tcp() {
    grpc_echo(true).await;
}

async fn connect_echo(tcp: bool) {
    let stack = Stack::start(opts(Mode::HttpConnect, tcp)).await;
    let echo = dest::echo().await;
    let mut r = http_connect(&stack.server.frontend, &echo.to_string()).await;
    // Exactly upstream's line, no headers.
    assert_eq!(r.head, "HTTP/1.1 200 Connection Established\r\n\r\n");
    r.stream.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    r.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn http_connect_echo_over_unix_socket() {
    connect_echo(false).await;
}

#[tokio::test]
async fn http_connect_echo_over_mtls_tcp() {
    connect_echo(true).await;
}

#[tokio::test]
async fn http_connect_keeps_bytes_sent_before_the_200() {
    let stack = Stack::start(opts(Mode::HttpConnect, false)).await;
    let echo = dest::echo().await;
    let s = stack.server.frontend.connect().await.unwrap();
    let mut r = http_connect_on(s, &echo.to_string(), b"early bytes").await;
    assert_eq!(r.status, 200);
    let mut buf = [0u8; 11];
    r.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"early bytes");
}

#[tokio::test]
async fn server_speaks_first_gets_200_before_data() {
    let stack = Stack::start(opts(Mode::HttpConnect, false)).await;
    let greeter = dest::greeter(b"SSH-2.0-hello\r\n").await;
    let mut r = http_connect(&stack.server.frontend, &greeter.to_string()).await;
    assert_eq!(r.head, "HTTP/1.1 200 Connection Established\r\n\r\n");
    let mut buf = [0u8; 15];
    r.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"SSH-2.0-hello\r\n");
}

const HUNDRED_MIB: usize = 100 << 20;

fn pattern_digest(len: usize) -> Vec<u8> {
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let mut h = Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        h.update(&chunk[..n]);
        left -= n;
    }
    h.finalize().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_download_checksum_http_connect() {
    let stack = Stack::start(opts(Mode::HttpConnect, false)).await;
    let src = dest::source(HUNDRED_MIB).await;
    let mut r = http_connect(&stack.server.frontend, &src.to_string()).await;
    assert_eq!(r.status, 200);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0;
    loop {
        let n = r.stream.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n;
    }
    assert_eq!(total, HUNDRED_MIB);
    assert_eq!(h.finalize().to_vec(), pattern_digest(HUNDRED_MIB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_upload_and_back_grpc() {
    let stack = Stack::start(opts(Mode::Grpc, false)).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let tx = t.tx.clone();
    let id = t.connect_id;
    let writer = tokio::spawn(async move {
        let mut left = HUNDRED_MIB;
        while left > 0 {
            let n = left.min(chunk.len());
            tx.send(konnectivity_proto::Packet::data_copy(id, &chunk[..n]))
                .await
                .unwrap();
            left -= n;
        }
    });
    let mut h = Sha256::new();
    let mut total = 0;
    while total < HUNDRED_MIB {
        let d = t.read().await.expect("tunnel closed early");
        total += d.len();
        h.update(&d);
    }
    writer.await.unwrap();
    assert_eq!(total, HUNDRED_MIB);
    assert_eq!(h.finalize().to_vec(), pattern_digest(HUNDRED_MIB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_connections() {
    let stack = Stack::start(opts(Mode::Grpc, false)).await;
    let echo = dest::echo().await;
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let fe = stack.server.frontend.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = grpc_dial(&fe, &echo.to_string()).await.unwrap();
            let msg = format!("connection {i}").into_bytes();
            t.write(&msg).await;
            assert_eq!(t.read_exact(msg.len()).await, msg);
            t.connect_id
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    assert_eq!(ids.len(), 200, "every connection gets its own connectID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_http_connect() {
    let stack = Stack::start(opts(Mode::HttpConnect, false)).await;
    let echo = dest::echo().await;
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let fe = stack.server.frontend.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = http_connect(&fe, &echo.to_string()).await;
            assert_eq!(r.status, 200);
            let msg = format!("connection {i}").into_bytes();
            assert_eq!(dest::roundtrip(&mut r.stream, &msg).await, msg);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
