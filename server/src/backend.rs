//! Agent streams ("backends") and how a dial picks one.
//!
//! Established connections are keyed by (agent stream, connectID): each
//! [`Backend`] owns its own table, so two streams of one agent id can never
//! collide on a connectID (upstream keys by agent id and can, #462).
//!
//! The table holds its connections weakly: a connection (a
//! [`crate::tunnel::Tunnel`], the `C` here) belongs to its frontend and
//! points at its agent stream, so a close path that forgets an entry leaves
//! a dead id behind, never a reference cycle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use konnectivity_proto::Packet;
use konnectivity_proto::control::{ControlError, ControlTx};
use konnectivity_proto::header::AgentIdentifiers;
use konnectivity_proto::ids::{AgentId, ConnectId};
use link::flow::{LegacyLink, LinkFlow};
use parking_lot::{Mutex, RwLock};
use rand::seq::IndexedRandom;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::limits::MAX_AGENT_QUEUE_BYTES;
use crate::metrics::{Metrics, Segment};

/// The channels to one agent stream, and whether it does flow control.
pub struct AgentLinks {
    pub data: mpsc::Sender<Packet>,
    pub control: ControlTx,
    /// Flow control, if the agent negotiated it.
    pub flow: Option<LinkFlow>,
    /// The stream's budget for connections without flow control.
    pub legacy: LegacyLink,
}

impl AgentLinks {
    /// Links whose receiving ends are dropped (unit tests).
    #[cfg(test)]
    pub fn detached() -> Self {
        let pool = link::flow::FlowPool::new(Default::default());
        AgentLinks {
            data: mpsc::channel(1).0,
            control: konnectivity_proto::control::channel().0,
            flow: None,
            legacy: pool.legacy_link(1, Duration::from_secs(1)),
        }
    }
}

/// What a packet takes of an agent stream's queue: its DATA's credit cost,
/// at most the whole queue (so a large packet goes when the queue is empty).
fn queue_cost(pkt: &Packet) -> u32 {
    let len = match &pkt.payload {
        Some(konnectivity_proto::packet::Payload::Data(d)) => d.data.len(),
        _ => 0,
    };
    let c = link::flow::cost(len);
    u32::try_from(c)
        .unwrap_or(u32::MAX)
        .min(MAX_AGENT_QUEUE_BYTES)
}

/// The agent stream is gone or was retired.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
#[error("agent stream closed")]
pub struct BackendGone;

/// One `/AgentService/Connect` stream, whose established connections are
/// `C`s.
pub struct Backend<C> {
    /// Process-unique stream id.
    pub id: u64,
    pub agent_id: AgentId,
    pub identifiers: AgentIdentifiers,
    to_agent: mpsc::Sender<Packet>,
    /// Room in `to_agent`, in bytes ([`MAX_AGENT_QUEUE_BYTES`]).
    room: Arc<tokio::sync::Semaphore>,
    /// WINDOW_UPDATEs: they never wait behind DATA (their order relative to
    /// data does not matter), and there are at most a few per window.
    control: ControlTx,
    /// Per-connection flow control, if the agent is one of ours; `None` for
    /// upstream agents.
    flow: Option<LinkFlow>,
    /// What connections without flow control may hold (upstream agents).
    legacy: LegacyLink,
    draining: AtomicBool,
    retired: CancellationToken,
    /// Established connections, with when each was established. Weak: the
    /// connection's frontend owns it.
    conns: Mutex<HashMap<ConnectId, (Weak<C>, Instant)>>,
    metrics: Arc<Metrics>,
    /// The registry's change counter, bumped when connections come and go.
    changes: watch::Sender<u64>,
}

impl<C> std::fmt::Debug for Backend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("id", &self.id)
            .field("agent_id", &self.agent_id)
            .finish()
    }
}

impl<C> Backend<C> {
    pub fn new(
        agent_id: AgentId,
        identifiers: AgentIdentifiers,
        links: AgentLinks,
        metrics: Arc<Metrics>,
        changes: watch::Sender<u64>,
    ) -> Arc<Backend<C>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(Backend {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            agent_id,
            identifiers,
            to_agent: links.data,
            room: Arc::new(tokio::sync::Semaphore::new(MAX_AGENT_QUEUE_BYTES as usize)),
            control: links.control,
            flow: links.flow,
            legacy: links.legacy,
            draining: AtomicBool::new(false),
            retired: CancellationToken::new(),
            conns: Mutex::new(HashMap::new()),
            metrics,
            changes,
        })
    }

    fn changed(&self) {
        self.changes.send_modify(|g| *g += 1);
    }

    /// Queues a packet for the agent, waiting while the stream is backed up
    /// (in packets or in bytes).
    pub async fn send(&self, pkt: Packet) -> Result<(), BackendGone> {
        if self.retired.is_cancelled() {
            return Err(BackendGone);
        }
        let t = pkt.r#type;
        let n = queue_cost(&pkt);
        let room = tokio::select! {
            r = self.room.acquire_many(n) => r.map_err(|_| BackendGone)?,
            _ = self.retired() => return Err(BackendGone),
        };
        room.forget();
        if self.to_agent.send(pkt).await.is_err() {
            self.room.add_permits(n as usize);
            return Err(BackendGone);
        }
        self.metrics.packet(Segment::ToAgent, t);
        Ok(())
    }

    /// The stream took `pkt` off the queue: its room is free again.
    pub fn taken(&self, pkt: &Packet) {
        self.room.add_permits(queue_cost(pkt) as usize);
    }

    /// Queues a control packet ahead of DATA, without waiting. An agent
    /// that leaves too many of them unread (it asks for credit back in a
    /// loop and does not read its stream) loses the stream.
    pub fn control(&self, pkt: Packet) {
        let t = pkt.r#type;
        match self.control.send(pkt) {
            Ok(()) => self.metrics.packet(Segment::ToAgent, t),
            Err(e @ ControlError::Full) => {
                if !self.is_retired() {
                    tracing::warn!(agent_id = %self.agent_id, error = %e, "closing the agent stream");
                }
                self.retire();
            }
            Err(ControlError::Closed) => {}
        }
    }

    pub fn flow(&self) -> Option<&LinkFlow> {
        self.flow.as_ref()
    }

    pub fn legacy(&self) -> &LegacyLink {
        &self.legacy
    }

    /// Like [`Backend::send`] but gives up after `limit`.
    pub async fn send_within(&self, pkt: Packet, limit: Duration) -> Result<(), SendError> {
        match tokio::time::timeout(limit, self.send(pkt)).await {
            Ok(r) => r.map_err(|_| SendError::Gone),
            Err(_) => Err(SendError::TimedOut),
        }
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Closes the stream from our side (it is stuck or the server stops).
    pub fn retire(&self) {
        self.retired.cancel();
    }

    pub fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    pub async fn retired(&self) {
        self.retired.cancelled().await
    }

    /// Adds a connection; false (and nothing changes) if the id is taken.
    pub fn add_conn(&self, id: ConnectId, t: &Arc<C>) -> bool {
        match self.conns.lock().entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => return false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((Arc::downgrade(t), Instant::now()));
            }
        }
        self.metrics.established.increment(1.0);
        self.changed();
        true
    }

    pub fn conn(&self, id: ConnectId) -> Option<Arc<C>> {
        self.conns.lock().get(&id).and_then(|(t, _)| t.upgrade())
    }

    /// An established connection ended (whichever way): the gauge, and
    /// how long it lived (`connection_duration_seconds`, upstream's since
    /// #899, observed on every end here).
    fn ended(&self, since: &[Instant]) {
        self.metrics.established.decrement(since.len() as f64);
        for at in since {
            self.metrics
                .connection_duration
                .record(at.elapsed().as_secs_f64());
        }
        self.changed();
    }

    /// Removes the connection only if it still belongs to `conn`.
    pub fn remove_conn_of(&self, id: ConnectId, conn: &C) -> bool {
        let mut conns = self.conns.lock();
        if conns
            .get(&id)
            .is_some_and(|(t, _)| std::ptr::eq(t.as_ptr(), conn))
        {
            let removed = conns.remove(&id);
            drop(conns);
            if let Some((_, at)) = removed {
                self.ended(&[at]);
            }
            return true;
        }
        false
    }

    pub fn remove_conn(&self, id: ConnectId) -> Option<Arc<C>> {
        let removed = self.conns.lock().remove(&id);
        removed.and_then(|(t, at)| {
            self.ended(&[at]);
            t.upgrade()
        })
    }

    pub fn take_conns(&self) -> Vec<(ConnectId, Arc<C>)> {
        let taken: Vec<_> = self.conns.lock().drain().collect();
        let since: Vec<Instant> = taken.iter().map(|(_, (_, at))| *at).collect();
        self.ended(&since);
        taken
            .into_iter()
            .filter_map(|(id, (t, _))| Some((id, t.upgrade()?)))
            .collect()
    }

    pub fn conn_count(&self) -> usize {
        self.conns.lock().len()
    }

    /// Runs `f` on every connection, under the table's lock (keep it short).
    pub fn for_each_conn(&self, mut f: impl FnMut(ConnectId, &C)) {
        for (id, (t, _)) in self.conns.lock().iter() {
            if let Some(t) = t.upgrade() {
                f(*id, &t);
            }
        }
    }
}

/// Why a DIAL_REQ could not be handed to an agent.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    #[error("agent stream closed")]
    Gone,
    #[error("timed out waiting for backend dial")]
    TimedOut,
}

/// `--proxy-strategies` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Default,
    DestHost,
    DefaultRoute,
}

impl Strategy {
    pub fn parse_list(s: &str) -> Result<Vec<Strategy>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.push(match part {
                "default" => Strategy::Default,
                "destHost" => Strategy::DestHost,
                "defaultRoute" => Strategy::DefaultRoute,
                other => return Err(format!("unknown proxy strategy: {other}, available strategy are: default, destHost, defaultRoute")),
            });
        }
        if out.is_empty() {
            return Err("proxy strategies cannot be empty".to_string());
        }
        Ok(out)
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::DestHost => "destHost",
            Strategy::DefaultRoute => "defaultRoute",
        }
    }

    fn serves<C>(self, b: &Backend<C>, host: &str) -> bool {
        match self {
            Strategy::Default => true,
            Strategy::DestHost => b.identifiers.dest_hosts().any(|h| h == host),
            Strategy::DefaultRoute => b.identifiers.default_route,
        }
    }

    /// How many routing keys this strategy has for the given backends (the
    /// `ready_backends` gauge and readiness).
    fn keys<C>(self, backends: &[Arc<Backend<C>>]) -> usize {
        let mut keys: Vec<&str> = match self {
            Strategy::Default => backends.iter().map(|b| b.agent_id.0.as_str()).collect(),
            Strategy::DestHost => backends
                .iter()
                .flat_map(|b| b.identifiers.dest_hosts())
                .collect(),
            Strategy::DefaultRoute => backends
                .iter()
                .filter(|b| b.identifiers.default_route)
                .map(|b| b.agent_id.0.as_str())
                .collect(),
        };
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }
}

/// Strips the port from a dial address: `host:port`, `[v6]:port`, bare v6.
pub fn host_of(address: &str) -> &str {
    if address.matches(':').count() <= 1 {
        return address.split(':').next().unwrap_or(address);
    }
    let host = if address.contains('[') {
        address.rfind(':').map_or(address, |i| &address[..i])
    } else {
        address
    };
    host.trim_matches(['[', ']'])
}

/// Every live agent stream, and dial routing over them.
pub struct Backends<C> {
    strategies: Vec<Strategy>,
    all: RwLock<Vec<Arc<Backend<C>>>>,
    metrics: Arc<Metrics>,
    /// Number of routing keys of the first strategy; readiness follows it.
    ready_tx: watch::Sender<usize>,
    /// Bumped on every change (stream added, removed, draining), so callers
    /// can wait for a state instead of polling.
    changes: watch::Sender<u64>,
}

impl<C> Backends<C> {
    pub fn new(strategies: Vec<Strategy>, metrics: Arc<Metrics>) -> Self {
        let (ready_tx, _) = watch::channel(0);
        let (changes, _) = watch::channel(0);
        let b = Backends {
            strategies,
            all: RwLock::new(Vec::new()),
            metrics,
            ready_tx,
            changes,
        };
        b.publish(&[]);
        b
    }

    fn publish(&self, all: &[Arc<Backend<C>>]) {
        for s in &self.strategies {
            self.metrics.ready_backends(s.name(), s.keys(all));
        }
        let agents = Strategy::Default.keys(all);
        self.metrics.ready_backend_connections.set(agents as f64);
        let first = self.strategies.first().map_or(0, |s| s.keys(all));
        self.ready_tx.send_replace(first);
        self.touch();
    }

    /// Records that some backend changed state.
    pub fn touch(&self) {
        self.changes.send_modify(|g| *g += 1);
    }

    pub fn watch_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// For new backends to report their connection changes.
    pub fn changes(&self) -> watch::Sender<u64> {
        self.changes.clone()
    }

    pub fn add(&self, b: Arc<Backend<C>>) {
        let mut all = self.all.write();
        all.push(b);
        self.publish(&all);
    }

    pub fn remove(&self, b: &Backend<C>) {
        let mut all = self.all.write();
        all.retain(|x| x.id != b.id);
        self.publish(&all);
    }

    /// Picks the agent stream for a dial to `address`: strategies in order,
    /// random among agents that are not draining, a draining one only if no
    /// other agent qualifies. Of several streams of one agent, the newest wins
    /// (an older one may be a dead connection not yet noticed).
    pub fn pick(&self, address: &str) -> Option<Arc<Backend<C>>> {
        self.pick_where(address, |_| true, true)
    }

    /// Picks an agent stream as [`Backends::pick`] does, leaving out the
    /// streams in `except` (by id).
    pub fn pick_except(&self, address: &str, except: &[u64]) -> Option<Arc<Backend<C>>> {
        self.pick_where(address, |b| !except.contains(&b.id), true)
    }

    /// Picks another agent stream than `instead_of` for a dial it was sent
    /// to and will not answer (its stream ended, or it is draining), as
    /// [`Backends::pick`] would; a draining one only if `draining_ok`.
    pub fn pick_instead_of(
        &self,
        address: &str,
        instead_of: &Backend<C>,
        draining_ok: bool,
    ) -> Option<Arc<Backend<C>>> {
        self.pick_where(address, |b| b.id != instead_of.id, draining_ok)
    }

    fn pick_where(
        &self,
        address: &str,
        eligible: impl Fn(&Backend<C>) -> bool,
        draining_ok: bool,
    ) -> Option<Arc<Backend<C>>> {
        let host = host_of(address);
        let all = self.all.read();
        let mut rng = rand::rng();
        for s in &self.strategies {
            let mut newest: HashMap<&AgentId, &Arc<Backend<C>>> = HashMap::new();
            for b in all
                .iter()
                .filter(|b| !b.is_retired() && eligible(b) && s.serves(b, host))
            {
                newest.insert(&b.agent_id, b);
            }
            let (ready, draining): (Vec<_>, Vec<_>) =
                newest.into_values().partition(|b| !b.is_draining());
            let last_resort = || draining.choose(&mut rand::rng()).filter(|_| draining_ok);
            if let Some(b) = ready.choose(&mut rng).or_else(last_resort) {
                return Some(Arc::clone(b));
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.all.read().len()
    }

    pub fn snapshot(&self) -> Vec<Arc<Backend<C>>> {
        self.all.read().clone()
    }

    /// Readiness (`/readyz`): the first strategy has at least one agent.
    pub fn ready(&self) -> bool {
        *self.ready_tx.borrow() > 0
    }

    /// Watches the number of routing keys of the first strategy.
    pub fn watch_ready(&self) -> watch::Receiver<usize> {
        self.ready_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routing does not look at connections: none here.
    type Backend = super::Backend<()>;
    type Backends = super::Backends<()>;

    fn backend(agent: &str, ids: &str) -> Arc<Backend> {
        Backend::new(
            AgentId(agent.into()),
            AgentIdentifiers::parse_lenient(ids).unwrap_or_default(),
            AgentLinks::detached(),
            Arc::new(Metrics::new()),
            watch::channel(0).0,
        )
    }

    #[test]
    fn host_of_handles_every_form() {
        assert_eq!(host_of("10.0.0.1:443"), "10.0.0.1");
        assert_eq!(host_of("node1:10250"), "node1");
        assert_eq!(host_of("node1"), "node1");
        assert_eq!(host_of("[::1]:80"), "::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
    }

    #[test]
    fn strategies_parse_in_order() {
        assert_eq!(
            Strategy::parse_list("destHost,default"),
            Ok(vec![Strategy::DestHost, Strategy::Default])
        );
        assert!(Strategy::parse_list("").is_err());
        assert!(Strategy::parse_list("default,nearest").is_err());
    }

    #[test]
    fn dest_host_then_default() {
        let m = Arc::new(Metrics::new());
        let bs = Backends::new(vec![Strategy::DestHost, Strategy::Default], m);
        let a = backend("a", "host=node-a&ipv4=10.0.0.1");
        let b = backend("b", "host=node-b&ipv6=fd00::1");
        bs.add(a.clone());
        bs.add(b.clone());
        for _ in 0..20 {
            assert_eq!(bs.pick("node-a:10250").map(|x| x.id), Some(a.id));
            assert_eq!(bs.pick("10.0.0.1:80").map(|x| x.id), Some(a.id));
            assert_eq!(bs.pick("node-b:1").map(|x| x.id), Some(b.id));
            assert_eq!(bs.pick("[fd00::1]:443").map(|x| x.id), Some(b.id));
        }
        // Unknown hosts fall through to `default`, which reaches both.
        let picked: std::collections::HashSet<_> = (0..200)
            .filter_map(|_| bs.pick("elsewhere:1"))
            .map(|x| x.id)
            .collect();
        assert_eq!(picked.len(), 2);
    }

    #[test]
    fn draining_is_last_resort_and_newest_stream_wins() {
        let bs = Backends::new(vec![Strategy::Default], Arc::new(Metrics::new()));
        let old = backend("a", "");
        let new = Backend::new(
            old.agent_id.clone(),
            AgentIdentifiers::default(),
            AgentLinks::detached(),
            Arc::new(Metrics::new()),
            watch::channel(0).0,
        );
        let other = backend("b", "");
        bs.add(old.clone());
        bs.add(new.clone());
        bs.add(other.clone());
        let picked: std::collections::HashSet<_> = (0..200)
            .filter_map(|_| bs.pick("x:1"))
            .map(|x| x.id)
            .collect();
        assert_eq!(picked, [new.id, other.id].into_iter().collect());
        other.set_draining();
        for _ in 0..50 {
            assert_eq!(bs.pick("x:1").map(|x| x.id), Some(new.id));
        }
        new.set_draining();
        assert!(
            bs.pick("x:1").is_some(),
            "draining agents still serve when nothing else can"
        );
    }

    #[test]
    fn default_route_and_readiness_follow_the_first_strategy() {
        let bs = Backends::new(vec![Strategy::DefaultRoute], Arc::new(Metrics::new()));
        let plain = backend("a", "host=a");
        bs.add(plain.clone());
        assert!(!bs.ready());
        assert!(bs.pick("x:1").is_none());
        let gw = backend("gw", "default-route=true");
        bs.add(gw.clone());
        assert!(bs.ready());
        assert_eq!(bs.pick("x:1").map(|x| x.id), Some(gw.id));
        bs.remove(&gw);
        assert!(!bs.ready());
    }
}
