//! Entry point for the fuzz target (agent/fuzz) and the corpus replay in the
//! normal tests: drives one session's packet handling from arbitrary bytes.
//! Destinations are in-memory pipes behind the same address checks and
//! policy as TCP (see `destination.rs`): nothing leaves the process, and an
//! execution is not spent in the kernel's TCP handshake.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use konnectivity_proto::ids::ServerId;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use crate::dial::destination::Dialer;
use crate::metrics::Metrics;
use crate::session::{Links, Session, SessionConfig};

/// Small, so a destination that stops reading fills it within a few packets
/// and the session's backpressure paths run.
const PIPE_BYTES: usize = 16 * 1024;

/// Destinations shared by every input: an echo, one that speaks and
/// closes, one that never reads, and one that refuses.
struct Dests {
    echo: SocketAddr,
    closer: SocketAddr,
    sink: SocketAddr,
    refused: SocketAddr,
}

const DESTS: Dests = Dests {
    echo: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1),
    closer: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 2),
    sink: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3),
    refused: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4),
};

/// Connects to one of [`DESTS`]; the far end runs on the current runtime.
fn connect(addr: SocketAddr, held: &Mutex<Vec<DuplexStream>>) -> io::Result<DuplexStream> {
    let (near, mut far) = tokio::io::duplex(PIPE_BYTES);
    if addr == DESTS.echo {
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(&mut far);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
    } else if addr == DESTS.closer {
        tokio::spawn(async move {
            let _ = far.write_all(b"bye").await;
        });
    } else if addr == DESTS.sink {
        let mut held = held.lock();
        held.push(far);
        if held.len() > 64 {
            held.remove(0);
        }
    } else {
        return Err(io::Error::from_raw_os_error(libc::ECONNREFUSED));
    }
    Ok(near)
}

/// Runs one input; panics if the session leaves a connection or a dial
/// behind once its stream is over.
pub fn packets(data: &[u8]) {
    thread_local! {
        static SHARED: Option<(tokio::runtime::Runtime, Arc<Metrics>)> = {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            Some((rt, Arc::new(Metrics::new())))
        };
    }
    SHARED.with(|shared| {
        let Some((rt, metrics)) = shared else {
            return;
        };
        rt.block_on(async {
            let run = run(data, metrics.clone());
            assert!(
                tokio::time::timeout(Duration::from_secs(30), run)
                    .await
                    .is_ok(),
                "the session hung"
            );
        });
    });
}

async fn run(data: &[u8], metrics: Arc<Metrics>) {
    let d = &DESTS;
    // Dropped with the input: no destination outlives it.
    let sinks = Arc::new(Mutex::new(Vec::new()));
    let dialer = Dialer::Memory(Arc::new(move |a| connect(a, &sinks)));
    let (out_tx, mut out) = mpsc::channel(4);
    let (ctl_tx, mut ctl) = konnectivity_proto::control::channel();
    let drain = Drain::new();
    let flow = data.first().is_some_and(|b| b & 1 == 1);
    let session = Session::with_links(
        ServerId("fuzz".into()),
        Links {
            out: out_tx,
            control: ctl_tx,
            flow_max: flow.then_some(link::flow::MIN_WINDOW),
            debug: Default::default(),
        },
        metrics,
        SessionConfig {
            // Short, so an input that stalls costs milliseconds, not the
            // run's time: every path is the same at any length.
            dial_timeout: Duration::from_millis(200),
            conn_queue: 2,
            stall_timeout: Duration::from_millis(1),
            // 127.0.0.2 is outside: dials there are refused before connecting.
            policy: Arc::new(
                crate::dial::policy::DestinationPolicy::parse("127.0.0.1/32").unwrap_or_default(),
            ),
            flow: link::flow::FlowPool::new(link::flow::FlowSettings::default()),
            dialer,
            // Spans are made (with the DIAL_REQ's traceparent as parent)
            // but never exported: no export task runs.
            otlp: Some(Arc::new(daemon::otlp::Exporter::new(
                daemon::otlp::Endpoint::parse("http://127.0.0.1:9")
                    .unwrap_or_else(|e| panic!("{e}")),
                "proxy-agent",
            ))),
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
                let mut pkt = Packet::dial_request(protocol, &address, i64::from(arg >> 4));
                if op & 0x08 != 0 {
                    // A traceparent (our server's extension): a length byte
                    // (times 2, so the bound is crossed), then its bytes.
                    let n = usize::from(ops.next().unwrap_or(0)) * 2;
                    let text: Vec<u8> = ops.by_ref().take(n).collect();
                    pkt.set_traceparent(String::from_utf8_lossy(&text).into_owned());
                }
                Some(pkt)
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
