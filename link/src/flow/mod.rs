//! Per-connection flow control between peers of this project (not part of
//! upstream's protocol; upstream peers never see it).
//!
//! Upstream multiplexes every connection of an agent over one stream with no
//! per-connection flow control, so one reader that stops reading stalls all
//! of them. Here, when both ends announce it at stream set-up (request
//! metadata from the agent, response header from the server, both
//! `konnectivity_proto::header::FLOW_CONTROL`), each side of each connection may have
//! sent no more DATA than the other side granted it credit for; the receiver
//! returns credit with WINDOW_UPDATE as it passes data on (to the frontend,
//! or to the destination). A side that ignores the announcement falls back to
//! upstream's behaviour.
//!
//! Windows follow the link. A connection starts with a small window (granted
//! in its DIAL_REQ / DIAL_RSP, so no round trip is spent on it). The
//! receiver measures the round-trip time from the credit exchange itself:
//! data beyond what it had granted before an update can only arrive once that
//! update reached the sender, so the time from sending an update until such
//! data arrives is a round trip (the smallest of recent ones is kept). When,
//! per such round trip since the last one completed, at least two thirds of
//! the window arrived and its reader kept up (little is parked), the window
//! doubles (or jumps to its share of what the stream carried lately), up to
//! the agreed maximum and only as far as the connection's and the process's
//! [`Budget`]s allow. A window whose data stops moving (idle, or parked
//! because its reader stalled) halves per sweep back to its initial size,
//! and asks the sender to give back credit it has not used, so the budget
//! goes to connections that need it. While a connection below its fair
//! share of the stream's budget is refused growth, windows above their fair
//! share halve per round trip towards it: the stream serves the tunnels in
//! order of arrival, so each one's share of the link follows its window.
//!
//! Every DATA packet costs at least [`MIN_COST`] bytes of credit, so the
//! number of queued packets is bounded too. A packet may be sent once the
//! sender holds credit for it, or for half the connection's initial window
//! if the packet is larger (credit may then go below zero), so one oversize
//! packet can still pass: once everything sent was passed on, the sender
//! holds at least three quarters of the window (credit goes back in quarter
//! windows, and a window never shrinks below its initial size or two of the
//! largest packets, whichever is less). Both ends
//! compute the same charge; a peer that sends past what it was granted is
//! broken and loses that connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::budget::Budget;

pub mod legacy;
pub mod metrics;
mod settings;
mod stats;

pub use legacy::{LegacyGate, LegacyLink, LegacyPool};
use parking_lot::Mutex;
pub use settings::*;
pub use stats::*;
use tokio::sync::Notify;

use tokio::time::Instant;

/// Credit is returned once a quarter window has been passed on: few updates,
/// well before the sender runs dry.
fn update_threshold(window: i64) -> i64 {
    (window / 4).max(MIN_COST)
}

/// `bytes` that arrived over `elapsed`, scaled to one round trip of `rtt`.
fn per_round_trip(bytes: i64, rtt: Duration, elapsed: Duration) -> i64 {
    if elapsed.is_zero() {
        return bytes;
    }
    let scaled = i128::from(bytes) * i128::try_from(rtt.as_nanos()).unwrap_or(i128::MAX)
        / i128::try_from(elapsed.as_nanos()).unwrap_or(i128::MAX);
    i64::try_from(scaled).unwrap_or(i64::MAX)
}

/// What every agent stream of one process shares: the settings, the process
/// budget (which the HTTP/2 windows of the agent streams share too) and the
/// totals for metrics.
#[derive(Debug)]
pub struct FlowPool {
    pub settings: FlowSettings,
    pub budget: Arc<Budget>,
    pub stats: Arc<FlowStats>,
    /// Totals of the agent streams' HTTP/2 windows.
    pub http2: Arc<crate::h2window::WindowStats>,
    /// Every connection with an upstream peer.
    pub legacy: Arc<LegacyPool>,
}

/// What the flow-control metrics show, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSnapshot {
    /// Sum of the current receive windows of flow-controlled connections.
    pub windows: i64,
    /// Bytes received from the peers and not yet passed on.
    pub parked: i64,
    /// Reserved in the process budget (those windows and the HTTP/2 ones).
    pub reserved: i64,
    /// The process budget.
    pub budget: i64,
    /// Sum of the agent streams' current HTTP/2 receive windows.
    pub http2_windows: i64,
}

impl FlowPool {
    pub fn snapshot(&self) -> FlowSnapshot {
        FlowSnapshot {
            windows: self.stats.windows(),
            parked: self.stats.parked(),
            reserved: self.budget.used(),
            budget: self.budget.limit(),
            http2_windows: self.http2.connection_windows(),
        }
    }

    pub fn new(settings: FlowSettings) -> Arc<FlowPool> {
        Arc::new(FlowPool {
            settings,
            budget: Budget::new(settings.process_budget, None),
            stats: Arc::new(FlowStats::default()),
            http2: Arc::default(),
            legacy: Arc::default(),
        })
    }

    /// The largest window we offer a peer; `None` when flow control is off.
    pub fn offer(&self) -> Option<i64> {
        self.settings.enabled.then_some(self.settings.window.max)
    }

    /// Flow control for a new agent stream whose peer offered `peer_max`
    /// (`None`: the peer did not offer it; the stream runs as upstream's).
    pub fn link(&self, peer_max: Option<i64>) -> Option<LinkFlow> {
        let settings = self.settings;
        if !settings.enabled {
            return None;
        }
        let peer_max = peer_max?;
        Some(LinkFlow::new(
            settings.window.agreed(peer_max),
            Budget::new(settings.link_budget, Some(self.budget.clone())),
            self.stats.clone(),
        ))
    }

    /// The receiving side of a stream with an upstream peer: its
    /// connections queue at most `slots` packets, and bytes as
    /// [`crate::flow::legacy`] describes, the stream's budget inside the process's.
    pub fn legacy_link(&self, slots: usize, stall: Duration) -> LegacyLink {
        LegacyLink::new(
            self.legacy.clone(),
            Budget::new(self.settings.link_budget, Some(self.budget.clone())),
            self.settings.window.initial,
            slots,
            stall,
            self.stats.clone(),
        )
    }
}

/// Flow control of one agent stream that negotiated it: the agreed window
/// settings and the stream's budget (inside the process's).
#[derive(Debug, Clone)]
pub struct LinkFlow {
    pub cfg: WindowConfig,
    pub budget: Arc<Budget>,
    pub stats: Arc<FlowStats>,
    shared: Arc<LinkShared>,
}

/// What the connections of one agent stream know of each other.
#[derive(Debug)]
struct LinkShared {
    /// What connections of this stream needed lately: a new one starts
    /// there instead of ramping up from the initial window again.
    warm: Mutex<Warm>,
    /// Connections of this stream whose data moves (or that just opened):
    /// they share what the link carried lately, and the budget.
    moving: AtomicI64,
    /// Connections below their fair share whose window could not grow
    /// because the budget was used up: while there are any, windows above
    /// their fair share shrink towards it.
    starved: AtomicI64,
    /// Numbers this stream's connections in the trace log.
    opened: AtomicI64,
}

impl LinkShared {
    fn moving(&self) -> i64 {
        self.moving.load(Ordering::Relaxed).max(1)
    }

    /// The window `warm` remembers, shared by the moving connections.
    fn share(&self, now: Instant) -> i64 {
        self.warm.lock().current(now) / self.moving()
    }

    /// What each moving connection may hold when all want more than the
    /// budget has: an equal part of it.
    fn fair(&self, budget: &Budget) -> i64 {
        budget.limit() / self.moving()
    }
}

/// Sets a connection's `flag`, keeping `count` (how many of the stream's
/// connections have it set) in step.
fn set_counted(flag: &mut bool, to: bool, count: &AtomicI64) {
    if *flag != to {
        *flag = to;
        count.fetch_add(if to { 1 } else { -1 }, Ordering::Relaxed);
    }
}

/// A window the link recently carried, halving every [`WARM_HOLD`] since.
#[derive(Debug)]
struct Warm {
    window: i64,
    noted: Instant,
}

/// How long a link's recent window is remembered at full size.
pub const WARM_HOLD: Duration = Duration::from_secs(30);

impl Warm {
    fn current(&self, now: Instant) -> i64 {
        let halvings = now.saturating_duration_since(self.noted).as_secs() / WARM_HOLD.as_secs();
        self.window
            .checked_shr(u32::try_from(halvings).unwrap_or(63))
            .unwrap_or(0)
    }

    fn note(&mut self, window: i64, now: Instant) {
        if window >= self.current(now) {
            self.window = window;
            self.noted = now;
        }
    }
}

impl LinkFlow {
    pub fn new(cfg: WindowConfig, budget: Arc<Budget>, stats: Arc<FlowStats>) -> Self {
        LinkFlow {
            cfg,
            budget,
            stats,
            shared: Arc::new(LinkShared {
                warm: Mutex::new(Warm {
                    window: 0,
                    noted: Instant::now(),
                }),
                moving: AtomicI64::new(0),
                starved: AtomicI64::new(0),
                opened: AtomicI64::new(0),
            }),
        }
    }

    /// The receiving side of a new connection. Its initial window (to be
    /// announced to the sender) is [`RecvWindow::initial`].
    pub fn open_recv(&self) -> RecvGate {
        RecvGate::Window(RecvWindow::new(self))
    }

    /// The sending side of a new connection whose receiver announced
    /// `initial` bytes of credit.
    pub fn open_send(&self, initial: i64) -> SendGate {
        SendGate::new(initial.clamp(MIN_COST, self.cfg.max))
    }
}

/// What the sweep asks the caller to send the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// More credit (a window that could grow while its reader was idle).
    Grant(i64),
    /// Please give back up to this much unused credit.
    Revoke(i64),
}

impl Sweep {
    /// The WINDOW_UPDATE amount that carries it: credit granted, or a
    /// negative amount asking for unused credit back.
    pub fn window_update(self) -> i64 {
        match self {
            Sweep::Grant(n) => n,
            Sweep::Revoke(n) => n.saturating_neg(),
        }
    }
}

/// Sweeps one stream's receive windows every [`SWEEP_INTERVAL`] and never
/// returns: `collect` adds the [`Sweep`] each connection (by its id `K`)
/// asks for at `now` ([`RecvGate::sweep`]); `send` sends one connection's
/// WINDOW_UPDATE of [`Sweep::window_update`] bytes.
pub async fn sweep_windows<K>(
    mut collect: impl FnMut(Instant, &mut Vec<(K, Sweep)>),
    mut send: impl FnMut(K, i64),
) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        tick.tick().await;
        collect(Instant::now(), &mut out);
        for (id, sweep) in out.drain(..) {
            send(id, sweep.window_update());
        }
    }
}

/// Admission for one connection's incoming DATA, before it is queued for the
/// local consumer (frontend or destination).
pub enum RecvGate {
    /// Upstream peer: bounded in packets and bytes per connection and by the
    /// stream's and the process's budgets (see [`crate::flow::legacy`]).
    Legacy(LegacyGate),
    /// Flow-controlled peer.
    Window(RecvWindow),
}

impl RecvGate {
    /// Whether admitting now would have to wait for the consumer (legacy
    /// only).
    pub fn is_full(&self) -> bool {
        matches!(self, RecvGate::Legacy(g) if g.is_full())
    }

    /// The connection's queue was dropped (it was aborted): a legacy gate
    /// gives back what it held at once; a window keeps its reservation until
    /// it is dropped.
    pub fn discard(&self) {
        if let RecvGate::Legacy(g) = self {
            g.discard();
        }
    }

    /// The window announced to the sender at set-up (flow control only).
    pub fn initial(&self) -> Option<i64> {
        match self {
            RecvGate::Legacy(_) => None,
            RecvGate::Window(w) => Some(w.initial),
        }
    }

    /// The current window (flow control only).
    pub fn window(&self) -> Option<i64> {
        match self {
            RecvGate::Legacy(_) => None,
            RecvGate::Window(w) => Some(w.inner.lock().target),
        }
    }

    /// Admits DATA of `len` bytes, waiting (legacy only) for room.
    pub async fn admit(&self, len: usize) -> Result<(), GateError> {
        match self {
            RecvGate::Legacy(g) => g.admit(len).await,
            RecvGate::Window(w) => w.admit(len, Instant::now()),
        }
    }

    /// The consumer passed on DATA of `len` bytes. Returns credit to grant
    /// the peer now (flow control, once enough has built up).
    pub fn consumed(&self, len: usize) -> Option<i64> {
        match self {
            RecvGate::Legacy(g) => {
                g.consumed(len);
                None
            }
            RecvGate::Window(w) => w.consumed(len, Instant::now()),
        }
    }

    /// Periodic check (flow control only): shrinks a window whose data stood
    /// still, frees its budget, tops up one the budget held back.
    pub fn sweep(&self, now: Instant) -> Option<Sweep> {
        match self {
            RecvGate::Legacy(_) => None,
            RecvGate::Window(w) => w.sweep(now),
        }
    }

    /// The sender gave back `bytes` of credit we asked for. Returns credit
    /// to grant the peer now: what it gave back may have been more than its
    /// window allows once the data it had in flight was passed on.
    #[must_use = "a grant that is due must be sent, or both sides wait"]
    pub fn returned(&self, bytes: i64) -> Option<i64> {
        match self {
            RecvGate::Legacy(_) => None,
            RecvGate::Window(w) => w.returned(bytes, Instant::now()),
        }
    }

    /// The smallest round trip measured so far (flow control only).
    pub fn rtt(&self) -> Option<Duration> {
        match self {
            RecvGate::Legacy(_) => None,
            RecvGate::Window(w) => w.inner.lock().min_rtt,
        }
    }
}

/// An update in flight whose round trip is being timed.
#[derive(Debug, Clone, Copy)]
struct Probe {
    sent: Instant,
    /// Credit granted before this update: data beyond it proves arrival.
    mark: i64,
    /// `received` when the update was sent.
    received: i64,
    /// The window that limited the data arriving during this round trip:
    /// it was granted before the update, so a window that grew at the
    /// last sample does not show until the next one.
    window: i64,
}

#[derive(Debug)]
struct RecvState {
    /// Credit granted in all (initial window + updates − returns).
    granted: i64,
    /// Cost received in all.
    received: i64,
    /// Cost passed on in all.
    consumed: i64,
    /// The current window: what the sender may have outstanding.
    target: i64,
    /// Held in the budget: max(target, granted − consumed).
    reserved: i64,
    probe: Option<Probe>,
    /// The window before it last grew (what the next probe measures).
    sampled_window: i64,
    /// When the last round trip completed (or data first arrived), and
    /// `received` then: what arrived since is measured against the window.
    last_sample: Option<(Instant, i64)>,
    min_rtt: Option<Duration>,
    /// Last time data arrived or was passed on.
    last_moved: Instant,
    last_consumed: Instant,
    /// A request to give credit back is unanswered.
    revoking: bool,
    /// Counted in the stream's moving connections.
    moving: bool,
    /// Counted in the stream's starved connections.
    starved: bool,
}

/// The receiving side of one flow-controlled connection.
pub struct RecvWindow {
    inner: Mutex<RecvState>,
    /// The window announced at set-up; half of it is what an oversize
    /// packet needs.
    initial: i64,
    cfg: WindowConfig,
    budget: Arc<Budget>,
    stats: Arc<FlowStats>,
    link: Arc<LinkShared>,
    /// Which of the stream's connections (trace log only).
    seq: i64,
}

impl RecvWindow {
    fn new(link: &LinkFlow) -> RecvWindow {
        let now = Instant::now();
        // A new connection starts at its share of what the link carried
        // lately: one tunnel after another starts where the last one left
        // off, and a burst of new ones does not hand the whole window to
        // the first few (P10: 16 tunnels at 100 ms).
        link.shared.moving.fetch_add(1, Ordering::Relaxed);
        let warm = link.shared.share(now);
        let want = link.cfg.initial.max(warm).clamp(FLOOR_WINDOW, link.cfg.max);
        // Initial windows take at most half the budget: connections whose
        // readers never read (they never grow) cannot take it all from
        // those that do.
        let got = if link.budget.is_half_used() {
            0
        } else {
            link.budget.try_reserve(want)
        };
        if got < FLOOR_WINDOW {
            link.budget.force(FLOOR_WINDOW - got);
        }
        let initial = got.max(FLOOR_WINDOW);
        link.stats.add_windows(initial);
        let seq = link.shared.opened.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(
            conn = seq,
            warm,
            initial,
            budget_used = link.budget.used(),
            "flow window opened"
        );
        RecvWindow {
            inner: Mutex::new(RecvState {
                granted: initial,
                received: 0,
                consumed: 0,
                target: initial,
                reserved: initial,
                probe: None,
                sampled_window: initial,
                last_sample: None,
                min_rtt: None,
                last_moved: now,
                last_consumed: now,
                revoking: false,
                moving: true,
                starved: false,
            }),
            initial,
            cfg: link.cfg,
            budget: link.budget.clone(),
            stats: link.stats.clone(),
            link: link.shared.clone(),
            seq,
        }
    }

    fn admit(&self, len: usize, now: Instant) -> Result<(), GateError> {
        let c = cost(len);
        let mut s = self.inner.lock();
        if s.granted - s.received < c.min(self.initial / 2) {
            return Err(GateError::Exceeded(s.target));
        }
        if s.last_sample.is_none() {
            s.last_sample = Some((now, s.received));
        }
        s.received += c;
        s.last_moved = now;
        self.stats.add_parked(c);
        self.set_moving(&mut s, true);
        if let Some(p) = s.probe
            && s.received > p.mark
        {
            s.probe = None;
            self.sampled(&mut s, p, c, now);
        }
        Ok(())
    }

    /// A round trip completed: remember it, and grow the window if it was
    /// what held the connection back.
    fn sampled(&self, s: &mut RecvState, p: Probe, arriving: i64, now: Instant) {
        let rtt = now.saturating_duration_since(p.sent);
        s.min_rtt = Some(s.min_rtt.map_or(rtt, |m| m.min(rtt)));
        // What arrived per round trip since the last sample, the packet that
        // proved this one included. Not only since the probe went out: a
        // window smaller than the link can carry arrives in one burst per
        // round trip, and the probe's update goes out after that burst was
        // admitted, so only the first packet of the next burst would count
        // (P10: 16 tunnels at 100 ms sat at 256 KiB, each sample counting
        // 64 KiB of it, and never grew).
        let (since, from) = s.last_sample.unwrap_or((p.sent, p.received));
        s.last_sample = Some((now, s.received));
        let elapsed = now.saturating_duration_since(since).max(rtt);
        let delivered = per_round_trip(s.received - from, rtt, elapsed);
        // Parked before this packet: the reader kept up with the rest.
        let parked = s.received - s.consumed - arriving;
        s.sampled_window = s.target;
        let limited = delivered * 3 >= p.window * 2 && parked <= s.target / 2;
        // What this connection carried in a round trip (or its window, when
        // that was the limit) is a fair start for the link's next ones.
        self.link
            .warm
            .lock()
            .note(if limited { s.target } else { delivered }, now);
        let fair = self.link.fair(&self.budget);
        // Some connection waits for budget (this one's own flag cannot
        // matter below: a starved window is under its fair share).
        let contended = self.link.starved.load(Ordering::Relaxed) > 0;
        let mut short = false;
        if limited && s.target < self.cfg.max {
            // Double, or (one that started small, e.g. at the floor while
            // the budget was half reserved) jump to its share of the link at
            // once: doubling from 16 KiB takes ten round trips, each longer
            // while others' data queues ahead.
            let mut to = (s.target * 2).max(self.link.share(now)).min(self.cfg.max);
            if contended {
                // None grows past the fair share while some wait.
                to = to.min(fair.max(s.target));
            }
            let want = to - s.target;
            // What is already reserved above the window counts first.
            let covered = (s.reserved - s.target).clamp(0, want);
            let got = self.budget.try_reserve(want - covered);
            s.reserved += got;
            let grown = covered + got;
            s.target += grown;
            self.stats.add_windows(grown);
            short = grown < want;
        }
        self.set_starved(s, short && s.target < fair);
        if contended && s.target > fair.max(self.least()) {
            // A window's share of the link follows its size (the agent
            // stream serves the tunnels' packets in order of arrival), so one
            // that took more than its part of the budget before the others
            // came gives it back: halving per round trip, down to the fair
            // share. The reservation follows as its data is passed on.
            let shrunk = (s.target / 2).max(fair).max(self.least());
            self.stats.add_windows(shrunk - s.target);
            s.target = shrunk;
            self.settle(s);
        }
        tracing::trace!(
            conn = self.seq,
            rtt_us = rtt.as_micros(),
            delivered,
            sampled = p.window,
            parked,
            limited,
            window = s.target,
            fair,
            starved = s.starved,
            budget_used = self.budget.used(),
            "flow window sampled"
        );
    }

    fn consumed(&self, len: usize, now: Instant) -> Option<i64> {
        let c = cost(len);
        let mut s = self.inner.lock();
        s.consumed += c;
        s.last_moved = now;
        s.last_consumed = now;
        self.stats.add_parked(-c);
        self.settle(&mut s);
        self.grant(&mut s, now)
    }

    /// Tops the sender's credit up to the window once a batch is due.
    fn grant(&self, s: &mut RecvState, now: Instant) -> Option<i64> {
        let want = s.consumed + s.target - s.granted;
        if want < update_threshold(s.target) {
            return None;
        }
        if s.probe.is_none() {
            s.probe = Some(Probe {
                sent: now,
                mark: s.granted,
                received: s.received,
                window: s.sampled_window,
            });
        }
        s.granted += want;
        Some(want)
    }

    /// Keeps the reservation at max(window, what may still arrive unread).
    fn settle(&self, s: &mut RecvState) {
        let need = s.target.max(s.granted - s.consumed);
        if need < s.reserved {
            self.budget.release(s.reserved - need);
            s.reserved = need;
        }
    }

    /// The smallest this window may shrink to: its initial size, or two of
    /// the largest packets if that is less. The sender then still comes to
    /// hold what any packet needs (the packet's cost up to half the initial
    /// window): three quarters of this once everything sent was passed on.
    fn least(&self) -> i64 {
        self.initial.min(2 * MAX_PACKET)
    }

    fn sweep(&self, now: Instant) -> Option<Sweep> {
        let mut s = self.inner.lock();
        let parked = s.received - s.consumed;
        let still = if parked > 0 {
            now.saturating_duration_since(s.last_consumed)
        } else {
            now.saturating_duration_since(s.last_moved)
        };
        if still < self.cfg.idle {
            return None;
        }
        self.set_moving(&mut s, false);
        self.set_starved(&mut s, false);
        if s.target > self.least() {
            let shrunk = (s.target / 2).max(self.least());
            self.stats.add_windows(shrunk - s.target);
            s.target = shrunk;
            s.sampled_window = shrunk;
            // A window that changed size needs a fresh round trip to grow.
            s.probe = None;
            s.last_sample = None;
            self.settle(&mut s);
            tracing::trace!(conn = self.seq, window = shrunk, "flow window shrunk");
        }
        // Credit above the window that the sender has not used yet (what is
        // parked or on its way cannot be taken back).
        let unused = (s.granted - s.consumed - s.target).min(s.granted - s.received);
        if unused > 0 && !s.revoking {
            s.revoking = true;
            return Some(Sweep::Revoke(unused));
        }
        None
    }

    fn set_moving(&self, s: &mut RecvState, moving: bool) {
        set_counted(&mut s.moving, moving, &self.link.moving);
    }

    fn set_starved(&self, s: &mut RecvState, starved: bool) {
        set_counted(&mut s.starved, starved, &self.link.starved);
    }

    /// The sender gave back credit we asked for (see [`RecvWindow::sweep`]).
    /// The request was sized from the sender's credit as we saw it then;
    /// data it had already spent credit on may have arrived and been passed
    /// on since, and no later passing-on would then top it up again: the
    /// grant that is due goes out now, or the sender, holding less than a
    /// packet needs, and we, with nothing left to pass on, would both wait
    /// for ever (300 tunnels on one reusable tunnel, issue 35).
    fn returned(&self, bytes: i64, now: Instant) -> Option<i64> {
        let mut s = self.inner.lock();
        let back = bytes.clamp(0, (s.granted - s.received).max(0));
        s.granted -= back;
        s.revoking = false;
        self.settle(&mut s);
        self.grant(&mut s, now)
    }
}

impl Drop for RecvWindow {
    fn drop(&mut self) {
        let s = self.inner.get_mut();
        if s.moving {
            self.link.moving.fetch_sub(1, Ordering::Relaxed);
        }
        if s.starved {
            self.link.starved.fetch_sub(1, Ordering::Relaxed);
        }
        self.budget.release(s.reserved);
        self.stats.add_windows(-s.target);
        self.stats.add_parked(-(s.received - s.consumed));
    }
}

/// How much a sender that holds what it reads until it may send it reads
/// next: a full chunk without flow control (an upstream peer grants no
/// credit), else [`SendGate::next_read`].
pub fn read_size(send: Option<&SendGate>) -> usize {
    let max = crate::chunks::MAX_CHUNK;
    send.map_or(max, |g| g.next_read(max))
}

/// The sending side's credit for one connection, granted by the peer.
pub struct SendGate {
    /// What an oversize packet needs in hand: half the receiver's initial
    /// window.
    cap: i64,
    state: Mutex<SendState>,
    wake: Notify,
}

struct SendState {
    credit: i64,
    closed: bool,
}

impl SendGate {
    fn new(initial: i64) -> Self {
        SendGate {
            cap: initial / 2,
            state: Mutex::new(SendState {
                credit: initial,
                closed: false,
            }),
            wake: Notify::new(),
        }
    }

    /// Waits until DATA of `len` bytes may be sent, and takes its credit.
    /// Returns at once (without credit) once the gate is closed.
    pub async fn acquire(&self, len: usize) {
        let c = cost(len);
        let need = c.min(self.cap);
        loop {
            // Registered before the look at the state, so a grant or close
            // that comes in between still wakes this waiter.
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut s = self.state.lock();
                if s.closed {
                    return;
                }
                if s.credit >= need {
                    s.credit -= c;
                    return;
                }
            }
            woken.await;
        }
    }

    /// Credit the peer granted.
    pub fn grant(&self, bytes: i64) {
        if bytes <= 0 {
            return;
        }
        let mut s = self.state.lock();
        s.credit = s.credit.saturating_add(bytes).min(MAX_WINDOW);
        drop(s);
        // Usually one waiter (the connection's reader); any others look too.
        self.wake.notify_waiters();
    }

    /// The peer asks for up to `bytes` of unused credit back; returns what is
    /// given back (to be reported with `konnectivity_proto::PacketExt::credit_returned`).
    pub fn give_back(&self, bytes: i64) -> i64 {
        let mut s = self.state.lock();
        let back = s.credit.clamp(0, bytes.max(0));
        s.credit -= back;
        back
    }

    /// How much a sender that holds what it reads until it may send it
    /// should read next (at most `max`): the credit in hand, but never less
    /// than [`READ_AHEAD`].
    pub fn next_read(&self, max: usize) -> usize {
        let credit = usize::try_from(self.credit()).unwrap_or(0);
        credit.max(READ_AHEAD).min(max)
    }

    /// Credit in hand (may be below zero after an oversize packet).
    pub fn credit(&self) -> i64 {
        self.state.lock().credit
    }

    /// Wakes every waiting sender for good (the connection is closing);
    /// a fuzzer found a second waiter left asleep when only one was woken.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(initial: i64, max: i64, budget: i64) -> LinkFlow {
        LinkFlow::new(
            WindowConfig {
                initial,
                max,
                idle: Duration::from_secs(1),
            },
            Budget::new(budget, None),
            Arc::new(FlowStats::default()),
        )
    }

    fn window(g: &RecvGate) -> i64 {
        g.window().unwrap_or_default()
    }

    /// A sender that always has data, a reader that keeps up, and a link of
    /// round trip `rtt` in between (credit takes rtt/2 one way, data the
    /// other), simulated step by step. Returns the window after `rounds`
    /// round trips and the bytes delivered.
    fn simulate(gate: &RecvGate, send: &SendGate, rtt: Duration, rounds: u32) -> i64 {
        simulate_arrivals(gate, send, rtt, rounds, false)
    }

    /// As [`simulate`]; with `bursts`, everything that arrives in a step is
    /// admitted before any of it is passed on (the stream reader queues a
    /// burst ahead of the consumer).
    fn simulate_arrivals(
        gate: &RecvGate,
        send: &SendGate,
        rtt: Duration,
        rounds: u32,
        bursts: bool,
    ) -> i64 {
        let start = Instant::now();
        let chunk = 16 << 10;
        let mut delivered = 0;
        // Each step: the sender spends what credit it has (arriving rtt/2
        // later); the receiver passes everything on and grants credit
        // (arriving at the sender rtt/2 later).
        let mut in_flight: Vec<(Instant, usize)> = Vec::new();
        let mut grants: Vec<(Instant, i64)> = Vec::new();
        let step = rtt / 8;
        let mut now = start;
        while now < start + rtt * rounds {
            now += step;
            for (_, g) in grants.iter().filter(|(t, _)| *t <= now) {
                send.grant(*g);
            }
            grants.retain(|(t, _)| *t > now);
            while send.credit() >= chunk as i64 {
                let s = send.state.lock().credit;
                send.state.lock().credit = s - chunk as i64;
                in_flight.push((now + rtt / 2, chunk));
            }
            let (arrived, rest): (Vec<_>, Vec<_>) =
                in_flight.into_iter().partition(|(t, _)| *t <= now);
            in_flight = rest;
            let RecvGate::Window(w) = gate else {
                panic!("not a window")
            };
            if bursts {
                for (_, n) in &arrived {
                    assert_eq!(w.admit(*n, now), Ok(()));
                }
            }
            for (_, n) in arrived {
                if !bursts {
                    assert_eq!(w.admit(n, now), Ok(()));
                }
                delivered += n as i64;
                if let Some(g) = w.consumed(n, now) {
                    grants.push((now + rtt / 2, g));
                }
            }
        }
        // Let what is on its way arrive, so both ends agree on the credit.
        for (_, n) in in_flight {
            let RecvGate::Window(w) = gate else {
                panic!("not a window")
            };
            assert_eq!(w.admit(n, now), Ok(()));
            delivered += n as i64;
            if let Some(g) = w.consumed(n, now) {
                send.grant(g);
            }
        }
        for (_, g) in grants {
            send.grant(g);
        }
        delivered
    }

    #[test]
    fn the_window_grows_while_the_reader_keeps_up_over_a_long_round_trip() {
        let l = link(64 << 10, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        let send = l.open_send(gate.initial().unwrap_or_default());
        assert_eq!(window(&gate), 64 << 10);
        let delivered = simulate(&gate, &send, Duration::from_millis(50), 12);
        assert!(window(&gate) >= 8 << 20, "window {}", window(&gate));
        assert!(window(&gate) <= 16 << 20);
        let rtt = gate.rtt().unwrap_or_default();
        assert!(
            rtt >= Duration::from_millis(50) && rtt < Duration::from_millis(60),
            "{rtt:?}"
        );
        // Fixed at 64 KiB it would have moved 12 windows.
        assert!(delivered > 12 * (64 << 10) * 8, "{delivered}");
        assert_eq!(l.stats.windows(), window(&gate));
    }

    #[test]
    fn a_window_that_arrives_in_one_burst_per_round_trip_grows() {
        // The whole window is admitted before the consumer passes any of it
        // on, so the probe's update goes out after the burst: measured only
        // from the probe, a round trip carried one packet and the window
        // never grew (P10: 16 tunnels sat at 256 KiB for seconds).
        let l = link(256 << 10, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        let send = l.open_send(gate.initial().unwrap_or_default());
        simulate_arrivals(&gate, &send, Duration::from_millis(100), 12, true);
        assert!(window(&gate) >= 8 << 20, "window {}", window(&gate));
    }

    #[test]
    fn the_window_never_grows_past_the_budget() {
        let l = link(64 << 10, 16 << 20, 1 << 20);
        let a = l.open_recv();
        let b = l.open_recv();
        let sa = l.open_send(a.initial().unwrap_or_default());
        let sb = l.open_send(b.initial().unwrap_or_default());
        simulate(&a, &sa, Duration::from_millis(20), 20);
        simulate(&b, &sb, Duration::from_millis(20), 20);
        assert!(window(&a) + window(&b) <= 1 << 20);
        assert!(l.budget.used() <= 1 << 20);
        assert_eq!(l.budget.used(), window(&a) + window(&b));
        // A newcomer still gets the floor, past the budget.
        let c = l.open_recv();
        assert_eq!(c.initial(), Some(FLOOR_WINDOW));
        drop((a, b, c));
        assert_eq!(l.budget.used(), 0);
        assert_eq!(l.stats.windows(), 0);
        assert_eq!(l.stats.parked(), 0);
    }

    #[test]
    fn a_new_connection_starts_at_what_the_link_carried_lately() {
        let l = link(64 << 10, 16 << 20, 1 << 30);
        let a = l.open_recv();
        let sa = l.open_send(a.initial().unwrap_or_default());
        simulate(&a, &sa, Duration::from_millis(20), 12);
        let grown = window(&a);
        assert!(grown > 1 << 20, "{grown}");
        // While `a` still moves data, a newcomer starts at half of it.
        let b = l.open_recv();
        assert_eq!(b.initial(), Some(grown / 2));
        drop((a, b));
        let c = l.open_recv();
        assert_eq!(c.initial(), Some(grown), "no second ramp from 64 KiB");
        // Once `c` stood still, the next one has the link to itself again.
        // (`c` itself shrinks to two of the largest packets, if it started
        // above that, and asks for the credit above it back.)
        let least = grown.min(2 * MAX_PACKET);
        assert_eq!(
            c.sweep(Instant::now() + DEFAULT_IDLE),
            (grown > least).then_some(Sweep::Revoke(grown - least))
        );
        let d = l.open_recv();
        assert_eq!(d.initial(), Some(grown));
    }

    /// How a shared link picks what it carries next.
    #[derive(Clone, Copy)]
    enum Order {
        /// The connections with credit take a chunk each in turn.
        Turns,
        /// Senders queue everything their credit allows, served first come,
        /// first served (as the agent stream's HTTP/2 window serves the
        /// tunnels' packets): a connection's share follows its window.
        Arrival,
    }

    /// Connections sharing one link that carries at most `per_rtt` bytes per
    /// round trip in `order`, each with a sender that always has data and a
    /// reader that keeps up, from `start` on. Returns what each delivered.
    fn simulate_link(
        gates: &[(RecvGate, SendGate)],
        start: Instant,
        rtt: Duration,
        per_rtt: i64,
        order: Order,
        rounds: u32,
    ) -> Vec<i64> {
        let chunk = 16 << 10;
        let step = rtt / 8;
        let per_step = per_rtt / 8;
        let mut queue = std::collections::VecDeque::new();
        let mut in_flight: Vec<(Instant, usize, usize)> = Vec::new();
        let mut grants: Vec<(Instant, usize, i64)> = Vec::new();
        let mut delivered = vec![0; gates.len()];
        let mut now = start;
        let mut next = 0;
        while now < start + rtt * rounds {
            now += step;
            for (_, i, g) in grants.iter().filter(|(t, _, _)| *t <= now) {
                gates[*i].1.grant(*g);
            }
            grants.retain(|(t, _, _)| *t > now);
            let mut room = per_step;
            match order {
                Order::Turns => {
                    let mut idle = 0;
                    while room >= chunk as i64 && idle < gates.len() {
                        let i = next % gates.len();
                        next += 1;
                        let send = &gates[i].1;
                        if send.credit() < chunk as i64 {
                            idle += 1;
                            continue;
                        }
                        idle = 0;
                        send.state.lock().credit -= chunk as i64;
                        in_flight.push((now + rtt / 2, i, chunk));
                        room -= chunk as i64;
                    }
                }
                Order::Arrival => {
                    for (i, (_, send)) in gates.iter().enumerate() {
                        while send.credit() >= chunk as i64 {
                            send.state.lock().credit -= chunk as i64;
                            queue.push_back(i);
                        }
                    }
                    while room >= chunk as i64
                        && let Some(i) = queue.pop_front()
                    {
                        in_flight.push((now + rtt / 2, i, chunk));
                        room -= chunk as i64;
                    }
                }
            }
            let (arrived, rest): (Vec<_>, Vec<_>) =
                in_flight.into_iter().partition(|(t, _, _)| *t <= now);
            in_flight = rest;
            for (_, i, n) in arrived {
                let RecvGate::Window(w) = &gates[i].0 else {
                    panic!("not a window")
                };
                assert_eq!(w.admit(n, now), Ok(()));
                delivered[i] += n as i64;
                if let Some(g) = w.consumed(n, now) {
                    grants.push((now + rtt / 2, i, g));
                }
            }
        }
        delivered
    }

    #[test]
    fn a_burst_of_new_connections_shares_what_the_link_carried() {
        // P10 at 100 ms: one tunnel grew to 16 MiB, then 16 start together.
        // Before, the first two warm-started at 16 MiB each, which is half
        // the budget, and the other 14 were left to double from the 16 KiB
        // floor, one (queue-lengthened) round trip per doubling.
        let budget = 64 << 20;
        let l = link(256 << 10, 16 << 20, budget);
        let rtt = Duration::from_millis(100);
        {
            let a = l.open_recv();
            let sa = l.open_send(a.initial().unwrap_or_default());
            simulate(&a, &sa, rtt, 12);
            assert_eq!(window(&a), 16 << 20);
        }
        let gates: Vec<_> = (0..16)
            .map(|_| {
                let g = l.open_recv();
                let s = l.open_send(g.initial().unwrap_or_default());
                (g, s)
            })
            .collect();
        let initials: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        // Each starts at its share among those open: 16, 8, 5.3, 4 MiB, and
        // the rest at the floor once half the budget is taken.
        assert_eq!(initials[..4], [16 << 20, 8 << 20, (16 << 20) / 3, 4 << 20]);
        assert!(
            initials[4..].iter().all(|w| *w == FLOOR_WINDOW),
            "{initials:?}"
        );
        // The link carries 12 MiB per round trip. After the first round trip
        // of data, every connection that kept its window full holds at least
        // its share of the 16 MiB (not 64 KiB after two doublings).
        let start = Instant::now();
        simulate_link(&gates, start, rtt, 12 << 20, Order::Turns, 3);
        let windows: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        assert!(windows.iter().all(|w| *w >= 1 << 20), "{windows:?}");
        simulate_link(&gates, start + rtt * 3, rtt, 12 << 20, Order::Turns, 20);
        let windows: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        assert!(windows.iter().sum::<i64>() <= budget, "{windows:?}");
        assert!(l.budget.used() <= budget);
        drop(gates);
        assert_eq!(l.budget.used(), 0);
        assert_eq!(l.stats.windows(), 0);
        assert_eq!(l.shared.moving.load(Ordering::Relaxed), 0);
    }

    /// 16 connections opened at once on a link (budget 64 MiB, windows up
    /// to 32 MiB) whose connections lately carried `warm` per round trip.
    fn burst_after(warm: i64) -> (LinkFlow, Vec<(RecvGate, SendGate)>) {
        let l = link(256 << 10, 32 << 20, 64 << 20);
        l.shared.warm.lock().note(warm, Instant::now());
        let gates = (0..16)
            .map(|_| {
                let g = l.open_recv();
                let s = l.open_send(g.initial().unwrap_or_default());
                (g, s)
            })
            .collect();
        (l, gates)
    }

    /// What each connection delivered over ten round trips at 100 ms on a
    /// link that carries 20 MiB per round trip, less than the windows
    /// together may hold, after thirty to settle.
    fn settle_and_measure(gates: &[(RecvGate, SendGate)]) -> Vec<i64> {
        let rtt = Duration::from_millis(100);
        let start = Instant::now();
        simulate_link(gates, start, rtt, 20 << 20, Order::Arrival, 30);
        simulate_link(gates, start + rtt * 30, rtt, 20 << 20, Order::Arrival, 10)
    }

    #[test]
    fn windows_above_their_fair_share_yield_to_those_the_budget_holds_back() {
        // P10, 16 tunnels at 100 ms, after a warm-up of 16 whose windows
        // carried 4 MiB: each new one started at its share among those open
        // then (4, 2, 1.3, 1 MiB, ...), all doubled alike until the budget
        // was used up, and kept those proportions. A tunnel's share of the
        // link follows its window, so they finished from 1.6 s to 3.7 s and
        // the last ones ran alone.
        let (l, gates) = burst_after(4 << 20);
        let initials: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        assert_eq!(initials[..4], [4 << 20, 2 << 20, (4 << 20) / 3, 1 << 20]);
        let delivered = settle_and_measure(&gates);
        let windows: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        let fair = l.budget.limit() / 16;
        assert!(
            windows.iter().all(|w| *w <= fair && *w >= fair / 2),
            "every window within half of its fair share {fair}: {windows:?}"
        );
        let (least, most) = (
            delivered.iter().min().copied().unwrap_or_default(),
            delivered.iter().max().copied().unwrap_or_default(),
        );
        assert!(
            most <= least * 2,
            "each moved about as much as the others: {delivered:?}"
        );
        assert!(l.budget.used() <= l.budget.limit());
        drop(gates);
        assert_eq!(l.budget.used(), 0);
        assert_eq!(l.stats.windows(), 0);
        assert_eq!(l.shared.starved.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_window_that_started_large_yields_down_to_two_of_the_largest_packets() {
        // One tunnel had grown to the 32 MiB maximum, then 16 started
        // together: the first at 32 MiB, half the budget, so the other 15
        // at the floor.
        let (l, gates) = burst_after(32 << 20);
        assert_eq!(window(&gates[0].0), 32 << 20);
        assert!(gates[1..].iter().all(|(g, _)| window(g) == FLOOR_WINDOW));
        let delivered = settle_and_measure(&gates);
        let windows: Vec<_> = gates.iter().map(|(g, _)| window(g)).collect();
        // It gives back all but 8 MiB (it promised its sender at set-up that
        // half its initial window, up to a largest packet, would come back
        // into its hands); the others share the rest.
        let fair = l.budget.limit() / 16;
        assert_eq!(windows[0], 2 * MAX_PACKET);
        assert!(
            windows[1..].iter().all(|w| *w <= fair && *w >= fair / 2),
            "{windows:?}"
        );
        assert!(windows.iter().sum::<i64>() <= l.budget.limit());
        let least = delivered.iter().min().copied().unwrap_or_default();
        assert!(delivered[0] <= least * 4, "{delivered:?}");
    }

    #[test]
    fn readers_that_never_read_take_at_most_half_the_budget_with_their_initial_windows() {
        let l = link(256 << 10, 16 << 20, 8 << 20);
        let stalled: Vec<_> = (0..100).map(|_| l.open_recv()).collect();
        let initials: i64 = stalled.iter().filter_map(RecvGate::initial).sum();
        let big = stalled
            .iter()
            .filter(|g| g.initial() == Some(256 << 10))
            .count() as i64;
        assert_eq!(big, 16, "256 KiB windows until half of 8 MiB is taken");
        assert_eq!(initials, big * (256 << 10) + (100 - big) * FLOOR_WINDOW);
        // The other half is there for a connection whose reader keeps up.
        let active = l.open_recv();
        let send = l.open_send(active.initial().unwrap_or_default());
        let moved = simulate(&active, &send, Duration::from_millis(20), 12);
        assert!(
            window(&active) >= 2 << 20,
            "{} after {moved}",
            window(&active)
        );
        assert!(l.budget.used() <= 8 << 20);
    }

    #[test]
    fn a_slow_reader_does_not_grow_its_window() {
        let l = link(64 << 10, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        let RecvGate::Window(w) = &gate else {
            panic!("not a window")
        };
        let mut now = Instant::now();
        // The sender fills the window at once; the reader takes 4 KiB per
        // 10 ms; credit and data take 25 ms each way.
        let mut pending: Vec<(Instant, i64)> = Vec::new();
        let mut credit = 64 << 10;
        let mut parked = 0;
        for _ in 0..500 {
            now += Duration::from_millis(10);
            for (_, g) in pending.iter().filter(|(t, _)| *t <= now) {
                credit += g;
            }
            pending.retain(|(t, _)| *t > now);
            while credit >= 4096 {
                credit -= 4096;
                assert_eq!(w.admit(4096, now), Ok(()));
                parked += 4096;
            }
            if parked >= 4096 {
                parked -= 4096;
                if let Some(g) = w.consumed(4096, now) {
                    pending.push((now + Duration::from_millis(50), g));
                }
            }
        }
        assert_eq!(window(&gate), 64 << 10);
    }

    #[tokio::test]
    async fn an_idle_window_shrinks_back_and_asks_for_its_credit() {
        let l = link(64 << 10, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        let send = l.open_send(gate.initial().unwrap_or_default());
        simulate(&gate, &send, Duration::from_millis(10), 20);
        let grown = window(&gate);
        assert!(grown > 1 << 20, "{grown}");
        // Idle: nothing moves for a second; sweeps halve the window.
        let start = Instant::now();
        assert_eq!(gate.sweep(start), None, "not idle yet");
        let mut revoked = 0;
        for i in 1..40 {
            let now = start + DEFAULT_IDLE + SWEEP_INTERVAL * i;
            match gate.sweep(now) {
                Some(Sweep::Revoke(n)) => {
                    revoked += n;
                    let back = send.give_back(n);
                    if let Some(g) = gate.returned(back) {
                        send.grant(g);
                    }
                }
                Some(Sweep::Grant(_)) | None => {}
            }
        }
        assert_eq!(window(&gate), 64 << 10);
        assert!(revoked > 0);
        // The sender keeps what it may still use; the budget keeps only
        // the window and the credit the sender still holds.
        assert!(send.credit() <= 64 << 10, "{}", send.credit());
        assert_eq!(l.budget.used(), 64 << 10);
        assert_eq!(l.stats.windows(), 64 << 10);
    }

    /// The receiver asks for unused credit back while the sender has data
    /// on its way, and passes that data on before the sender's answer
    /// arrives. The sender gave back what it held, so it is left with less
    /// than a packet needs, and nothing more will be passed on to trigger a
    /// grant: the answer itself must bring the grant that is due, or both
    /// sides wait for ever. (With 300 tunnels on one reusable tunnel the
    /// frontend's HTTP/2 window kept some tunnels' data back for a second,
    /// their windows at the agent shrank, and 3 of 4 runs hung.)
    #[tokio::test]
    async fn credit_given_back_after_the_data_in_flight_was_passed_on_is_granted_again() {
        let l = link(16 << 20, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        assert_eq!(gate.initial(), Some(16 << 20));
        let send = l.open_send(16 << 20);
        // Two packets leave; nothing has arrived yet.
        send.acquire(MAX_PACKET as usize).await;
        send.acquire(MAX_PACKET as usize).await;
        // The receiver saw nothing move for a while: its window halves and
        // it asks for the credit above the new window.
        let asked = match gate.sweep(Instant::now() + DEFAULT_IDLE + SWEEP_INTERVAL) {
            Some(Sweep::Revoke(n)) => n,
            other => panic!("want a request for credit back, got {other:?}"),
        };
        assert_eq!(window(&gate), 8 << 20);
        // The packets arrive and are passed on before the request reaches
        // the sender; passing them on grants nothing (the sender still
        // seems to hold a window's worth).
        for _ in 0..2 {
            assert_eq!(gate.admit(MAX_PACKET as usize).await, Ok(()));
            assert_eq!(gate.consumed(MAX_PACKET as usize), None);
        }
        // The sender answers with all it had left.
        let back = send.give_back(asked);
        assert_eq!(send.credit(), 0);
        if let Some(g) = gate.returned(back) {
            send.grant(g);
        }
        assert_eq!(send.credit(), 8 << 20, "topped up to the window");
        let next = tokio::time::timeout(Duration::from_secs(5), send.acquire(MAX_PACKET as usize));
        assert!(
            next.await.is_ok(),
            "the sender's next packet waited for ever"
        );
        assert_eq!(gate.admit(MAX_PACKET as usize).await, Ok(()));
    }

    #[tokio::test]
    async fn a_stalled_reader_parks_at_most_its_window_and_the_window_shrinks() {
        let l = link(256 << 10, 16 << 20, 1 << 30);
        let gate = l.open_recv();
        let send = l.open_send(gate.initial().unwrap_or_default());
        simulate(&gate, &send, Duration::from_millis(10), 10);
        let grown = window(&gate);
        // The reader stops; the sender spends all its credit.
        let mut parked = 0;
        while send.credit() >= 16 << 10 {
            send.acquire(16 << 10).await;
            assert_eq!(gate.admit(16 << 10).await, Ok(()));
            parked += 16 << 10;
        }
        assert!(parked <= grown);
        assert_eq!(
            gate.admit(16 << 10).await,
            Err(GateError::Exceeded(grown)),
            "nothing past the credit"
        );
        let start = Instant::now();
        for i in 1..40 {
            if let Some(Sweep::Revoke(n)) = gate.sweep(start + DEFAULT_IDLE + SWEEP_INTERVAL * i)
                && let Some(g) = gate.returned(send.give_back(n))
            {
                send.grant(g);
            }
        }
        assert_eq!(window(&gate), 256 << 10);
        // What is parked stays reserved until it is read.
        assert_eq!(l.budget.used(), parked.max(256 << 10));
        assert_eq!(l.stats.parked(), parked);
    }

    #[tokio::test]
    async fn an_oversize_packet_passes_with_half_the_initial_window_in_hand() {
        let l = link(64 << 10, 1 << 20, 1 << 30);
        let gate = l.open_recv();
        let send = l.open_send(gate.initial().unwrap_or_default());
        // Small packets first: their credit is not returned yet (less than
        // a quarter window), yet a packet of the whole window must pass.
        for _ in 0..3 {
            send.acquire(10).await;
            assert_eq!(gate.admit(10).await, Ok(()));
            assert_eq!(gate.consumed(10), None);
        }
        let whole = tokio::time::timeout(Duration::from_secs(5), send.acquire(64 << 10)).await;
        assert!(
            whole.is_ok(),
            "a window-sized packet after small ones waited forever"
        );
        assert_eq!(gate.admit(64 << 10).await, Ok(()));
        assert_eq!(gate.consumed(64 << 10), Some((64 << 10) + 3 * MIN_COST));
        send.grant((64 << 10) + 3 * MIN_COST);
        send.acquire(MAX_PACKET as usize).await;
        assert_eq!(gate.admit(MAX_PACKET as usize).await, Ok(()));
        assert!(send.credit() < 0);
        let s2 = Arc::new(l.open_send(64 << 10));
        s2.acquire(64 << 10).await;
        let waiting = tokio::spawn({
            let s2 = s2.clone();
            async move { s2.acquire(10).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        s2.grant(MIN_COST);
        waiting.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn costs_and_offers() {
        assert_eq!(cost(1), MIN_COST);
        assert_eq!(cost(65536), 65536);
        assert_eq!(parse_offer(Some(&offer(1 << 20))), Some(1 << 20));
        assert_eq!(parse_offer(Some("v2 max=1")), Some(MIN_WINDOW));
        assert_eq!(parse_offer(Some(&offer(1i64 << 40))), Some(MAX_WINDOW));
        assert_eq!(parse_offer(Some("1048576")), None, "the old header's value");
        assert_eq!(parse_offer(Some("v3 max=1")), None);
        assert_eq!(parse_offer(None), None);
        let agreed = WindowConfig::default().agreed(1 << 20);
        assert_eq!(agreed.max, 1 << 20);
        assert_eq!(agreed.initial, DEFAULT_INITIAL_WINDOW);
    }

    #[tokio::test]
    async fn the_next_read_follows_the_credit_in_hand_within_its_bounds() {
        let gate = SendGate::new(1 << 20);
        const MAX: usize = 64 << 10;
        assert_eq!(gate.next_read(MAX), MAX, "plenty of credit: a full read");
        gate.acquire((1 << 20) - 40_000).await;
        assert_eq!(gate.next_read(MAX), 40_000, "no more than the credit");
        gate.acquire(40_000).await;
        assert_eq!(gate.credit(), 0);
        assert_eq!(gate.next_read(MAX), READ_AHEAD, "none left: read ahead");
        assert_eq!(read_size(Some(&gate)), READ_AHEAD);
        assert_eq!(
            read_size(None),
            crate::chunks::MAX_CHUNK,
            "no flow control: full chunks"
        );
        // An oversize packet took the credit below zero.
        gate.grant(1 << 19);
        gate.acquire(1 << 20).await;
        assert!(gate.credit() < 0);
        assert_eq!(gate.next_read(MAX), READ_AHEAD);
        assert_eq!(
            gate.next_read(4 << 10),
            4 << 10,
            "never past the caller's max"
        );
    }

    /// Closing the gate wakes every sender waiting for credit, not one
    /// (server/fuzz/corpus/packets/crash-66f41d0f…: a second waiter hung).
    #[tokio::test]
    async fn closing_wakes_every_waiting_sender() {
        let gate = Arc::new(SendGate::new(MIN_COST));
        gate.acquire(1).await;
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let g = gate.clone();
                tokio::spawn(async move { g.acquire(1 << 20).await })
            })
            .collect();
        tokio::task::yield_now().await;
        gate.close();
        for w in waiters {
            let done = tokio::time::timeout(std::time::Duration::from_secs(10), w).await;
            assert!(
                matches!(done, Ok(Ok(()))),
                "a sender still waits on a closed gate"
            );
        }
    }
}
