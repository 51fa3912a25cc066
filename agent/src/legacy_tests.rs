//! A server without flow control (upstream's) sending large packets to
//! destinations that stopped reading: what the agent holds stays within the
//! stream's budget, the stream's reader stops at it, and the stalled
//! connections are closed after the stall limit (issue 33, the agent's side).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use konnectivity_proto::ids::ServerId;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use link::flow::{FlowPool, FlowSettings};
use parking_lot::Mutex;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use crate::dial::destination::Dialer;
use crate::metrics::Metrics;
use crate::session::{Links, Session, SessionConfig};

const MIB: i64 = 1 << 20;
const STREAM_BUDGET: i64 = 8 * MIB;
const PROCESS_BUDGET: i64 = 16 * MIB;
const CONNS: i64 = 16;
const STALL: Duration = Duration::from_millis(300);

#[tokio::test]
async fn large_packets_to_stalled_destinations_are_held_to_the_stream_budget() {
    // Destinations that accept and never read (their far ends are kept).
    let held: Arc<Mutex<Vec<DuplexStream>>> = Arc::default();
    let sinks = held.clone();
    let dialer = Dialer::Memory(Arc::new(move |_: SocketAddr| {
        let (near, far) = tokio::io::duplex(16 << 10);
        sinks.lock().push(far);
        Ok(near)
    }));
    let flow = FlowPool::new(FlowSettings {
        link_budget: STREAM_BUDGET,
        process_budget: PROCESS_BUDGET,
        ..FlowSettings::default()
    });
    let (out_tx, mut out) = mpsc::channel(1024);
    let (ctl_tx, _ctl) = konnectivity_proto::control::channel();
    let drain = Drain::new();
    let session = Session::with_links(
        ServerId("legacy".into()),
        Links {
            out: out_tx,
            control: ctl_tx,
            // The server did not answer the flow-control offer.
            flow_max: None,
            debug: Default::default(),
        },
        Arc::new(Metrics::new()),
        SessionConfig {
            dial_timeout: Duration::from_secs(5),
            conn_queue: 150,
            stall_timeout: STALL,
            policy: Arc::new(
                crate::dial::policy::DestinationPolicy::parse("127.0.0.1/32").unwrap_or_default(),
            ),
            flow: flow.clone(),
            dialer,
            otlp: None,
        },
        drain.clone(),
    );
    for dial in 1..=CONNS {
        session
            .handle(Packet::dial_request("tcp", "127.0.0.1:1", dial))
            .await;
    }
    let mut ids = Vec::new();
    while ids.len() < CONNS as usize {
        match out.recv().await.and_then(|p| p.payload) {
            Some(Payload::DialResponse(r)) if r.error.is_empty() => ids.push(r.connect_id),
            other => panic!("unexpected {other:?}"),
        }
    }
    // What the server is told about connections it closes.
    let closed = tokio::spawn(async move {
        let mut reasons = Vec::new();
        while let Some(p) = out.recv().await {
            if let Some(Payload::CloseResponse(c)) = p.payload {
                reasons.push(c.error);
            }
        }
        reasons
    });
    // What the agent accounts, sampled while the stream's reader works.
    let watch = flow.clone();
    let sampler = tokio::spawn(async move {
        let mut most = (0, 0);
        loop {
            most.0 = most.0.max(watch.stats.parked());
            most.1 = most.1.max(watch.budget.used());
            if most.0 > STREAM_BUDGET || most.1 > PROCESS_BUDGET {
                return most;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let data = Bytes::from(vec![b'x'; (4 << 20) - 64]);
    let started = tokio::time::Instant::now();
    for _round in 0..2 {
        for id in &ids {
            session.handle(Packet::data(*id, data.clone())).await;
            assert!(
                flow.stats.parked() <= STREAM_BUDGET,
                "{} bytes parked",
                flow.stats.parked()
            );
        }
    }
    // 128 MiB went to 16 connections that read nothing: the reader waited
    // at the budget for stalled connections to be closed.
    assert!(started.elapsed() >= STALL, "the reader never waited");
    assert!(
        !sampler.is_finished(),
        "past the budget: {:?}",
        sampler.await
    );
    sampler.abort();
    session.end();
    drain.wait_tasks_at_most(0).await;
    drop(session);
    let reasons = closed.await.unwrap_or_default();
    let stalled = reasons
        .iter()
        .filter(|r| r.contains("connection closed to protect the stream"))
        .count();
    assert!(stalled >= 2, "stalled connections closed: {reasons:?}");
    assert_eq!(flow.stats.parked(), 0, "everything given back");
    assert_eq!(flow.budget.used(), 0, "everything given back");
}
