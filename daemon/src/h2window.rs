//! HTTP/2 receive windows that follow the link, for connections served with
//! the `h2` crate directly (the Konnectivity agent link on both ends, the
//! tunnel-agent ↔ nodeport-proxy tunnels), plus the keepalive PINGs of such
//! a connection, since both share its one PING in flight.
//!
//! A fixed window caps a connection at window ÷ round trip (4 MiB at 50 ms
//! is 80 MiB/s). Like grpc-go's BDP estimator, the [`Controller`] times a
//! PING sent while data arrives and counts the bytes readers took meanwhile:
//! when that round trip carried at least two thirds of the window that was in
//! effect, the window was the limit and doubles, up to the configured
//! maximum and only as far as the connection's and the process's [`Budget`]s
//! allow. A connection whose data stops for [`WindowSettings::idle`] halves
//! its window per idle period back to the initial one. That retracts
//! nothing the peer was already granted, so the budget gets the difference
//! back only as the peer uses that grant up (each byte readers take), or
//! when the connection ends. Only the connection window shrinks: lowering
//! SETTINGS_INITIAL_WINDOW_SIZE can leave a stream's advertised window at
//! zero with nothing left to prompt a WINDOW_UPDATE (the `h2` crate sends one
//! only when a reader releases data), so a stream window, once grown, stays,
//! and the connection window bounds what all streams hold. A PING follows
//! only data that arrived after the previous PONG (a grpc-go server counts
//! PINGs without data in between as abuse).
//!
//! With many streams on one connection (tunnels), a stream whose reader stops
//! holds its stream window of the connection window until it reads again.
//! So the connection window is twice the stream window plus what stopped
//! streams hold ([`Meter::held`]), bounded by the budgets: one stalled tunnel
//! does not stop the others; only the budget does, by design.
//!
//! The windows a connection starts with are reserved too ([`Start`]), before
//! its handshake advertises them: once the budget is spent, a new connection
//! starts at HTTP/2's own 65,535 bytes and grows only as budget comes free,
//! so what all peers together can make a process buffer is its budget plus,
//! past it, 65,535 bytes per connection.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use h2::{FlowControl, Ping, PingPong};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::budget::Budget;

/// HTTP/2's own initial window (RFC 9113 §6.9.2).
pub const SPEC_WINDOW: u32 = 65_535;

/// How a connection's windows behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSettings {
    /// The stream window a connection starts with.
    pub initial: u32,
    /// The largest stream window.
    pub max: u32,
    /// The most the connection may have in flight towards us (its connection
    /// window), stopped streams included; at least `2 × initial`.
    pub connection_budget: i64,
    /// How long data may stop before the windows shrink.
    pub idle: Duration,
    /// One stream per connection (the Konnectivity agent link): the
    /// connection window equals the stream window.
    pub single_stream: bool,
}

impl WindowSettings {
    /// The connection window a connection starts with.
    pub fn initial_connection(&self) -> u32 {
        if self.single_stream {
            self.initial
        } else {
            self.initial.saturating_mul(2).max(1 << 20)
        }
    }
}

/// Keepalive as grpc-go's: a PING once nothing has arrived from the peer for
/// `interval` (its frames, its own PINGs included, show it is alive; a BDP
/// PING counts as ours), answered within `timeout`; so a peer that froze is
/// found out at most `interval + timeout` after it was last heard. Never two
/// PINGs closer than `min_gap` (a grpc-go server ends a connection that
/// pings more often than its enforcement policy allows). Without a counted
/// socket the peer is never heard, and with `min_gap == interval` that is
/// Envoy's `connection_keepalive`: a PING every `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
    pub min_gap: Duration,
}

/// Totals over every connection of a process, for its metrics.
#[derive(Debug, Default)]
pub struct WindowStats {
    stream_windows: AtomicI64,
    connection_windows: AtomicI64,
    held: AtomicI64,
}

impl WindowStats {
    /// Sum of the current stream windows of all connections.
    pub fn stream_windows(&self) -> i64 {
        self.stream_windows.load(Ordering::Relaxed)
    }

    /// Sum of the current connection windows of all connections.
    pub fn connection_windows(&self) -> i64 {
        self.connection_windows.load(Ordering::Relaxed)
    }

    /// Bytes received and not yet taken by readers that stopped, as of the
    /// controllers' last look.
    pub fn held(&self) -> i64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// What the connections of one process share: the budget their windows are
/// reserved from, and the totals for metrics.
#[derive(Debug)]
pub struct Pool {
    pub budget: Arc<Budget>,
    pub stats: Arc<WindowStats>,
}

impl Pool {
    /// A pool whose connections together may have `budget` bytes in flight.
    pub fn new(budget: i64) -> Arc<Pool> {
        Arc::new(Pool {
            budget: Budget::new(budget, None),
            stats: Arc::default(),
        })
    }

    /// The windows a new connection of this pool starts with, reserved
    /// before its handshake advertises them.
    pub fn start(&self, settings: WindowSettings) -> Start {
        Start::new(settings, &self.budget, self.stats.clone())
    }
}

/// The windows a connection starts with, reserved from its budget (inside
/// the process's) before the handshake advertises them: the settings'
/// initial windows while the budget has room, as much as it has left when
/// it has little, and once it is spent HTTP/2's own 65,535 bytes
/// ([`SPEC_WINDOW`]), which every peer may send before it hears from us
/// and which is therefore reserved whether it fits or not. A window that
/// starts small grows only as budget comes free. Given back when dropped,
/// unless a [`Controller`] took it over.
#[derive(Debug)]
pub struct Start {
    settings: WindowSettings,
    budget: Arc<Budget>,
    stats: Arc<WindowStats>,
    stream: u32,
    connection: u32,
    reserved: i64,
}

impl Start {
    /// `process` is the process's budget, `stats` its totals.
    pub fn new(settings: WindowSettings, process: &Arc<Budget>, stats: Arc<WindowStats>) -> Start {
        let budget = Budget::new(settings.connection_budget, Some(process.clone()));
        let want = i64::from(settings.initial_connection());
        let floor = want.min(i64::from(SPEC_WINDOW));
        let mut reserved = budget.try_reserve(want);
        if reserved < floor {
            budget.force(floor - reserved);
            reserved = floor;
        }
        let connection = u32::try_from(reserved).unwrap_or(SPEC_WINDOW);
        // Short of the budget, one stream may use the whole window.
        let stream = connection.min(settings.initial);
        Start {
            settings,
            budget,
            stats,
            stream,
            connection,
            reserved,
        }
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE to advertise.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The connection window to advertise.
    pub fn connection(&self) -> u32 {
        self.connection
    }
}

impl Drop for Start {
    fn drop(&mut self) {
        self.budget.release(self.reserved);
    }
}

/// Gauges of a [`Pool`], set from it whenever metrics are rendered.
pub struct PoolGauges {
    pool: std::sync::OnceLock<Arc<Pool>>,
    stream: metrics::Gauge,
    connection: metrics::Gauge,
    held: metrics::Gauge,
    reserved: metrics::Gauge,
    budget: metrics::Gauge,
}

/// The names of a [`PoolGauges`]' gauges (a process's own prefix).
pub struct PoolGaugeNames {
    pub stream_windows: &'static str,
    pub connection_windows: &'static str,
    pub held: &'static str,
    pub reserved: &'static str,
    pub budget: &'static str,
}

impl PoolGauges {
    /// Registers and describes the gauges; `budget_flag` names the flag
    /// that sets the budget, for the help text.
    pub fn new(r: &crate::metrics::Registry, n: PoolGaugeNames, budget_flag: &'static str) -> Self {
        r.describe_gauge(
            n.stream_windows,
            "Sum of the current HTTP/2 stream windows of the connections (each grows with its link).",
        );
        r.describe_gauge(
            n.connection_windows,
            "Sum of the current HTTP/2 connection windows: what the peers may have in flight to this process.",
        );
        r.describe_gauge(
            n.held,
            "Bytes received on streams whose readers have not taken them yet (stalled streams), as last looked at.",
        );
        r.describe_gauge(
            n.reserved,
            "Bytes of the memory budget the HTTP/2 windows hold: what peers may still send us plus what they sent that readers have not taken (a window that shrank keeps its share until the peer used its grant).",
        );
        r.describe_gauge(n.budget, budget_flag);
        PoolGauges {
            pool: std::sync::OnceLock::new(),
            stream: r.gauge(n.stream_windows, &[]),
            connection: r.gauge(n.connection_windows, &[]),
            held: r.gauge(n.held, &[]),
            reserved: r.gauge(n.reserved, &[]),
            budget: r.gauge(n.budget, &[]),
        }
    }

    /// Shows `pool` from now on.
    pub fn watch(&self, pool: Arc<Pool>) {
        let _ = self.pool.set(pool);
    }

    /// Sets the gauges from the pool (before rendering).
    pub fn update(&self) {
        let Some(p) = self.pool.get() else { return };
        self.stream.set(p.stats.stream_windows() as f64);
        self.connection.set(p.stats.connection_windows() as f64);
        self.held.set(p.stats.held() as f64);
        self.reserved.set(p.budget.used() as f64);
        self.budget.set(p.budget.limit() as f64);
    }
}

/// What a connection's readers report: the bytes they took, and (with many
/// streams) each stream's flow control, to see what stopped streams hold;
/// and when bytes last arrived on its socket ([`Meter::counted`]).
pub struct Meter {
    taken: AtomicU64,
    /// Nanoseconds after `born` plus one that bytes last arrived; 0: never.
    heard: AtomicU64,
    born: Instant,
    want_wake: AtomicBool,
    /// The controller wants waking once `taken` reaches this.
    wake_at: AtomicU64,
    waker: AtomicWaker,
    streams: Mutex<Streams>,
}

#[derive(Default)]
struct Streams {
    next: u64,
    flows: HashMap<u64, FlowControl>,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("taken", &self.taken.load(Ordering::Relaxed))
            .finish()
    }
}

impl Meter {
    pub fn new() -> Arc<Meter> {
        Arc::new(Meter {
            taken: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            born: Instant::now(),
            want_wake: AtomicBool::new(false),
            wake_at: AtomicU64::new(0),
            waker: AtomicWaker::new(),
            streams: Mutex::default(),
        })
    }

    /// A reader took `len` bytes off the connection.
    pub fn record(&self, len: usize) {
        let taken = self.taken.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        if self.want_wake.load(Ordering::Relaxed)
            && taken >= self.wake_at.load(Ordering::Relaxed)
            && self.want_wake.swap(false, Ordering::AcqRel)
        {
            self.waker.wake();
        }
    }

    /// Wakes `cx`'s task once readers have taken `at` bytes in all.
    fn wake_when(&self, cx: &mut Context<'_>, at: u64) {
        self.waker.register(cx.waker());
        self.wake_at.store(at, Ordering::Relaxed);
        self.want_wake.store(true, Ordering::Release);
        // Data that came in between counts as well.
        if self.taken() >= at {
            cx.waker().wake_by_ref();
        }
    }

    /// Watches a stream's flow control until the returned guard drops.
    pub fn register(self: &Arc<Self>, flow: FlowControl) -> Registration {
        let mut s = self.streams.lock();
        let id = s.next;
        s.next += 1;
        s.flows.insert(id, flow);
        Registration {
            meter: self.clone(),
            id,
        }
    }

    /// Bytes received on registered streams and not yet released.
    pub fn held(&self) -> i64 {
        let s = self.streams.lock();
        s.flows
            .values()
            .map(|f| i64::try_from(f.used_capacity()).unwrap_or(i64::MAX))
            .sum()
    }

    fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// When bytes last arrived on the counted socket.
    fn heard(&self) -> Option<Instant> {
        match self.heard.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.born + Duration::from_nanos(n - 1)),
        }
    }

    /// The connection's socket, noting when bytes arrive on it: `h2`
    /// answers the peer's PINGs without telling anyone, and they show it is
    /// alive.
    pub fn counted<IO>(self: &Arc<Self>, io: IO) -> Counted<IO> {
        Counted {
            io,
            meter: self.clone(),
        }
    }
}

/// A socket whose arriving bytes are noted in a [`Meter`].
pub struct Counted<IO> {
    io: IO,
    meter: Arc<Meter>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let m = &self.meter;
            let at = Instant::now().saturating_duration_since(m.born);
            let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1);
            m.heard.store(nanos + 1, Ordering::Relaxed);
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Keeps a stream registered with its connection's [`Meter`].
pub struct Registration {
    meter: Arc<Meter>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.meter.streams.lock().flows.remove(&self.id);
    }
}

/// What the connection's driver must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `set_target_window_size(connection)`, and `set_initial_window_size`
    /// when the stream window grew.
    Resize {
        stream: Option<u32>,
        connection: u32,
    },
    /// A keepalive PING went unanswered: close the connection.
    KeepaliveTimedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PingKind {
    Bdp,
    Keepalive,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    sent: Instant,
    taken: u64,
    kind: PingKind,
    /// The stream window that limited data during this round trip.
    window: u32,
}

/// How often held bytes are looked at while streams may be stopped.
const HELD_INTERVAL: Duration = Duration::from_millis(500);
/// The longest pause between BDP PINGs once the window stopped growing.
const MAX_BDP_PAUSE: Duration = Duration::from_secs(5);

/// Drives one connection's windows and keepalive; polled by the task that
/// drives the connection (only it may resize the windows).
pub struct Controller {
    pings: PingPong,
    settings: WindowSettings,
    keepalive: Option<Keepalive>,
    meter: Arc<Meter>,
    budget: Arc<Budget>,
    stats: Arc<WindowStats>,
    /// The window the link is given now (follows the BDP estimate, grows
    /// and shrinks); the connection window follows it.
    target: u32,
    /// The advertised stream window: follows `target` up, never down.
    stream: u32,
    connection: u32,
    /// The connection window it started with: it never shrinks below.
    base_connection: u32,
    /// Bytes reserved in the budget: the connection window, and after it
    /// shrank, what the peer may still send of what it was granted before.
    reserved: i64,
    /// Stream window before the last growth (what the next PING measures).
    sampled: u32,
    /// Held bytes as last seen.
    held: i64,
    in_flight: Option<InFlight>,
    /// Bytes taken when the last PONG arrived: a new PING needs more.
    taken_at_pong: u64,
    /// When the next BDP PING may go.
    next_bdp: Instant,
    bdp_pause: Duration,
    last_taken: u64,
    last_data: Instant,
    last_ping: Instant,
    /// When the peer was last heard (bytes arrived on the socket).
    last_heard: Instant,
    last_held_check: Instant,
    min_rtt: Option<Duration>,
    /// PINGs answered so far.
    pongs: u64,
    timer: Pin<Box<Sleep>>,
    /// A resize the driver could not apply yet, and when to offer it again.
    pending: Option<(Action, Instant)>,
}

impl Controller {
    /// A controller for a connection that starts with `start`'s windows
    /// (and their reservation); the windows never shrink below them.
    pub fn new(
        pings: PingPong,
        mut start: Start,
        keepalive: Option<Keepalive>,
        meter: Arc<Meter>,
    ) -> Controller {
        let stats = start.stats.clone();
        let settings = WindowSettings {
            initial: start.stream,
            ..start.settings
        };
        let (connection, reserved) = (start.connection, std::mem::take(&mut start.reserved));
        stats
            .stream_windows
            .fetch_add(i64::from(settings.initial), Ordering::Relaxed);
        stats
            .connection_windows
            .fetch_add(i64::from(connection), Ordering::Relaxed);
        let now = Instant::now();
        Controller {
            pings,
            settings,
            keepalive,
            meter,
            budget: start.budget.clone(),
            stats,
            target: settings.initial,
            stream: settings.initial,
            connection,
            base_connection: connection,
            reserved,
            sampled: settings.initial,
            held: 0,
            in_flight: None,
            taken_at_pong: 0,
            next_bdp: now,
            bdp_pause: Duration::ZERO,
            last_taken: 0,
            last_data: now,
            // The first keepalive PING waits for the interval only (a
            // grpc-go server counts no gap before it).
            last_ping: keepalive
                .and_then(|k| now.checked_sub(k.min_gap))
                .unwrap_or(now),
            last_heard: now,
            last_held_check: now,
            min_rtt: None,
            pongs: 0,
            timer: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            pending: None,
        }
    }

    /// The window the link is given now.
    pub fn window(&self) -> u32 {
        self.target
    }

    /// The current connection window.
    pub fn connection_window(&self) -> u32 {
        self.connection
    }

    /// The smallest PING round trip seen.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// PINGs the peer answered so far (it is alive and reading).
    pub fn pongs(&self) -> u64 {
        self.pongs
    }

    /// Waits for the next thing the driver must do. Cancel-safe.
    pub async fn next(&mut self) -> Action {
        std::future::poll_fn(|cx| self.poll_action(cx)).await
    }

    pub fn poll_action(&mut self, cx: &mut Context<'_>) -> Poll<Action> {
        let now = Instant::now();
        if let Some((a, at)) = self.pending
            && now >= at
        {
            self.pending = None;
            return Poll::Ready(a);
        }
        let taken = self.meter.taken();
        if taken != self.last_taken {
            self.pay_owed(taken - self.last_taken);
            self.last_taken = taken;
            self.last_data = now;
        }
        if let Some(at) = self.meter.heard() {
            self.last_heard = self.last_heard.max(at);
        }
        if let Some(p) = self.in_flight {
            match self.pings.poll_pong(cx) {
                Poll::Ready(Ok(_)) => {
                    self.in_flight = None;
                    self.pongs += 1;
                    self.taken_at_pong = taken;
                    let rtt = now.saturating_duration_since(p.sent);
                    self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
                    if p.kind == PingKind::Bdp
                        && let Some(a) = self.sampled(p, taken)
                    {
                        return Poll::Ready(a);
                    }
                }
                // The connection is going away; its driver sees that.
                Poll::Ready(Err(_)) => self.in_flight = None,
                // Any PING answers for liveness: a BDP PING that stays
                // unanswered means a frozen peer as much as a keepalive one.
                Poll::Pending => {
                    if let Some(k) = self.keepalive
                        && now.saturating_duration_since(p.sent) >= k.timeout
                    {
                        return Poll::Ready(Action::KeepaliveTimedOut);
                    }
                }
            }
        }
        if self.in_flight.is_none() {
            let due = now >= self.next_bdp || self.burst_due(taken, now);
            if taken > self.taken_at_pong && due && self.wants_bdp() {
                self.send(PingKind::Bdp, taken, now);
            } else if let Some(k) = self.keepalive
                && now >= self.keepalive_due(k)
            {
                self.send(PingKind::Keepalive, taken, now);
            }
        }
        if let Some(a) = self.shrink_if_idle(now) {
            return Poll::Ready(a);
        }
        if !self.settings.single_stream
            && now.saturating_duration_since(self.last_held_check) >= HELD_INTERVAL
        {
            self.last_held_check = now;
            if let Some(a) = self.follow_held() {
                return Poll::Ready(a);
            }
        }
        self.arm(cx, now, taken);
        Poll::Pending
    }

    /// When a keepalive PING is due (none in flight).
    fn keepalive_due(&self, k: Keepalive) -> Instant {
        (self.last_heard + k.interval).max(self.last_ping + k.min_gap)
    }

    /// Readers took a window's worth (two thirds, the mark a round trip must
    /// carry to count as limited) since the last PONG, so the link may now be
    /// limited even if the last samples said otherwise: a quiet spell before
    /// a transfer must not keep the window small for the up to
    /// [`MAX_BDP_PAUSE`] the backoff reached (with one tunnel uploading 256
    /// MiB at 10 ms from upstream's server the window stayed at 1 MiB for the
    /// whole transfer: 68 MiB/s). At most one such PING per
    /// [`Controller::burst_gap`].
    fn burst_due(&self, taken: u64, now: Instant) -> bool {
        taken >= self.burst_mark() && now >= self.last_ping + self.burst_gap()
    }

    fn burst_mark(&self) -> u64 {
        self.taken_at_pong + u64::from(self.target) * 2 / 3
    }

    /// The least pause after a sample that was not the limit (see `sampled`).
    fn burst_gap(&self) -> Duration {
        (self.min_rtt.unwrap_or_default() * 4).max(Duration::from_millis(50))
    }

    /// Whether a BDP PING could still change anything.
    fn wants_bdp(&self) -> bool {
        self.target < self.settings.max && !self.budget.is_full()
    }

    fn send(&mut self, kind: PingKind, taken: u64, now: Instant) {
        if self.pings.send_ping(Ping::opaque()).is_ok() {
            self.in_flight = Some(InFlight {
                sent: now,
                taken,
                kind,
                window: self.sampled,
            });
            self.last_ping = now;
        }
    }

    /// A BDP round trip completed: grow when the window was the limit.
    fn sampled(&mut self, p: InFlight, taken: u64) -> Option<Action> {
        let delivered = taken.saturating_sub(p.taken);
        let limit = u64::from(p.window);
        self.sampled = self.target;
        if delivered * 3 >= limit * 2 && self.target < self.settings.max {
            let want = self.target.saturating_mul(2).min(self.settings.max);
            self.bdp_pause = Duration::ZERO;
            self.next_bdp = Instant::now();
            return self.resize(want);
        }
        // Not the limit: look again later, less and less often (or when a
        // window's worth arrives, `burst_due`).
        self.bdp_pause = (self.bdp_pause * 2)
            .max(self.burst_gap())
            .min(MAX_BDP_PAUSE);
        self.next_bdp = Instant::now() + self.bdp_pause;
        None
    }

    fn shrink_if_idle(&mut self, now: Instant) -> Option<Action> {
        if self.target <= self.settings.initial
            || now.saturating_duration_since(self.last_data) < self.settings.idle
        {
            return None;
        }
        // One halving per idle period.
        self.last_data = now;
        let want = (self.target / 2).max(self.settings.initial);
        self.sampled = want;
        self.resize(want)
    }

    /// With many streams: the connection window also covers what stopped
    /// streams hold.
    fn follow_held(&mut self) -> Option<Action> {
        let held = self.meter.held();
        let before = self.held;
        self.held = held;
        self.stats.held.fetch_add(held - before, Ordering::Relaxed);
        if held == before {
            return None;
        }
        self.resize(self.target)
    }

    /// Gives the link a window of `target` (or as much of it as the budgets
    /// allow): the connection window to match, the stream window up to it if
    /// it is larger; `None` if nothing changed.
    fn resize(&mut self, target: u32) -> Option<Action> {
        let mut target = target.clamp(self.settings.initial, self.settings.max);
        let mut conn = if self.settings.single_stream {
            i64::from(target)
        } else {
            (i64::from(target) * 2 + self.held).max(i64::from(self.base_connection))
        }
        .min(i64::from(h2_max()));
        if conn > self.reserved {
            let got = self.budget.try_reserve(conn - self.reserved);
            self.reserved += got;
            if self.reserved < conn {
                // The budget decides: grow only as far as it allows.
                conn = self.reserved;
                let room = if self.settings.single_stream {
                    conn
                } else {
                    (conn - self.held) / 2
                };
                let room = u32::try_from(room.max(0)).unwrap_or(u32::MAX);
                target = target.min(room.max(self.settings.initial));
            }
        }
        // A smaller window is not given back yet: what the peer was granted
        // before stays its to send (`pay_owed`).
        let conn = u32::try_from(conn).unwrap_or(h2_max());
        let stream = self.stream.max(target);
        if target == self.target && conn == self.connection && stream == self.stream {
            return None;
        }
        self.stats.stream_windows.fetch_add(
            i64::from(target) - i64::from(self.target),
            Ordering::Relaxed,
        );
        self.stats.connection_windows.fetch_add(
            i64::from(conn) - i64::from(self.connection),
            Ordering::Relaxed,
        );
        let grew = stream > self.stream;
        self.target = target;
        self.stream = stream;
        self.connection = conn;
        Some(Action::Resize {
            stream: grew.then_some(stream),
            connection: conn,
        })
    }

    /// Readers took `n` more bytes. A connection window that shrank
    /// retracts nothing HTTP/2 already granted: `h2` just stops granting
    /// until the peer's grant plus what readers have not taken is down to
    /// the new window, and each byte taken brings it one closer. So
    /// reserved bytes past the window are given back one per byte taken.
    fn pay_owed(&mut self, n: u64) {
        let owed = self.reserved - i64::from(self.connection);
        let pay = owed.min(i64::try_from(n).unwrap_or(i64::MAX));
        if pay > 0 {
            self.budget.release(pay);
            self.reserved -= pay;
        }
    }

    /// The driver could not apply a stream window yet (our previous
    /// SETTINGS is not acknowledged): it is offered again a little later.
    pub fn retry(&mut self, a: Action) {
        let wait = self
            .min_rtt
            .unwrap_or(Duration::from_millis(10))
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        self.pending = Some((a, Instant::now() + wait));
    }

    /// Sleeps until something may be due; data arriving wakes it sooner when
    /// a BDP PING is waiting for it.
    fn arm(&mut self, cx: &mut Context<'_>, now: Instant, taken: u64) {
        let mut wake = now + self.settings.idle.max(Duration::from_millis(100));
        if let Some((_, at)) = self.pending {
            wake = wake.min(at);
        }
        if let Some(p) = self.in_flight {
            if let Some(k) = self.keepalive {
                wake = wake.min(p.sent + k.timeout);
            }
        } else {
            if let Some(k) = self.keepalive {
                wake = wake.min(self.keepalive_due(k));
            }
            if self.wants_bdp() {
                if taken > self.taken_at_pong {
                    wake = wake.min(self.next_bdp);
                    let mark = self.burst_mark();
                    if taken >= mark {
                        wake = wake.min(self.last_ping + self.burst_gap());
                    } else {
                        self.meter.wake_when(cx, mark);
                    }
                } else {
                    self.meter.wake_when(cx, taken + 1);
                }
            }
        }
        if self.target > self.settings.initial {
            wake = wake.min(self.last_data + self.settings.idle);
        }
        if !self.settings.single_stream {
            wake = wake.min(self.last_held_check + HELD_INTERVAL);
        }
        self.timer
            .as_mut()
            .reset(wake.max(now + Duration::from_millis(1)));
        let _ = self.timer.as_mut().poll(cx);
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.budget.release(self.reserved);
        self.stats
            .stream_windows
            .fetch_sub(i64::from(self.target), Ordering::Relaxed);
        self.stats
            .connection_windows
            .fetch_sub(i64::from(self.connection), Ordering::Relaxed);
        self.stats.held.fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// HTTP/2's largest window.
fn h2_max() -> u32 {
    (1 << 31) - 1
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! The controller on a real HTTP/2 connection (`h2grpc::serve` against
    //! an `h2` client) over an in-memory link that delays every chunk by half
    //! the round trip each way, on tokio's paused clock: round trips are
    //! simulated, not waited for.
    use super::*;
    use crate::h2grpc::{H2Config, RecvBody, serve};
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const MIB: u32 = 1 << 20;

    /// Bytes pass after `rtt / 2` each way, without a bandwidth limit; once
    /// `frozen` is set nothing passes any more (a stopped peer whose kernel
    /// still takes the bytes).
    fn delayed_link(rtt: Duration) -> (DuplexStream, DuplexStream, Arc<AtomicBool>) {
        let (near, relay_a) = tokio::io::duplex(1 << 20);
        let (relay_b, far) = tokio::io::duplex(1 << 20);
        let frozen = Arc::new(AtomicBool::new(false));
        let (ar, aw) = tokio::io::split(relay_a);
        let (br, bw) = tokio::io::split(relay_b);
        for (mut from, mut to) in [(ar, bw), (br, aw)] {
            let frozen = frozen.clone();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
            tokio::spawn(async move {
                let mut buf = vec![0; 64 << 10];
                while let Ok(n) = from.read(&mut buf).await {
                    if n == 0
                        || tx
                            .send((Instant::now() + rtt / 2, buf[..n].to_vec()))
                            .is_err()
                    {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                while let Some((at, chunk)) = rx.recv().await {
                    tokio::time::sleep_until(at).await;
                    if !frozen.load(Ordering::Relaxed) && to.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
        (near, far, frozen)
    }

    fn config(max: u32, process_budget: i64, keepalive: Option<Keepalive>) -> H2Config {
        H2Config {
            window: WindowSettings {
                initial: MIB,
                max,
                connection_budget: i64::from(max),
                idle: Duration::from_secs(1),
                single_stream: true,
            },
            keepalive,
            max_frame_size: 16 << 10,
            max_header_list_size: 16 << 10,
            max_concurrent_streams: 10,
            max_send_buffer: 1 << 20,
            process_budget: Budget::new(process_budget, None),
            stats: Arc::default(),
        }
    }

    /// Reads each request body to its end, counting the bytes where a test
    /// can wait for a total.
    #[derive(Clone)]
    struct Sink(Arc<tokio::sync::watch::Sender<u64>>);

    impl tower_service::Service<http::Request<RecvBody>> for Sink {
        type Response = http::Response<http_body_util::Empty<Bytes>>;
        type Error = h2::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, h2::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<RecvBody>) -> Self::Future {
            let n = self.0.clone();
            Box::pin(async move {
                let mut body = req.into_body();
                while let Some(f) = body.frame().await {
                    if let Ok(d) = f?.into_data() {
                        n.send_modify(|v| *v += d.len() as u64);
                    }
                }
                Ok(http::Response::new(http_body_util::Empty::new()))
            })
        }
    }

    /// A client connection to `cfg` served at the far end of a link of
    /// `rtt`: the client, the bytes the server read so far, the server's
    /// task and the link's freeze switch.
    async fn connect(
        cfg: &H2Config,
        rtt: Duration,
    ) -> (
        h2::client::SendRequest<Bytes>,
        tokio::sync::watch::Receiver<u64>,
        tokio::task::JoinHandle<()>,
        Arc<AtomicBool>,
    ) {
        let (client_io, server_io, frozen) = delayed_link(rtt);
        let (read_tx, read) = tokio::sync::watch::channel(0u64);
        let drain = crate::drain::Drain::new();
        let (svc, c) = (Sink(Arc::new(read_tx)), cfg.clone());
        let server = tokio::spawn(async move { serve(server_io, svc, &c, &drain).await });
        let (client, conn) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(conn);
        (client, read, server, frozen)
    }

    /// Serves `cfg` at the far end of a link of `rtt`; the client uploads
    /// `total` bytes on one stream (or freezes the link after
    /// `freeze_after`). Returns the largest connection window seen while the
    /// upload ran, the bytes the server read, the server's task and the
    /// client (the connection lives as long as it does).
    async fn upload(
        cfg: &H2Config,
        rtt: Duration,
        total: usize,
        freeze_after: Option<usize>,
    ) -> (
        i64,
        u64,
        tokio::task::JoinHandle<()>,
        h2::client::SendRequest<Bytes>,
    ) {
        let (mut client, mut read, server, frozen) = connect(cfg, rtt).await;
        let stats = cfg.stats.clone();
        let peak = Arc::new(AtomicI64::new(0));
        let watch = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(stats.connection_windows(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        let req = http::Request::post("http://test/").body(()).unwrap();
        let (_resp, mut send) = client.send_request(req, false).unwrap();
        let chunk = Bytes::from(vec![7u8; 256 << 10]);
        let mut sent = 0;
        while sent < total {
            if freeze_after.is_some_and(|f| sent >= f) {
                frozen.store(true, Ordering::Relaxed);
                break;
            }
            send.reserve_capacity(chunk.len().min(total - sent));
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(n)) if n > 0 => {
                    let n = n.min(total - sent);
                    send.send_data(chunk.slice(..n), false).unwrap();
                    sent += n;
                }
                Some(Ok(_)) => {}
                _ => panic!("stream ended after {sent} bytes"),
            }
        }
        if !frozen.load(Ordering::Relaxed) {
            send.send_data(Bytes::new(), true).unwrap();
            // Everything arrived and was read.
            read.wait_for(|n| *n >= total as u64).await.unwrap();
        }
        watch.abort();
        let read = *read.borrow();
        (peak.load(Ordering::Relaxed), read, server, client)
    }

    /// The largest frame a connection advertises is the largest it is sent:
    /// with 64 KiB a 40,000-byte body arrives in one DATA frame, where
    /// HTTP/2's default 16 KiB splits it in three that the reader must
    /// gather (a 16 KiB gRPC message never fits one default frame).
    #[tokio::test]
    async fn a_client_advertising_larger_frames_is_sent_a_message_in_one() {
        for (advertised, frames) in [(16 << 10, 3), (64 << 10, 1)] {
            let mut cfg = config(32 * MIB, i64::from(64 * MIB), None);
            cfg.max_frame_size = advertised;
            let (client_io, server_io) = tokio::io::duplex(1 << 20);
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(server_io).await.unwrap();
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    let mut send = respond
                        .send_response(http::Response::new(()), false)
                        .unwrap();
                    send.send_data(Bytes::from(vec![1u8; 40_000]), true)
                        .unwrap();
                }
            });
            let mut channel = crate::h2grpc::connect(client_io, &cfg).await.unwrap();
            std::future::poll_fn(|cx| {
                tower_service::Service::<http::Request<http_body_util::Empty<Bytes>>>::poll_ready(
                    &mut channel,
                    cx,
                )
            })
            .await
            .unwrap();
            let req = http::Request::post("http://test/")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            let resp = tower_service::Service::call(&mut channel, req)
                .await
                .unwrap();
            let mut body = resp.into_body();
            let mut sizes = Vec::new();
            while let Some(f) = body.frame().await {
                if let Ok(d) = f.unwrap().into_data() {
                    sizes.push(d.len());
                }
            }
            assert_eq!(sizes.iter().sum::<usize>(), 40_000);
            assert_eq!(sizes.len(), frames, "advertising {advertised}: {sizes:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_grows_under_a_long_round_trip_and_shrinks_back_when_idle() {
        let cfg = config(16 * MIB, 1 << 30, None);
        let (peak, read, server, mut client) =
            upload(&cfg, Duration::from_millis(50), 48 << 20, None).await;
        assert_eq!(read, 48 << 20);
        assert!(peak >= i64::from(8 * MIB), "peak window {peak}");
        assert!(peak <= i64::from(16 * MIB), "peak window {peak}");
        assert!(cfg.stats.stream_windows() > i64::from(MIB));
        let grown = cfg.process_budget.used();
        // Idle: one halving per idle second, back to the initial window.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(cfg.stats.stream_windows(), i64::from(MIB));
        assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
        // The client may still send what it was granted before, so the
        // budget keeps it, and gets it back byte for byte as it comes (too
        // little to grow the window again).
        assert_eq!(cfg.process_budget.used(), grown);
        let req = http::Request::post("http://test/").body(()).unwrap();
        let (resp, mut send) = client.send_request(req, false).unwrap();
        let mut left = 512usize << 10;
        while left > 0 {
            send.reserve_capacity(left);
            let n = std::future::poll_fn(|cx| send.poll_capacity(cx))
                .await
                .unwrap()
                .unwrap()
                .min(left);
            send.send_data(Bytes::from(vec![7u8; n]), false).unwrap();
            left -= n;
        }
        send.send_data(Bytes::new(), true).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
        assert_eq!(cfg.process_budget.used(), grown - (512 << 10));
        // And all of it when the connection ends.
        drop((resp, send, client));
        server.await.unwrap();
        assert_eq!(cfg.process_budget.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_round_trip_to_cover_the_window_stays_small() {
        let cfg = config(16 * MIB, 1 << 30, None);
        let (peak, read, _server, _client) = upload(&cfg, Duration::ZERO, 24 << 20, None).await;
        assert_eq!(read, 24 << 20);
        assert!(peak <= i64::from(2 * MIB), "peak window {peak}");
    }

    /// A link that carried only a trickle for a while (every BDP sample
    /// said "not the limit", so PINGs backed off towards `MAX_BDP_PAUSE`)
    /// still grows its window as soon as a transfer fills it.
    #[tokio::test(start_paused = true)]
    async fn a_transfer_after_a_quiet_spell_grows_the_window_at_once() {
        let cfg = config(16 * MIB, 1 << 30, None);
        let (mut client, mut read, _server, _frozen) =
            connect(&cfg, Duration::from_millis(10)).await;
        let req = http::Request::post("http://test/").body(()).unwrap();
        let (_resp, mut send) = client.send_request(req, false).unwrap();
        let mut sent = 0u64;
        // The quiet spell: 16 KiB every 200 ms for 10 s.
        for _ in 0..50 {
            send.send_data(Bytes::from(vec![7u8; 16 << 10]), false)
                .unwrap();
            sent += 16 << 10;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        read.wait_for(|n| *n >= sent).await.unwrap();
        assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
        // The transfer: 96 MiB, a second at 1 MiB per 10 ms.
        let chunk = Bytes::from(vec![7u8; 256 << 10]);
        let end = sent + (96 << 20);
        let mut peak = 0;
        while sent < end {
            send.reserve_capacity(chunk.len());
            if let Some(Ok(n)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                let n = n.min(chunk.len());
                send.send_data(chunk.slice(..n), false).unwrap();
                sent += n as u64;
            }
            peak = peak.max(cfg.stats.connection_windows());
        }
        read.wait_for(|n| *n >= sent).await.unwrap();
        assert!(peak >= i64::from(8 * MIB), "peak window {peak}");
    }

    /// A tunneling connection's start (256 KiB streams, 1 MiB connection):
    /// the whole start while the budget has room, what is left when it has
    /// little, HTTP/2's own window once it is spent; each given back when
    /// its connection ends.
    #[test]
    fn connections_start_with_what_the_budget_has_left() {
        let settings = WindowSettings {
            initial: 256 << 10,
            max: 16 * MIB,
            connection_budget: 64 << 20,
            idle: Duration::from_secs(5),
            single_stream: false,
        };
        let process = Budget::new(i64::from(MIB) + (300 << 10), None);
        let stats = Arc::new(WindowStats::default());
        let full = Start::new(settings, &process, stats.clone());
        assert_eq!((full.stream(), full.connection()), (256 << 10, MIB));
        let part = Start::new(settings, &process, stats.clone());
        assert_eq!((part.stream(), part.connection()), (256 << 10, 300 << 10));
        let spent = Start::new(settings, &process, stats.clone());
        assert_eq!(
            (spent.stream(), spent.connection()),
            (SPEC_WINDOW, SPEC_WINDOW)
        );
        // Past the budget by the one window HTTP/2 grants anyway.
        assert_eq!(process.used(), process.limit() + i64::from(SPEC_WINDOW));
        // What the first gave back pays for the floor first.
        drop(full);
        let again = Start::new(settings, &process, stats);
        assert_eq!(
            i64::from(again.connection()),
            process.limit() - (300 << 10) - i64::from(SPEC_WINDOW)
        );
        assert_eq!(process.used(), process.limit());
        drop((part, spent, again));
        assert_eq!(process.used(), 0);
    }

    /// With the process budget spent by others, a new connection starts
    /// at HTTP/2's own window and still moves data; its window grows once
    /// budget comes free, and what it reserved is given back when it ends.
    #[tokio::test(start_paused = true)]
    async fn a_connection_started_on_a_spent_budget_grows_as_budget_comes_free() {
        let budget = 4 * i64::from(MIB);
        let cfg = config(16 * MIB, budget, None);
        assert_eq!(cfg.process_budget.try_reserve(budget), budget);
        let others = {
            let (process, stats) = (cfg.process_budget.clone(), cfg.stats.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                let (window, used) = (stats.connection_windows(), process.used());
                // The others end.
                process.release(budget);
                (window, used)
            })
        };
        let (peak, read, server, client) =
            upload(&cfg, Duration::from_millis(50), 24 << 20, None).await;
        assert_eq!(read, 24 << 20);
        let (window, used) = others.await.unwrap();
        assert_eq!(
            window,
            i64::from(SPEC_WINDOW),
            "window while the budget was spent"
        );
        assert_eq!(used, budget + i64::from(SPEC_WINDOW));
        // Doubled at least four times from 64 KiB.
        assert!(
            peak >= 16 * i64::from(SPEC_WINDOW),
            "it grew once budget came free: {peak}"
        );
        assert!(
            peak <= budget,
            "peak window {peak} past the budget {budget}"
        );
        drop(client);
        server.await.unwrap();
        assert_eq!(cfg.process_budget.used(), 0);
        assert_eq!(cfg.stats.connection_windows(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_never_grows_past_the_process_budget() {
        let budget = 3 * i64::from(MIB);
        let cfg = config(16 * MIB, budget, None);
        let (peak, read, _server, _client) =
            upload(&cfg, Duration::from_millis(50), 32 << 20, None).await;
        assert_eq!(read, 32 << 20);
        assert!(peak > i64::from(MIB), "it grew within the budget: {peak}");
        assert!(
            peak <= budget,
            "peak window {peak} past the budget {budget}"
        );
        assert!(cfg.process_budget.used() <= budget);
    }

    /// A peer that stops answering while a BDP PING is out is found out by
    /// the keepalive timeout as well.
    #[tokio::test(start_paused = true)]
    async fn a_peer_frozen_while_data_flows_is_dropped_after_the_keepalive_timeout() {
        let keepalive = Keepalive {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            min_gap: Duration::ZERO,
        };
        let cfg = config(16 * MIB, 1 << 30, Some(keepalive));
        let (_, _, server, _client) =
            upload(&cfg, Duration::from_millis(20), 64 << 20, Some(4 << 20)).await;
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("the connection to the frozen peer is still served")
            .unwrap();
        assert!(t0.elapsed() <= keepalive.timeout + Duration::from_millis(100));
    }

    /// A peer that freezes while the connection is idle is found out within
    /// `interval + timeout` of when it was last heard.
    #[tokio::test(start_paused = true)]
    async fn a_peer_frozen_while_idle_is_dropped_within_interval_and_timeout() {
        let keepalive = Keepalive {
            interval: Duration::from_secs(25),
            timeout: Duration::from_secs(5),
            min_gap: Duration::ZERO,
        };
        // No BDP PINGs (the window cannot grow): only the keepalive's.
        let cfg = config(MIB, 1 << 30, Some(keepalive));
        let (client_io, server_io, frozen) = delayed_link(Duration::from_millis(20));
        let (read_tx, mut read) = tokio::sync::watch::channel(0u64);
        let drain = crate::drain::Drain::new();
        let svc = Sink(Arc::new(read_tx));
        let server = tokio::spawn(async move { serve(server_io, svc, &cfg, &drain).await });
        let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::post("http://test/").body(()).unwrap();
        let (_resp, mut send) = client.send_request(req, false).unwrap();
        send.send_data(Bytes::from_static(b"hello"), false).unwrap();
        read.wait_for(|n| *n == 5).await.unwrap();
        // The server last heard the client now (give or take the window
        // update it answers with); it goes quiet for good.
        let heard = Instant::now();
        frozen.store(true, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(120), server)
            .await
            .expect("the connection to the frozen peer is still served")
            .unwrap();
        let took = heard.elapsed();
        assert!(took >= keepalive.interval, "{took:?}");
        assert!(
            took <= keepalive.interval + keepalive.timeout + Duration::from_millis(100),
            "{took:?}"
        );
    }

    /// A client connection's controller with `keepalive`, over a link of
    /// 20 ms to a plain `h2` server that PINGs it every `server_pings` (if
    /// given); and the switch that freezes the link.
    async fn client_controller(
        keepalive: Keepalive,
        server_pings: Option<Duration>,
    ) -> (Controller, Arc<AtomicBool>) {
        let (client_io, server_io, frozen) = delayed_link(Duration::from_millis(20));
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let mut pings = conn.ping_pong().unwrap();
            let pinger = async move {
                let Some(every) = server_pings else {
                    return std::future::pending().await;
                };
                loop {
                    tokio::time::sleep(every).await;
                    if pings.ping(Ping::opaque()).await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = std::future::poll_fn(|cx| conn.poll_closed(cx)) => {}
                () = pinger => {}
            }
        });
        let meter = Meter::new();
        let (send, mut conn) = h2::client::handshake(meter.counted(client_io))
            .await
            .unwrap();
        let pings = conn.ping_pong().unwrap();
        tokio::spawn(async move {
            let _send = send;
            let _ = conn.await;
        });
        // The agent link's settings: its controller wakes rarely by itself.
        let mut window = config(MIB, 1 << 30, None).window;
        window.idle = Duration::from_secs(30);
        let start = Start::new(window, &Budget::new(1 << 30, None), Arc::default());
        let ctl = Controller::new(pings, start, Some(keepalive), meter);
        (ctl, frozen)
    }

    /// Drives `ctl` for `run`: the PINGs answered meanwhile, or when the
    /// keepalive gave up.
    async fn drive(ctl: &mut Controller, run: Duration) -> Result<u64, Instant> {
        let deadline = tokio::time::sleep(run);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return Ok(ctl.pongs()),
                a = ctl.next() => if a == Action::KeepaliveTimedOut {
                    return Err(Instant::now());
                },
            }
        }
    }

    async fn client_pings(
        keepalive: Keepalive,
        server_pings: Option<Duration>,
        run: Duration,
    ) -> u64 {
        let (mut ctl, _frozen) = client_controller(keepalive, server_pings).await;
        drive(&mut ctl, run)
            .await
            .expect("the live peer was dropped")
    }

    /// A peer heard from all along that then freezes is found out within
    /// `interval + timeout` of when it was last heard, whenever that was.
    #[tokio::test(start_paused = true)]
    async fn a_peer_heard_until_it_froze_is_dropped_within_interval_and_timeout() {
        let keepalive = Keepalive {
            interval: Duration::from_secs(25),
            timeout: Duration::from_secs(5),
            min_gap: Duration::from_secs(31),
        };
        for quiet_after in [37, 40, 49, 63] {
            let (mut ctl, frozen) =
                client_controller(keepalive, Some(Duration::from_secs(1))).await;
            // The freeze comes while the controller waits, as it would.
            let froze = Instant::now() + Duration::from_secs(quiet_after);
            tokio::spawn(async move {
                tokio::time::sleep_until(froze).await;
                frozen.store(true, Ordering::Relaxed);
            });
            let gone = drive(&mut ctl, Duration::from_secs(quiet_after + 120))
                .await
                .expect_err("the frozen peer was kept");
            assert_eq!(ctl.pongs(), 0, "a peer heard every second was PINGed");
            let took = gone - froze;
            assert!(
                took <= keepalive.interval + keepalive.timeout,
                "frozen after {quiet_after} s, dropped {took:?} later"
            );
        }
    }

    /// A peer that is heard from (here: its own PINGs every 15 s, as our
    /// server sends them) is not PINGed at all; a quiet one is, but never
    /// more often than `min_gap` allows.
    #[tokio::test(start_paused = true)]
    async fn keepalive_pings_only_a_quiet_peer_and_no_closer_than_the_gap() {
        let keepalive = Keepalive {
            interval: Duration::from_secs(25),
            timeout: Duration::from_secs(5),
            min_gap: Duration::from_secs(31),
        };
        let run = Duration::from_secs(300);
        let heard = client_pings(keepalive, Some(Duration::from_secs(15)), run).await;
        assert_eq!(heard, 0, "PINGed a peer that was heard every 15 s");
        let quiet = client_pings(keepalive, None, run).await;
        // One PING per 31 s, not one per 25 s.
        assert_eq!(quiet, 300 / 31, "PINGs answered in {run:?}");
    }
}
