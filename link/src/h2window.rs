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
    pub fn new(
        r: &daemon::metrics::Registry,
        n: PoolGaugeNames,
        budget_flag: &'static str,
    ) -> Self {
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
#[path = "h2window_tests.rs"]
mod tests;
