//! Entry points for the fuzz targets (server/fuzz) and the corpus replay in
//! the normal tests. Each takes arbitrary bytes and must never panic; the
//! packet state machine also checks that nothing is left behind.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use konnectivity_proto::header::AgentIdentifiers;
use konnectivity_proto::ids::AgentId;
use konnectivity_proto::{Packet, PacketExt};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

use crate::backend::{AgentLinks, Backend, Backends, Strategy};
use crate::core::{Core, CoreConfig};
use crate::metrics::Metrics;
use crate::tunnel::{FrontendQueue, Tunnel, TunnelState};

/// The HTTP CONNECT head parser.
pub fn connect_head(data: &[u8]) {
    let _ = crate::frontend::connect_head::parse_head(data);
}

/// The W3C `traceparent` parser (HTTP CONNECT header, gRPC metadata).
pub fn traceparent(data: &[u8]) {
    if let Some(t) = crate::traceparent::TraceParent::parse(data) {
        assert_eq!(t.trace_id_hex().len(), 32);
    }
}

/// The Unix-socket gRPC frontend's frame walker and HPACK decoder: feeds
/// `data` through [`crate::frontend::FixAuthority`] in reads of varying
/// size and checks it hands on no more than it could have been given.
pub fn fix_authority(data: &[u8]) {
    // The first byte picks the read size, the rest is the client's stream.
    let Some((&size, input)) = data.split_first() else {
        return;
    };
    let mut r = crate::frontend::FixAuthority::new(std::io::Cursor::new(input.to_vec()));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = vec![0u8; usize::from(size) + 1];
    let mut out = 0usize;
    loop {
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(&mut r).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => out += rb.filled().len(),
            Poll::Ready(Err(_)) => break,
            Poll::Pending => unreachable!("a Cursor is always ready"),
        }
        // Replacing an authority adds at most a few bytes per header block
        // (one per HEADERS frame of at least 9 bytes) and re-framing adds a
        // frame head per 16 KiB.
        assert!(
            out <= 2 * input.len() + 64,
            "{out} bytes out of {}",
            input.len()
        );
    }
}

/// The HPACK decoder alone, on one connection's worth of blocks.
pub fn hpack(data: &[u8]) {
    let mut d = crate::frontend::hpack::Decoder::new(crate::limits::HEADER_TABLE_SIZE);
    for block in data.split(|&b| b == 0xfe) {
        let mut list = 0usize;
        if d.decode(block, |f| list += f.list_size()).is_err() {
            return;
        }
    }
}

/// Reads a fuzz input as a script of small operations.
struct Script<'a> {
    data: &'a [u8],
}

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }
}

const FRONTENDS: usize = 4;
const AGENTS: usize = 2;

struct Agent {
    backend: Arc<Backend<Tunnel>>,
    data: mpsc::Receiver<Packet>,
    control: konnectivity_proto::control::ControlRx,
    /// Dial ids the agent has been asked for, to answer some of them.
    dials: Vec<i64>,
}

fn agent(core: &Core, i: usize) -> Agent {
    let (tx, data) = mpsc::channel(core.cfg.agent_queue);
    let (ctl, control) = konnectivity_proto::control::channel();
    // Agent 0 speaks our flow-control extension, agent 1 is upstream's.
    let flow = core.flow.link((i == 0).then_some(link::flow::MIN_WINDOW));
    // Each agent serves one destination host, so dials pick deterministically.
    let backend = Backend::new(
        AgentId(format!("agent-{i}")),
        AgentIdentifiers::parse_lenient(&format!("ipv4=10.0.0.{}", i + 1)).unwrap_or_default(),
        AgentLinks {
            data: tx,
            control: ctl,
            flow,
            legacy: core
                .flow
                .legacy_link(core.cfg.frontend_queue, core.cfg.stall_timeout),
        },
        core.metrics.clone(),
        core.backends.changes(),
    );
    core.backends.add(backend.clone());
    LIVE.with(|l| l.borrow_mut().backends.push(Arc::downgrade(&backend)));
    Agent {
        backend,
        data,
        control,
        dials: Vec::new(),
    }
}

/// Every agent stream and tunnel an input made, to check that each is
/// freed once its agent and frontend are gone (whichever way they went).
#[derive(Default)]
struct Live {
    backends: Vec<std::sync::Weak<Backend<Tunnel>>>,
    tunnels: Vec<std::sync::Weak<Tunnel>>,
}

thread_local! {
    static LIVE: std::cell::RefCell<Live> = std::cell::RefCell::default();
}

fn frontend() -> (Arc<Tunnel>, FrontendQueue) {
    let (t, q) = Tunnel::tracked(None);
    LIVE.with(|l| l.borrow_mut().tunnels.push(Arc::downgrade(&t)));
    (t, q)
}

fn drain_agent(a: &mut Agent) {
    while let Ok(p) = a.data.try_recv() {
        a.backend.taken(&p);
        if let Some(konnectivity_proto::packet::Payload::DialRequest(r)) = &p.payload {
            a.dials.push(r.random);
        }
    }
    while a.control.try_recv().is_ok() {}
}

/// Drives the server's packet state machine (frontend and agent packets,
/// frontends and agents going away, dial deadlines) from `data`, then ends
/// every frontend and checks that no pending dial or connection is left
/// and that every established tunnel was in its agent stream's table.
pub fn packets(data: &[u8]) {
    thread_local! {
        // One runtime and one registry for all inputs: building them is most
        // of an input's cost. Every input's tasks end before it returns.
        static SHARED: Option<(tokio::runtime::Runtime, Arc<Metrics>)> =
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .ok()
                .map(|rt| (rt, Arc::new(Metrics::new())));
    }
    SHARED.with(|shared| {
        let Some((rt, metrics)) = shared else {
            return;
        };
        rt.block_on(async {
            let outcome =
                tokio::time::timeout(Duration::from_secs(24 * 3600), run(data, metrics.clone()))
                    .await;
            assert!(outcome.is_ok(), "the state machine hung");
        });
    });
}

/// A core with queues and bounds small enough for short inputs to reach
/// them (the fuzzer's, and unit tests').
pub(crate) fn small_config() -> CoreConfig {
    CoreConfig {
        dial_timeout: Duration::from_secs(10),
        stall_timeout: Duration::from_secs(10),
        frontend_queue: 2,
        agent_queue: 2,
        flow: link::flow::FlowSettings::default(),
        max_pending_per_agent: 6,
        max_pending_per_destination: 3,
        resend_dials: true,
    }
}

async fn run(data: &[u8], metrics: Arc<Metrics>) {
    LIVE.take();
    let core = Arc::new(Core::new(
        Backends::new(vec![Strategy::DestHost], metrics.clone()),
        metrics,
        small_config(),
    ));
    let mut agents: Vec<Agent> = (0..AGENTS).map(|i| agent(&core, i)).collect();
    let mut fronts: Vec<(Arc<Tunnel>, FrontendQueue)> =
        (0..FRONTENDS).map(|_| frontend()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    let mut s = Script { data };
    while let Some(op) = s.byte() {
        let f = usize::from(op >> 4) % FRONTENDS;
        let a = usize::from(op >> 4) % AGENTS;
        let arg = s.byte().unwrap_or(0);
        // Small id spaces, so operations meet each other's ids.
        let id = i64::from(arg % 4);
        let (tunnel, _) = &fronts[f];
        let (core2, t2) = (core.clone(), tunnel.clone());
        match op & 0x0f {
            0 => {
                let host = usize::from(arg >> 2) % AGENTS + 1;
                let pkt = Packet::dial_request("tcp", &format!("10.0.0.{host}:443"), id + 1);
                tasks.spawn(async move {
                    let _ = crate::frontend::grpc::handle(&core2, &t2, pkt).await;
                });
            }
            1 => {
                let len = usize::from(arg) * 64;
                let pkt = Packet::data_copy(id, &vec![0u8; len]);
                tasks.spawn(async move {
                    let _ = crate::frontend::grpc::handle(&core2, &t2, pkt).await;
                });
            }
            2 => {
                tasks.spawn(async move {
                    let _ =
                        crate::frontend::grpc::handle(&core2, &t2, Packet::close_request(id)).await;
                });
            }
            3 => {
                tasks.spawn(async move {
                    let _ = crate::frontend::grpc::handle(&core2, &t2, Packet::close_dial(id + 1))
                        .await;
                });
            }
            4 => {
                tasks.spawn(async move { core2.frontend_gone(&t2).await });
                fronts[f] = frontend();
            }
            5 => {
                drain_agent(&mut agents[a]);
                let random = agents[a]
                    .dials
                    .get(usize::from(arg) % agents[a].dials.len().max(1))
                    .copied()
                    .unwrap_or(id + 1);
                let error = if arg & 0x80 != 0 {
                    "connection refused"
                } else {
                    ""
                };
                let connect = i64::from((arg >> 2) % 4) + 1;
                let pkt = Packet::dial_response(random, connect, error.into());
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_packet(&b, pkt).await });
            }
            6 => {
                let pkt = Packet::data_copy(id + 1, &vec![0u8; usize::from(arg) * 64]);
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_packet(&b, pkt).await });
            }
            7 => {
                let pkt = Packet::close_response(id + 1, String::new());
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_packet(&b, pkt).await });
            }
            8 => {
                let pkt = Packet::window_update(id + 1, i64::from(arg) << (arg % 40));
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_packet(&b, pkt).await });
            }
            9 => {
                let pkt = if arg & 1 == 0 {
                    Packet::drain()
                } else {
                    Packet::close_dial(id + 1)
                };
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_packet(&b, pkt).await });
            }
            10 => {
                let b = agents[a].backend.clone();
                tasks.spawn(async move { core2.agent_gone(&b).await });
                agents[a] = agent(&core, a);
            }
            11 => {
                let (t, q) = &mut fronts[f];
                while let Some(p) = q.rx.try_recv() {
                    if let Some(konnectivity_proto::packet::Payload::Data(d)) = &p.payload {
                        t.consumed(d.data.len());
                    }
                }
            }
            12 => drain_agent(&mut agents[a]),
            13 => {
                tokio::time::advance(Duration::from_secs(u64::from(arg % 16))).await;
                if let Some(deadline) = Core::dial_deadline(tunnel)
                    && tokio::time::Instant::now() >= deadline
                {
                    tasks.spawn(async move {
                        let _ = core2.expire_dial(&t2).await;
                    });
                }
            }
            _ => tokio::task::yield_now().await,
        }
        // Let spawned work run, as it would between packets.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        // A retired agent stream ends, as its serve loop makes it.
        for (i, ag) in agents.iter_mut().enumerate() {
            if ag.backend.is_retired() {
                let (core2, b) = (core.clone(), ag.backend.clone());
                tasks.spawn(async move { core2.agent_gone(&b).await });
                *ag = agent(&core, i);
            }
        }
    }
    // Every established tunnel must be in its agent stream's table: a tunnel
    // missing there could never be closed by its agent.
    for (t, _) in &fronts {
        if let TunnelState::Established { backend, connect } = t.state()
            && !backend.is_retired()
        {
            let held = backend.conn(connect);
            assert!(
                held.is_some_and(|h| Arc::ptr_eq(&h, t)),
                "an established tunnel is not in its agent stream's table"
            );
        }
    }
    // Every frontend goes away; agents keep reading so nothing waits on them.
    for (t, _) in &fronts {
        let (core2, t2) = (core.clone(), t.clone());
        tasks.spawn(async move { core2.frontend_gone(&t2).await });
    }
    loop {
        for a in agents.iter_mut() {
            drain_agent(a);
        }
        for (_, q) in fronts.iter_mut() {
            while q.rx.try_recv().is_some() {}
        }
        if let Ok(None) = tokio::time::timeout(Duration::from_millis(100), tasks.join_next()).await
        {
            break;
        }
    }
    assert_eq!(core.pending_count(), 0, "pending dials left behind");
    assert_eq!(core.established_count(), 0, "connections left behind");
    // The agents go too; then nothing may keep an agent stream or a tunnel
    // alive (a reference cycle between them would).
    for a in &agents {
        core.agent_gone(&a.backend).await;
    }
    drop((agents, fronts));
    let live = LIVE.take();
    let backends = live
        .backends
        .iter()
        .filter(|b| b.strong_count() > 0)
        .count();
    let tunnels = live.tunnels.iter().filter(|t| t.strong_count() > 0).count();
    assert_eq!(
        (backends, tunnels),
        (0, 0),
        "agent streams and tunnels still alive after their agents and frontends left"
    );
}
