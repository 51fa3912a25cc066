//! The packet state machine between frontends and agent streams: pending dials
//! by dial id, established connections per agent stream, and every close path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use konnectivity_proto::ids::{ConnectId, DialId};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt, PacketType};
use link::flow::{FlowPool, FlowSettings, RecvGate};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::backend::{Backend, Backends, SendError};
use crate::metrics::{DialFailure, Metrics, Segment, Service};
use crate::tunnel::{Tunnel, TunnelState};
use link::debug_connections::CloseReason;

/// Timing and sizing of the data path.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Deadline for handing DIAL_REQ to an agent and getting DIAL_RSP back.
    pub dial_timeout: Duration,
    /// How long a frontend may leave its queue full before only it is closed.
    pub stall_timeout: Duration,
    /// Packets queued per frontend.
    pub frontend_queue: usize,
    /// Packets queued per agent stream.
    pub agent_queue: usize,
    /// Per-connection flow control offered to agents that ask for it (when
    /// not enabled, every agent is treated as upstream's), and the budgets.
    pub flow: FlowSettings,
    /// `--max-pending-dials-per-agent`: unanswered dials one agent stream
    /// may hold; 0 for no bound.
    pub max_pending_per_agent: usize,
    /// `--max-pending-dials-per-destination`: unanswered dials one agent
    /// stream may hold to one address; 0 for no bound.
    pub max_pending_per_destination: usize,
    /// `--resend-unanswered-dials`: a dial its agent leaves unanswered goes
    /// to another agent once ([`Core::redial`]).
    pub resend_dials: bool,
}

struct Pending {
    tunnel: Arc<Tunnel>,
    backend: Arc<Backend<Tunnel>>,
    /// The address dialled (what the per-destination bound counts).
    address: Arc<str>,
    started: Instant,
    deadline: Instant,
    /// Admission of the agent's DATA, set up with the dial (its initial
    /// window goes out in the DIAL_REQ).
    recv: RecvGate,
    /// The DIAL_REQ, kept until the dial is answered so that it can be sent
    /// to another agent once if this one leaves or drains first; `None`
    /// once it has been.
    request: Option<Packet>,
    /// The stream the dial was first sent to, once it has been sent to
    /// another: a late answer from it is closed without a word.
    superseded: Option<u64>,
}

/// The pending dials, with how many each agent stream holds, in all and
/// per address (for the pending-dial bounds). Every change goes through
/// `insert`, `remove` and `update`, which keep the counts.
#[derive(Default)]
struct PendingSet {
    dials: HashMap<DialId, Pending>,
    per_agent: HashMap<u64, usize>,
    /// address -> agent stream id -> dials
    per_destination: HashMap<Arc<str>, HashMap<u64, usize>>,
}

impl PendingSet {
    fn len(&self) -> usize {
        self.dials.len()
    }

    fn get(&self, dial: &DialId) -> Option<&Pending> {
        self.dials.get(dial)
    }

    fn contains_key(&self, dial: &DialId) -> bool {
        self.dials.contains_key(dial)
    }

    fn iter(&self) -> impl Iterator<Item = (&DialId, &Pending)> {
        self.dials.iter()
    }

    fn insert(&mut self, dial: DialId, p: Pending) {
        self.count(p.backend.id, &p.address, true);
        if let Some(old) = self.dials.insert(dial, p) {
            self.count(old.backend.id, &old.address, false);
        }
    }

    fn remove(&mut self, dial: &DialId) -> Option<Pending> {
        let p = self.dials.remove(dial)?;
        self.count(p.backend.id, &p.address, false);
        Some(p)
    }

    /// Runs `f` on a pending dial, moving its counts if `f` gave it to
    /// another agent stream.
    fn update<R>(&mut self, dial: &DialId, f: impl FnOnce(&mut Pending) -> R) -> Option<R> {
        let p = self.dials.get_mut(dial)?;
        let before = p.backend.id;
        let r = f(p);
        let (after, address) = (p.backend.id, p.address.clone());
        if before != after {
            self.count(before, &address, false);
            self.count(after, &address, true);
        }
        Some(r)
    }

    fn count(&mut self, agent: u64, address: &Arc<str>, up: bool) {
        fn step(n: &mut usize, up: bool) -> bool {
            if up {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
            *n == 0
        }
        let n = self.per_agent.entry(agent).or_default();
        if step(n, up) {
            self.per_agent.remove(&agent);
        }
        let per = self.per_destination.entry(address.clone()).or_default();
        let n = per.entry(agent).or_default();
        if step(n, up) {
            per.remove(&agent);
            if per.is_empty() {
                self.per_destination.remove(address);
            }
        }
    }

    /// The bound `agent` has reached for a new dial to `address`, if any.
    fn full(&self, agent: u64, address: &str, cfg: &CoreConfig) -> Option<PendingBound> {
        let at = |n: usize, max: usize| max > 0 && n >= max;
        let to_dest = self
            .per_destination
            .get(address)
            .and_then(|m| m.get(&agent))
            .copied()
            .unwrap_or(0);
        if at(to_dest, cfg.max_pending_per_destination) {
            return Some(PendingBound::Destination(cfg.max_pending_per_destination));
        }
        let all = self.per_agent.get(&agent).copied().unwrap_or(0);
        at(all, cfg.max_pending_per_agent).then_some(PendingBound::Agent(cfg.max_pending_per_agent))
    }

    /// The agent streams that have reached a bound for a new dial to
    /// `address`.
    fn full_agents(&self, address: &str, cfg: &CoreConfig) -> Vec<u64> {
        let mut full: Vec<u64> = Vec::new();
        if cfg.max_pending_per_agent > 0 {
            full.extend(
                self.per_agent
                    .iter()
                    .filter(|(_, n)| **n >= cfg.max_pending_per_agent)
                    .map(|(id, _)| *id),
            );
        }
        if cfg.max_pending_per_destination > 0
            && let Some(m) = self.per_destination.get(address)
        {
            full.extend(
                m.iter()
                    .filter(|(_, n)| **n >= cfg.max_pending_per_destination)
                    .map(|(id, _)| *id),
            );
        }
        full
    }
}

/// Which pending-dial bound refused a dial, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingBound {
    Agent(usize),
    Destination(usize),
}

/// What became of a dial whose agent will not answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redial {
    /// Sent to another agent (or failed there, and its frontend told).
    Resent,
    /// No longer this agent's to answer: answered, cancelled, or already
    /// moved.
    Elsewhere,
    /// Not re-sent: sent once already, past its deadline, or no other agent
    /// serves its address. It is still pending on the agent.
    No,
}

pub struct Core {
    pub backends: Backends<Tunnel>,
    /// Live and recently closed tunnels, for `/debug/connections`.
    pub debug: link::debug_connections::Connections,
    /// `--otlp-traces-endpoint`: spans of dials go there.
    pub otlp: std::sync::OnceLock<Arc<crate::otlp::Exporter>>,
    pending: Mutex<PendingSet>,
    pub metrics: Arc<Metrics>,
    /// The process budget and totals of every agent stream's windows.
    pub flow: Arc<FlowPool>,
    pub cfg: CoreConfig,
}

/// Why a dial could not start; the frontend is told the `Display` text.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DialRefused {
    #[error("No agent available")]
    NoAgent,
    #[error("timed out waiting for backend dial")]
    TimedOut,
    #[error("agent stream closed before the dial request was sent")]
    AgentGone,
    #[error("only one dial is allowed per stream")]
    AlreadyDialed,
    #[error("DIAL_REQ without a dial request")]
    Malformed,
    #[error("dial id is already in use by another pending dial")]
    DuplicateDialId,
    /// Every agent serving the address holds as many unanswered dials as a
    /// pending-dial bound allows.
    #[error("{}", too_many_pending(agent, address, *bound))]
    TooManyPending {
        agent: String,
        address: String,
        bound: PendingBound,
    },
}

fn too_many_pending(agent: &str, address: &str, bound: PendingBound) -> String {
    match bound {
        PendingBound::Agent(n) => format!(
            "too many dials pending on agent {agent}: {n} unanswered (--max-pending-dials-per-agent)"
        ),
        PendingBound::Destination(n) => format!(
            "too many dials pending on agent {agent} to {address}: {n} unanswered (--max-pending-dials-per-destination)"
        ),
    }
}

/// Whether the frontend loop goes on after a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    End,
}

fn close_rsp(connect: i64, error: &str) -> Packet {
    Packet::close_response(connect, error.to_string())
}

/// Why a tunnel closed when its agent's stream ended.
pub const AGENT_LOST: &str = "connection to the proxy agent was lost";
/// Why a dial failed when its agent's stream ended before it was answered.
pub const AGENT_LOST_DIALING: &str = "agent stream closed before the dial completed";

impl Core {
    pub fn new(backends: Backends<Tunnel>, metrics: Arc<Metrics>, cfg: CoreConfig) -> Self {
        let flow = FlowPool::new(cfg.flow);
        metrics.watch_flow(flow.clone());
        let debug = link::debug_connections::Connections::new();
        let m = metrics.clone();
        debug.on_close(move |kind, reason, _| m.connection_closed(kind, reason));
        Core {
            backends,
            debug,
            otlp: std::sync::OnceLock::new(),
            pending: Mutex::new(PendingSet::default()),
            metrics,
            flow,
            cfg,
        }
    }

    /// With `--otlp-traces-endpoint`, gives `tunnel` its dial's span.
    pub fn start_trace(
        &self,
        tunnel: &Tunnel,
        frontend: &'static str,
        parent: Option<crate::traceparent::TraceParent>,
    ) {
        if let Some(e) = self.otlp.get() {
            tunnel.start_trace(e.clone(), crate::otlp::DialTrace::new(frontend, parent));
        }
    }

    pub fn pending_count(&self) -> usize {
        self.pending.lock().len()
    }

    pub fn established_count(&self) -> usize {
        self.backends
            .snapshot()
            .iter()
            .map(|b| b.conn_count())
            .sum()
    }

    fn add_pending(&self, dial: DialId, p: Pending) {
        let mut pending = self.pending.lock();
        pending.insert(dial, p);
        self.metrics.pending_dials.set(pending.len() as f64);
    }

    fn take_pending(&self, dial: DialId) -> Option<Pending> {
        let mut pending = self.pending.lock();
        let p = pending.remove(&dial);
        self.metrics.pending_dials.set(pending.len() as f64);
        p
    }

    /// Takes `tunnel`'s own pending dial: a dial id can be used again once
    /// its dial is over, by another frontend, whose dial must stay.
    fn take_pending_of(&self, dial: DialId, tunnel: &Tunnel) -> bool {
        let mut pending = self.pending.lock();
        let ours = pending
            .get(&dial)
            .is_some_and(|p| std::ptr::eq(Arc::as_ptr(&p.tunnel), tunnel));
        if ours {
            pending.remove(&dial);
            self.metrics.pending_dials.set(pending.len() as f64);
        }
        ours
    }

    /// Closes `tunnel` if it is still dialing `dial` (and not, say,
    /// established by an answer that came meanwhile).
    fn close_if_dialing(tunnel: &Tunnel, dial: DialId) -> bool {
        tunnel.with_state(|s| match s {
            TunnelState::Dialing { dial: d, .. } if *d == dial => {
                *s = TunnelState::Closed;
                true
            }
            _ => false,
        })
    }

    /// Records how long handing one of the agent's packets to its frontend
    /// took: upstream times every packet it sends a frontend (DIAL_RSP,
    /// DATA, CLOSE_RSP, DIAL_CLS) as `frontend_write_duration_seconds`.
    fn handed(&self, started: Instant) {
        self.metrics
            .frontend_write_duration
            .record(started.elapsed().as_secs_f64());
    }

    /// Queues the agent's DATA for a frontend, counting waits on full queues.
    async fn deliver(&self, t: &Tunnel, pkt: Packet) -> crate::tunnel::Delivery {
        if let Some(trace) = t.trace() {
            trace.first_byte();
        }
        let started = Instant::now();
        let gauge = self.metrics.full_receive_channels(Service::Connect);
        let d = t
            .deliver(pkt, |full| {
                if full {
                    gauge.increment(1.0)
                } else {
                    gauge.decrement(1.0)
                }
            })
            .await;
        self.handed(started);
        d
    }

    // === Frontend → agent ===

    /// Starts the tunnel's dial. On error the caller tells the frontend.
    pub async fn dial(&self, tunnel: &Arc<Tunnel>, pkt: Packet) -> Result<(), DialRefused> {
        let r = self.start_dial(tunnel, pkt).await;
        if let Err(e) = &r {
            let cause = match e {
                DialRefused::NoAgent => CloseReason::DialRefused,
                DialRefused::TooManyPending { .. } => CloseReason::Overloaded,
                DialRefused::TimedOut => CloseReason::DialTimeout,
                DialRefused::AgentGone => CloseReason::UpstreamLost,
                DialRefused::AlreadyDialed
                | DialRefused::Malformed
                | DialRefused::DuplicateDialId => CloseReason::ProtocolError,
            };
            tunnel.note_close(cause, format_args!("dial refused: {e}"));
        }
        r
    }

    async fn start_dial(&self, tunnel: &Arc<Tunnel>, mut pkt: Packet) -> Result<(), DialRefused> {
        let Some(Payload::DialRequest(req)) = &pkt.payload else {
            return Err(DialRefused::Malformed);
        };
        let dial = DialId(req.random);
        let address: Arc<str> = req.address.as_str().into();
        if !matches!(tunnel.state(), TunnelState::Idle) {
            return Err(DialRefused::AlreadyDialed);
        }
        // Agents at a pending-dial bound are passed over; when every agent
        // serving the address is, the dial fails now rather than waiting
        // for its deadline behind the others.
        let full = self.pending.lock().full_agents(&req.address, &self.cfg);
        let backend = match self.backends.pick_except(&req.address, &full) {
            Some(b) => b,
            None => {
                let Some(b) = self.backends.pick(&req.address) else {
                    self.metrics.dial_failure(DialFailure::NoAgent);
                    return Err(DialRefused::NoAgent);
                };
                if let Some(bound) = self.pending.lock().full(b.id, &req.address, &self.cfg) {
                    return Err(self.too_many_pending(&b, &req.address, bound));
                }
                b
            }
        };
        tracing::debug!(dial_id = %dial, address = %req.address, agent_id = %backend.agent_id, "DIAL_REQ");
        if let Some(t) = tunnel.trace() {
            t.dialing(&backend.agent_id.to_string(), &req.address, dial.0);
        }
        if let Some(d) = tunnel.debug() {
            d.set_target(&req.address);
            d.set_upstream(&backend.agent_id);
            d.set("dial_id", dial);
            d.set_state("dialing");
        }
        let recv = self.recv_gate(&backend, tunnel);
        // Whatever a frontend put there is not its to say.
        pkt.set_flow_window(recv.initial().unwrap_or(0));
        pkt.set_traceparent(tunnel.trace().map(|t| t.traceparent()).unwrap_or_default());
        let started = Instant::now();
        let deadline = started + self.cfg.dial_timeout;
        {
            // A frontend must not be able to take over another one's dial.
            let mut pending = self.pending.lock();
            if pending.contains_key(&dial) {
                return Err(DialRefused::DuplicateDialId);
            }
            // Others may have filled it since it was picked.
            if let Some(bound) = pending.full(backend.id, &address, &self.cfg) {
                drop(pending);
                return Err(self.too_many_pending(&backend, &address, bound));
            }
            pending.insert(
                dial,
                Pending {
                    tunnel: tunnel.clone(),
                    backend: backend.clone(),
                    address,
                    started,
                    deadline,
                    recv,
                    request: Some(pkt.clone()),
                    superseded: None,
                },
            );
            self.metrics.pending_dials.set(pending.len() as f64);
        }
        tunnel.with_state(|s| {
            *s = TunnelState::Dialing {
                dial,
                backend: backend.clone(),
                deadline,
            }
        });
        let sent = backend.send_within(pkt, self.cfg.dial_timeout).await;
        // The stream was picked as it ended: if its end came after the dial
        // was listed (`agent_gone` retires the stream, then looks at the
        // list), the dial is moved there; if before, here.
        if matches!(sent, Err(SendError::Gone)) || sent.is_ok() && backend.is_retired() {
            return match self.redial(dial, &backend, true).await {
                Redial::Resent | Redial::Elsewhere => Ok(()),
                Redial::No => {
                    if !self.take_pending_of(dial, tunnel) || !Self::close_if_dialing(tunnel, dial)
                    {
                        return Ok(());
                    }
                    self.metrics.dial_failure(DialFailure::BackendClose);
                    Err(DialRefused::AgentGone)
                }
            };
        }
        match sent {
            Ok(()) => Ok(()),
            Err(e) => {
                if !Self::close_if_dialing(tunnel, dial) {
                    // Answered or ended meanwhile: that path owns the tunnel.
                    return Ok(());
                }
                let reason = match e {
                    SendError::TimedOut => {
                        // An agent stream that cannot take one packet in that long is stuck.
                        tracing::warn!(agent_id = %backend.agent_id, "retiring agent stream: DIAL_REQ send timed out");
                        backend.retire();
                        DialFailure::BackendDialTimeout
                    }
                    SendError::Gone => DialFailure::BackendClose,
                };
                if self.take_pending_of(dial, tunnel) {
                    self.metrics.dial_failure(reason);
                }
                Err(match e {
                    SendError::TimedOut => DialRefused::TimedOut,
                    SendError::Gone => DialRefused::AgentGone,
                })
            }
        }
    }

    fn too_many_pending(
        &self,
        backend: &Backend<Tunnel>,
        address: &str,
        bound: PendingBound,
    ) -> DialRefused {
        tracing::debug!(agent_id = %backend.agent_id, address, ?bound, "dial refused: pending-dial bound reached");
        DialRefused::TooManyPending {
            agent: backend.agent_id.to_string(),
            address: address.to_string(),
            bound,
        }
    }

    /// Admission of the agent's DATA for a dial to `backend`.
    fn recv_gate(&self, backend: &Backend<Tunnel>, tunnel: &Arc<Tunnel>) -> RecvGate {
        match backend.flow() {
            Some(link) => link.open_recv(),
            None => {
                // The process needs back what this tunnel holds: its
                // frontend has not read for the stall limit.
                let stall = self.cfg.stall_timeout;
                let t = Arc::downgrade(tunnel);
                RecvGate::Legacy(backend.legacy().open(move || {
                    if let Some(t) = t.upgrade() {
                        tracing::warn!(
                            tunnel = t.id,
                            "frontend stalled; closing its connection to give its budget back"
                        );
                        t.abort(crate::tunnel::Abort::Stalled(stall));
                    }
                }))
            }
        }
    }

    /// Sends a dial that `from` has not answered, and will not (its stream
    /// ended, or it is draining), to another agent that serves its address
    /// by the same strategies: once per dial, within its deadline. Nothing
    /// has reached the destination before a DIAL_RSP, so the frontend sees
    /// one dial. Upstream fails such dials (#566, #126).
    async fn redial(&self, dial: DialId, from: &Arc<Backend<Tunnel>>, draining_ok: bool) -> Redial {
        if !self.cfg.resend_dials {
            return Redial::No;
        }
        let (tunnel, address, deadline) = {
            let pending = self.pending.lock();
            match pending.get(&dial) {
                Some(p) if p.backend.id == from.id => match &p.request {
                    Some(Packet {
                        payload: Some(Payload::DialRequest(req)),
                        ..
                    }) => (p.tunnel.clone(), req.address.clone(), p.deadline),
                    _ => return Redial::No,
                },
                _ => return Redial::Elsewhere,
            }
        };
        let now = Instant::now();
        if now >= deadline {
            return Redial::No;
        }
        let Some(next) = self.backends.pick_instead_of(&address, from, draining_ok) else {
            return Redial::No;
        };
        let recv = self.recv_gate(&next, &tunnel);
        let window = recv.initial().unwrap_or(0);
        // Moved in place, so that the dial is never missing from the list
        // (an answer or a cancel meanwhile finds it).
        let (mut pkt, old) = {
            let moved = self.pending.lock().update(&dial, |p| {
                if p.backend.id != from.id {
                    return None;
                }
                let pkt = p.request.take()?;
                p.backend = next.clone();
                p.superseded = Some(from.id);
                Some((pkt, std::mem::replace(&mut p.recv, recv)))
            });
            let Some(Some(moved)) = moved else {
                return Redial::Elsewhere;
            };
            moved
        };
        drop(old);
        pkt.set_flow_window(window);
        let moved = tunnel.with_state(|s| match s {
            TunnelState::Dialing {
                dial: d, backend, ..
            } if *d == dial => {
                *backend = next.clone();
                true
            }
            _ => false,
        });
        if !moved {
            // The frontend left meanwhile; its path found the dial listed
            // or will not need it.
            self.take_pending_of(dial, &tunnel);
            return Redial::Elsewhere;
        }
        if let Some(t) = tunnel.trace() {
            t.dialing(&next.agent_id.to_string(), &address, dial.0);
        }
        tracing::info!(dial_id = %dial, address = %address, from = %from.agent_id, to = %next.agent_id, "dial re-sent to another agent: its agent left or is draining before answering");
        self.metrics.dial_resent();
        if let Some(d) = tunnel.debug() {
            d.set_upstream(&next.agent_id);
            d.set("redialed_from", &from.agent_id);
        }
        if next.send_within(pkt, deadline - now).await.is_err()
            && self.take_pending_of(dial, &tunnel)
            && Self::close_if_dialing(&tunnel, dial)
        {
            self.metrics.dial_failure(DialFailure::BackendClose);
            tunnel.note_close(
                CloseReason::UpstreamLost,
                "dial refused: the agent it was re-sent to could not take it",
            );
            tunnel.deliver_last(Packet::dial_response(dial.0, 0, AGENT_LOST_DIALING.into()));
        }
        Redial::Resent
    }

    /// The dials pending on `backend`.
    fn pending_on(&self, backend: &Backend<Tunnel>) -> Vec<DialId> {
        self.pending
            .lock()
            .iter()
            .filter(|(_, p)| p.backend.id == backend.id)
            .map(|(id, _)| *id)
            .collect()
    }

    /// When the tunnel's dial must have been answered, if it is dialing.
    pub fn dial_deadline(tunnel: &Tunnel) -> Option<Instant> {
        match tunnel.state() {
            TunnelState::Dialing { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// The dial deadline passed: gives up on the dial if it is still pending.
    /// Returns the dial id that expired.
    pub async fn expire_dial(&self, tunnel: &Tunnel) -> Option<DialId> {
        let TunnelState::Dialing { dial, backend, .. } = tunnel.state() else {
            return None;
        };
        if !self.take_pending_of(dial, tunnel) {
            return None;
        }
        tunnel.with_state(|s| *s = TunnelState::Closed);
        self.metrics.dial_failure(DialFailure::BackendDialTimeout);
        tunnel.note_close(
            CloseReason::DialTimeout,
            "dial timed out waiting for the agent's DIAL_RSP",
        );
        tracing::warn!(dial_id = %dial, agent_id = %backend.agent_id, "dial timed out waiting for DIAL_RSP");
        // Lets an agent that supports it drop the dial; others ignore it.
        let _ = backend
            .send_within(Packet::close_dial(dial.0), Duration::from_secs(1))
            .await;
        Some(dial)
    }

    /// DATA from a gRPC frontend.
    pub async fn frontend_data(&self, tunnel: &Tunnel, pkt: Packet) -> Flow {
        let Some(Payload::Data(data)) = &pkt.payload else {
            return Flow::Continue;
        };
        let id = data.connect_id;
        if id == 0 {
            tracing::debug!("DATA without connectID from frontend; ignored");
            return Flow::Continue;
        }
        match tunnel.state() {
            TunnelState::Idle => {
                tunnel.note_close(CloseReason::ProtocolError, "DATA before the dial");
                tunnel.deliver_last(close_rsp(id, "backend not initialized"));
                Flow::End
            }
            TunnelState::Dialing { .. } => {
                tunnel.note_close(CloseReason::ProtocolError, "DATA during the dial");
                tunnel.deliver_last(close_rsp(id, "connection not established"));
                Flow::End
            }
            TunnelState::Established { backend, connect } if connect.0 == id => {
                let len = data.data.len();
                if !Self::take_credit(tunnel, len).await {
                    return Flow::Continue;
                }
                if let Some(d) = tunnel.debug() {
                    link::relay::Tally::client_bytes(d, len as u64);
                }
                if backend.send(pkt).await.is_err() {
                    tracing::debug!(connection_id = id, "DATA to agent failed: stream closed");
                }
                Flow::Continue
            }
            TunnelState::Established { backend, connect } => {
                // Only this stream's own connection is closed at the agent: the
                // other id may belong to somebody else's tunnel.
                tracing::warn!(first = %connect, got = id, "mismatched connection IDs from frontend");
                tunnel.with_state(|s| *s = TunnelState::Closed);
                tunnel.note_close(CloseReason::ProtocolError, "mismatched connection IDs");
                if backend.remove_conn_of(connect, tunnel) {
                    let _ = backend.send(Packet::close_request(connect.0)).await;
                }
                let _ = tunnel.enqueue(close_rsp(id, "mismatched connection IDs"));
                tunnel.deliver_last(close_rsp(connect.0, "mismatched connection IDs"));
                Flow::End
            }
            TunnelState::Closing { .. } | TunnelState::Closed => Flow::Continue,
        }
    }

    /// CLOSE_REQ from a gRPC frontend.
    pub async fn frontend_close(&self, tunnel: &Tunnel, id: i64) -> Flow {
        match tunnel.state() {
            TunnelState::Idle => {
                let _ = tunnel.enqueue(close_rsp(id, "backend uninitialized"));
                Flow::Continue
            }
            TunnelState::Established { backend, connect } if connect.0 == id => {
                if backend.send(Packet::close_request(id)).await.is_err() {
                    tunnel.with_state(|s| *s = TunnelState::Closed);
                    backend.remove_conn_of(connect, tunnel);
                    tunnel.note_close(CloseReason::UpstreamLost, "CLOSE_REQ to the agent failed");
                    tunnel.deliver_last(close_rsp(id, "CLOSE_REQ to backend failed"));
                    return Flow::End;
                }
                tunnel.with_state(|s| *s = TunnelState::Closing { backend, connect });
                tunnel.note_close(CloseReason::ClientClosed, "closed by the frontend");
                Flow::Continue
            }
            TunnelState::Dialing { .. } | TunnelState::Established { .. } => {
                let _ = tunnel.enqueue(close_rsp(id, "unrecognized connectID"));
                Flow::Continue
            }
            TunnelState::Closing { .. } | TunnelState::Closed => Flow::Continue,
        }
    }

    /// DIAL_CLS from a frontend: it gave up waiting.
    pub async fn frontend_dial_close(&self, tunnel: &Tunnel, random: i64) -> Flow {
        let TunnelState::Dialing { dial, backend, .. } = tunnel.state() else {
            return Flow::Continue;
        };
        if dial.0 != random {
            return Flow::Continue;
        }
        tunnel.with_state(|s| *s = TunnelState::Closed);
        tunnel.note_close(CloseReason::ClientClosed, "dial cancelled by the frontend");
        if self.take_pending_of(dial, tunnel) {
            self.metrics.dial_failure(DialFailure::FrontendClose);
            tracing::debug!(dial_id = %dial, "dial cancelled by frontend");
            let _ = backend
                .send_within(Packet::close_dial(random), Duration::from_secs(1))
                .await;
        }
        tunnel.finish();
        Flow::End
    }

    /// With a flow-controlled agent, waits for credit to send `len` bytes of
    /// DATA; false if the tunnel finished meanwhile.
    async fn take_credit(tunnel: &Tunnel, len: usize) -> bool {
        if let Some(send) = tunnel.flow().and_then(|f| f.send.as_ref()) {
            send.acquire(len).await;
        }
        !tunnel.is_finished()
    }

    /// HTTP CONNECT: the client's bytes for the established connection.
    pub async fn frontend_bytes(
        &self,
        tunnel: &Tunnel,
        backend: &Backend<Tunnel>,
        connect: ConnectId,
        data: bytes::Bytes,
    ) -> bool {
        if !Self::take_credit(tunnel, data.len()).await {
            return false;
        }
        if let Some(d) = tunnel.debug() {
            link::relay::Tally::client_bytes(d, data.len() as u64);
        }
        backend.send(Packet::data(connect.0, data)).await.is_ok()
    }

    /// The frontend is gone (EOF, error, reset, or its task ended): release
    /// whatever the tunnel still holds. Safe to call more than once.
    pub async fn frontend_gone(&self, tunnel: &Tunnel) {
        let previous = tunnel.with_state(|s| std::mem::replace(s, TunnelState::Closed));
        tunnel.note_close(
            CloseReason::ClientClosed,
            match previous {
                TunnelState::Dialing { .. } => "the frontend left during the dial",
                _ => "closed by the frontend",
            },
        );
        match previous {
            TunnelState::Dialing { dial, backend, .. } => {
                if self.take_pending_of(dial, tunnel) {
                    self.metrics.dial_failure(DialFailure::FrontendClose);
                    let _ = backend
                        .send_within(Packet::close_dial(dial.0), Duration::from_secs(1))
                        .await;
                }
            }
            TunnelState::Established { backend, connect } => {
                if backend.remove_conn_of(connect, tunnel) {
                    let _ = backend
                        .send_within(Packet::close_request(connect.0), Duration::from_secs(1))
                        .await;
                }
            }
            TunnelState::Closing { backend, connect } => {
                backend.remove_conn_of(connect, tunnel);
            }
            TunnelState::Idle | TunnelState::Closed => {}
        }
        tunnel.finish();
    }

    // === Agent → frontend ===

    /// Routes one packet that arrived on an agent stream.
    pub async fn agent_packet(&self, backend: &Arc<Backend<Tunnel>>, pkt: Packet) {
        self.metrics.packet(Segment::FromAgent, pkt.r#type);
        match (PacketType::try_from(pkt.r#type), &pkt.payload) {
            (Ok(PacketType::DialRsp), Some(Payload::DialResponse(rsp))) => {
                let (random, connect, failed) = (rsp.random, rsp.connect_id, !rsp.error.is_empty());
                self.agent_dial_response(backend, random, connect, failed, pkt)
                    .await
            }
            (Ok(PacketType::Data), Some(Payload::Data(d))) => {
                let id = d.connect_id;
                if id == 0 {
                    tracing::debug!(agent_id = %backend.agent_id, "DATA without connectID from agent; ignored");
                    return;
                }
                let Some(t) = backend.conn(ConnectId(id)) else {
                    tracing::debug!(agent_id = %backend.agent_id, connection_id = id, "DATA for unknown connection; closing it at the agent");
                    let _ = backend.send(Packet::close_request(id)).await;
                    return;
                };
                match self.deliver(&t, pkt).await {
                    crate::tunnel::Delivery::Queued => {}
                    crate::tunnel::Delivery::Gone | crate::tunnel::Delivery::Aborted => {
                        if t.aborted().is_some() {
                            tracing::warn!(agent_id = %backend.agent_id, connection_id = id, "frontend stalled; closing its connection");
                        }
                        t.with_state(|s| *s = TunnelState::Closed);
                        if backend.remove_conn_of(ConnectId(id), &t) {
                            let _ = backend.send(Packet::close_request(id)).await;
                        }
                    }
                }
            }
            (Ok(PacketType::CloseRsp), Some(Payload::CloseResponse(c))) => {
                let id = c.connect_id;
                match backend.remove_conn(ConnectId(id)) {
                    Some(t) => {
                        t.with_state(|s| *s = TunnelState::Closed);
                        let started = Instant::now();
                        t.deliver_last(pkt);
                        self.handed(started);
                    }
                    None => {
                        tracing::debug!(agent_id = %backend.agent_id, connection_id = id, "CLOSE_RSP for unknown connection; dropped")
                    }
                }
            }
            (Ok(PacketType::DialCls), Some(Payload::CloseDial(c))) => {
                let dial = DialId(c.random);
                match self.take_pending(dial) {
                    Some(p) if p.backend.id == backend.id => {
                        self.metrics.dial_failure(DialFailure::BackendClose);
                        p.tunnel.with_state(|s| *s = TunnelState::Closed);
                        let started = Instant::now();
                        p.tunnel.deliver_last(pkt);
                        self.handed(started);
                    }
                    Some(p) => self.add_pending(dial, p),
                    None => tracing::debug!(dial_id = %dial, "DIAL_CLS for unknown dial; dropped"),
                }
            }
            (Ok(PacketType::WindowUpdate), Some(Payload::WindowUpdate(w))) => {
                let Some(t) = backend.conn(ConnectId(w.connect_id)) else {
                    return;
                };
                let Some(flow) = t.flow() else { return };
                match (w.bytes, &flow.send) {
                    (b, Some(send)) if b > 0 => send.grant(b),
                    (b, Some(send)) if b < 0 => {
                        let back = send.give_back(b.saturating_neg());
                        backend.control(Packet::credit_returned(w.connect_id, back));
                    }
                    (0, _) => {
                        if let Some(credit) = flow.recv.returned(w.returned) {
                            backend.control(Packet::window_update(w.connect_id, credit));
                        }
                    }
                    _ => {}
                }
            }
            (Ok(PacketType::Drain), _) => {
                tracing::info!(agent_id = %backend.agent_id, "agent is draining; new dials go elsewhere when possible");
                backend.set_draining();
                self.backends.touch();
                // Its unanswered dials go to an agent that is not draining,
                // if one serves them; it is told to drop them (ours does).
                for dial in self.pending_on(backend) {
                    if self.redial(dial, backend, false).await == Redial::Resent {
                        let _ = backend
                            .send_within(Packet::close_dial(dial.0), Duration::from_secs(1))
                            .await;
                    }
                }
            }
            _ => {
                tracing::debug!(agent_id = %backend.agent_id, packet_type = pkt.r#type, "ignoring unexpected packet from agent");
            }
        }
    }

    async fn agent_dial_response(
        &self,
        backend: &Arc<Backend<Tunnel>>,
        random: i64,
        connect: i64,
        failed: bool,
        mut pkt: Packet,
    ) {
        // The agent's window is for us; the frontend never sees it.
        let agent_window = pkt.flow_window();
        pkt.set_flow_window(0);
        let dial = DialId(random);
        let pending = match self.take_pending(dial) {
            // A dial id answered by a stream we did not send it to is not ours.
            Some(p) if p.backend.id != backend.id => {
                let superseded = p.superseded == Some(backend.id);
                self.add_pending(dial, p);
                if superseded {
                    // Sent to another agent since: this answer is not wanted.
                    tracing::debug!(dial_id = %dial, agent_id = %backend.agent_id, "late DIAL_RSP for a dial re-sent to another agent; closed");
                    if connect != 0 && !failed {
                        let _ = backend.send(Packet::close_request(connect)).await;
                    }
                    return;
                }
                None
            }
            other => other,
        };
        let Some(p) = pending else {
            self.metrics.dial_failure(DialFailure::UnrecognizedResponse);
            tracing::debug!(dial_id = %dial, connection_id = connect, "DIAL_RSP for unknown dial");
            if connect != 0 {
                // The frontend gave up; the agent's connection must not linger.
                let _ = backend.send(Packet::close_request(connect)).await;
            }
            return;
        };
        if failed {
            self.metrics.dial_failure(DialFailure::ErrorResponse);
            p.tunnel.with_state(|s| *s = TunnelState::Closed);
            let started = Instant::now();
            p.tunnel.deliver_last(pkt);
            self.handed(started);
            return;
        }
        let connect_id = ConnectId(connect);
        // An agent that answers with a connection ID it already uses would
        // take over that tunnel's data; this dial fails instead.
        if !backend.add_conn(connect_id, &p.tunnel) {
            self.metrics.dial_failure(DialFailure::ErrorResponse);
            tracing::warn!(agent_id = %backend.agent_id, connection_id = connect, "agent answered a dial with a connection ID already in use");
            p.tunnel.with_state(|s| *s = TunnelState::Closed);
            p.tunnel.note_close(
                CloseReason::ProtocolError,
                "the agent answered with a connection ID already in use",
            );
            p.tunnel.deliver_last(Packet::dial_response(
                random,
                0,
                "agent answered with a connection ID already in use".into(),
            ));
            return;
        }
        // In the table first, then established, and only if the frontend is
        // still dialing: a frontend that went away meanwhile (on another
        // thread) either finds the connection to close, or is found gone here.
        let established = p.tunnel.with_state(|s| match s {
            TunnelState::Dialing { dial: d, .. } if *d == dial => {
                *s = TunnelState::Established {
                    backend: backend.clone(),
                    connect: connect_id,
                };
                true
            }
            _ => false,
        });
        if !established {
            if backend.remove_conn_of(connect_id, &p.tunnel) {
                let _ = backend.send(Packet::close_request(connect)).await;
            }
            return;
        }
        let send = backend.flow().map(|l| l.open_send(agent_window));
        p.tunnel
            .establish_flow(backend.clone(), connect_id, p.recv, send);
        if let Some(d) = p.tunnel.debug() {
            d.set("connect_id", connect_id);
            d.set_state("established");
        }
        if let Some(t) = p.tunnel.trace() {
            t.answered();
        }
        self.metrics
            .dial_duration
            .record(p.started.elapsed().as_secs_f64());
        let started = Instant::now();
        let queued = p.tunnel.enqueue(pkt);
        self.handed(started);
        if queued != crate::tunnel::Delivery::Queued {
            self.metrics.dial_failure(DialFailure::SendResponse);
            p.tunnel.with_state(|s| *s = TunnelState::Closed);
            if backend.remove_conn_of(connect_id, &p.tunnel) {
                let _ = backend.send(Packet::close_request(connect)).await;
            }
        }
    }

    /// An agent stream ended: its frontends are closed and its pending dials
    /// fail now instead of hanging until their deadline.
    pub async fn agent_gone(&self, backend: &Arc<Backend<Tunnel>>) {
        backend.retire();
        self.backends.remove(backend);
        let conns = backend.take_conns();
        if !conns.is_empty() {
            tracing::info!(agent_id = %backend.agent_id, count = conns.len(), "agent stream closed; closing its connections");
        }
        // Upstream sends an empty CLOSE_RSP here; the Go client reads EOF
        // either way, and the text reaches whoever closes the connection.
        for (id, t) in conns {
            t.with_state(|s| *s = TunnelState::Closed);
            t.deliver_last(close_rsp(id.0, AGENT_LOST));
        }
        // Its unanswered dials go to another agent once; those that cannot
        // fail now instead of hanging until their deadline.
        let mut failed = Vec::new();
        for dial in self.pending_on(backend) {
            if self.redial(dial, backend, true).await == Redial::No {
                failed.push(dial);
            }
        }
        let dials: Vec<(DialId, Pending)> = {
            let mut pending = self.pending.lock();
            let mut taken = Vec::new();
            for id in failed {
                if pending.get(&id).is_some_and(|p| p.backend.id == backend.id)
                    && let Some(p) = pending.remove(&id)
                {
                    taken.push((id, p));
                }
            }
            self.metrics.pending_dials.set(pending.len() as f64);
            taken
        };
        for (dial, p) in dials {
            self.metrics.dial_failure(DialFailure::BackendClose);
            p.tunnel.with_state(|s| *s = TunnelState::Closed);
            let rsp = Packet::dial_response(dial.0, 0, AGENT_LOST_DIALING.into());
            p.tunnel.deliver_last(rsp);
        }
    }
}
