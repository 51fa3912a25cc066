//! A quick in-process probe of the Konnectivity data path, for profiling
//! (`perf record`): one server and one agent on loopback, then a download and
//! an upload of N MiB through gRPC and HTTP CONNECT. Not a benchmark against
//! anything — benches/ is.
//!
//! cargo run --release -p integration-tests --example throughput -- 1024
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use integration_tests::client::{grpc_dial, http_connect};
use integration_tests::dest;
use integration_tests::konnectivity::{ServerOpts, Stack};
use proxy_server::Mode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(512);
    let bytes = mib << 20;
    let flow = std::env::var("FLOW").map(|v| v != "0").unwrap_or(true);

    let stack = Stack::start(ServerOpts {
        flow_control: flow,
        ..Default::default()
    })
    .await;
    let src = dest::source(bytes).await;
    let t0 = Instant::now();
    let mut t = grpc_dial(&stack.server.frontend, &src.to_string())
        .await
        .unwrap();
    assert_eq!(t.read_to_end_len().await, bytes);
    report("gRPC download", bytes, t0);
    let m = stack.server.handle.metrics();
    let pkts = integration_tests::konnectivity::metric(
        &m,
        "konnectivity_network_proxy_server_stream_packets_total{packet_type=\"DATA\",segment=\"from_agent\"}",
    );
    println!(
        "{:30} {:8.1} KiB per DATA packet from the agent",
        "",
        bytes as f64 / 1024.0 / pkts.max(1.0)
    );

    let sink = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &sink.to_string())
        .await
        .unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let t0 = Instant::now();
    let tx = t.tx.clone();
    let id = t.connect_id;
    let w = tokio::spawn(async move {
        for _ in 0..(bytes / chunk.len()) {
            tx.send(konnectivity_proto::Packet::data_copy(id, &chunk))
                .await
                .unwrap();
        }
    });
    let mut got = 0;
    while got < bytes {
        got += t.read().await.unwrap().len();
    }
    w.await.unwrap();
    report("gRPC echo (up+down)", bytes, t0);
    drop(stack);

    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        flow_control: flow,
        ..Default::default()
    })
    .await;
    let t0 = Instant::now();
    let mut r = http_connect(&stack.server.frontend, &src.to_string()).await;
    let got = tokio::io::copy(&mut r.stream, &mut tokio::io::sink())
        .await
        .unwrap();
    assert_eq!(got, bytes as u64);
    report("HTTP-CONNECT download", bytes, t0);

    let r = http_connect(&stack.server.frontend, &sink.to_string()).await;
    let (mut rd, mut wr) = tokio::io::split(r.stream);
    let t0 = Instant::now();
    let w = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        for _ in 0..(bytes / chunk.len()) {
            wr.write_all(&chunk).await.unwrap();
        }
        wr
    });
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0;
    while got < bytes {
        got += rd.read(&mut buf).await.unwrap();
    }
    let _ = w.await.unwrap();
    report("HTTP-CONNECT echo (up+down)", bytes, t0);
}

fn report(what: &str, bytes: usize, t0: Instant) {
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{what:30} {:8.1} MiB/s",
        (bytes as f64 / (1 << 20) as f64) / secs
    );
}
