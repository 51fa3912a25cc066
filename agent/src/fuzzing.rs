//! Entry point for the fuzz target (agent/fuzz) and the corpus replay in the
//! normal tests: drives one session's packet handling from arbitrary bytes.
//! Dials only ever reach loopback listeners of its own or names under
//! `.invalid`, which are never looked up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use konnectivity_proto::ids::ServerId;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::session::{Links, Session, SessionConfig};

/// Loopback destinations shared by every input: an echo, one that speaks
/// and closes, one that never reads, and a port that refuses.
struct Dests {
    echo: SocketAddr,
    closer: SocketAddr,
    sink: SocketAddr,
    refused: SocketAddr,
}

async fn dests() -> Option<Dests> {
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (echo, closer, sink) = (bind().await.ok()?, bind().await.ok()?, bind().await.ok()?);
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
        l.local_addr().ok()?
    };
    let addrs = Dests {
        echo: echo.local_addr().ok()?,
        closer: closer.local_addr().ok()?,
        sink: sink.local_addr().ok()?,
        refused,
    };
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = closer.accept().await {
            let _ = s.write_all(b"bye").await;
        }
    });
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = sink.accept().await {
            held.push(s);
            held.truncate(64);
        }
    });
    Some(addrs)
}

/// Runs one input; panics if the session leaves a connection or a dial
/// behind once its stream is over.
pub fn packets(data: &[u8]) {
    thread_local! {
        static SHARED: Option<(tokio::runtime::Runtime, Arc<Metrics>, Dests)> = {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            let d = rt.block_on(dests())?;
            Some((rt, Arc::new(Metrics::new()), d))
        };
    }
    SHARED.with(|shared| {
        let Some((rt, metrics, d)) = shared else {
            return;
        };
        rt.block_on(async {
            let run = run(data, metrics.clone(), d);
            assert!(
                tokio::time::timeout(Duration::from_secs(30), run)
                    .await
                    .is_ok(),
                "the session hung"
            );
        });
    });
}

async fn run(data: &[u8], metrics: Arc<Metrics>, d: &Dests) {
    let (out_tx, mut out) = mpsc::channel(4);
    let (ctl_tx, mut ctl) = mpsc::unbounded_channel();
    let drain = Drain::new();
    let flow = data.first().is_some_and(|b| b & 1 == 1);
    let session = Session::with_links(
        ServerId("fuzz".into()),
        Links {
            out: out_tx,
            control: ctl_tx,
            flow_max: flow.then_some(konnectivity_proto::flow::MIN_WINDOW),
            debug: Default::default(),
        },
        metrics,
        SessionConfig {
            // Short, so an input that stalls costs milliseconds, not the
            // run's time: every path is the same at any length.
            dial_timeout: Duration::from_millis(200),
            conn_queue: 2,
            stall_timeout: Duration::from_millis(5),
            // 127.0.0.2 is outside: dials there are refused before connecting.
            policy: Arc::new(
                crate::policy::DestinationPolicy::parse("127.0.0.1/32").unwrap_or_default(),
            ),
            flow: konnectivity_proto::flow::FlowPool::new(
                konnectivity_proto::flow::FlowSettings::default(),
            ),
        },
        drain.clone(),
    );
    let mut ops = data.iter().skip(1).copied();
    while let Some(op) = ops.next() {
        let arg = ops.next().unwrap_or(0);
        let id = i64::from(arg % 4) + 1;
        let pkt = match op % 8 {
            0 => {
                let address = match arg % 7 {
                    0 | 1 => d.echo.to_string(),
                    6 => "127.0.0.2:80".to_string(),
                    2 => d.closer.to_string(),
                    3 => d.sink.to_string(),
                    4 => d.refused.to_string(),
                    _ => "no-such-host.invalid:80".to_string(),
                };
                let protocol = if arg & 0x80 != 0 { "udp" } else { "tcp" };
                Some(Packet::dial_request(
                    protocol,
                    &address,
                    i64::from(arg >> 4),
                ))
            }
            1 => Some(Packet::data_copy(id, &vec![b'd'; usize::from(arg) * 97])),
            2 => Some(Packet::close_request(id)),
            3 => Some(Packet::window_update(id, i64::from(arg) << (arg % 48))),
            4 => Some(Packet::close_dial(i64::from(arg >> 4))),
            5 => {
                // The server reads what the agent sent (a full stream waits).
                while let Ok(p) = out.try_recv() {
                    if let Some(Payload::Data(_)) = p.payload {
                        continue;
                    }
                }
                while ctl.try_recv().is_ok() {}
                None
            }
            6 => {
                for _ in 0..usize::from(arg % 8) + 1 {
                    tokio::task::yield_now().await;
                }
                None
            }
            _ => Some(match arg % 3 {
                0 => Packet::dial_response(id, id, String::new()),
                1 => Packet::close_response(id, "x".into()),
                _ => Packet::drain(),
            }),
        };
        if let Some(pkt) = pkt {
            // The stream reader handles one packet at a time, while the
            // server keeps reading what the agent sends.
            let handled = session.handle(pkt);
            tokio::pin!(handled);
            loop {
                tokio::select! {
                    _ = &mut handled => break,
                    p = out.recv() => { let _ = p; }
                    p = ctl.recv() => { let _ = p; }
                }
            }
        }
    }
    // The stream ends: every connection and dial must end with it.
    session.end();
    loop {
        tokio::select! {
            _ = drain.wait_tasks_at_most(0) => break,
            p = out.recv() => { let _ = p; }
            p = ctl.recv() => { let _ = p; }
        }
    }
    assert_eq!(session.connections(), 0, "connections left behind");
    assert_eq!(session.pending_dials(), 0, "dials left behind");
}
