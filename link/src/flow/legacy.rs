//! Admission of DATA from an upstream peer, which has no per-connection flow
//! control: what such a peer sends is held until the local consumer (the
//! frontend, or the destination) takes it, so what it may make us hold is
//! bounded in bytes here, by the same figures as the flow-controlled path.
//!
//! Per connection, at most `--xfr-channel-size` packets and the initial
//! window's worth of bytes (`--flow-control-window`, 256 KiB) are queued; one
//! larger packet (up to the 4 MiB gRPC limit) still passes when nothing is
//! queued, as an oversize packet passes with flow control. Each packet's cost
//! ([`crate::flow::cost`]) is reserved from the stream's budget
//! (`--flow-control-agent-budget` / `--flow-control-server-budget`) inside the
//! process's (`--flow-control-budget`), which the flow-controlled windows and
//! the HTTP/2 windows share; a connection holding less than
//! [`FLOOR_WINDOW`] may always queue up to it, so small packets keep moving
//! when the budget is spent, as a window's floor does.
//!
//! When a packet does not fit, the stream's reader waits: it stops reading
//! that stream, as upstream's does (upstream waits on a full queue of 10
//! packets of any size). Waiting on the connection's own bound ends after the
//! stall limit with [`GateError::Stalled`] (only that connection is closed).
//! While a reader waits on a budget, every connection of the process that
//! has held data its consumer has not taken for the stall limit is closed
//! (its owner's `reclaim` runs), which gives the budget back: a peer that
//! sends large packets to connections whose readers stopped holds at most its
//! stream's budget, and only for the stall limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::budget::Budget;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::settings::{FLOOR_WINDOW, SWEEP_INTERVAL, cost};
use super::stats::{FlowStats, GateError};

/// Every legacy connection of a process, so that a reader waiting for budget
/// can find the ones whose consumers stopped.
#[derive(Debug, Default)]
pub struct LegacyPool {
    gates: Mutex<HashMap<u64, Weak<Shared>>>,
    next: AtomicU64,
    /// Woken whenever a legacy connection gives budget back.
    freed: Notify,
}

impl LegacyPool {
    /// Closes every connection that has held data its consumer has not taken
    /// for its stall limit; returns how many.
    fn reclaim_stalled(&self, now: Instant) -> usize {
        let gates: Vec<Arc<Shared>> = self
            .gates
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let mut closed = 0;
        for g in gates {
            let stalled = {
                let mut s = g.state.lock();
                let stalled =
                    s.held > 0 && !s.reclaimed && now.saturating_duration_since(s.since) >= g.stall;
                if stalled {
                    s.reclaimed = true;
                }
                stalled
            };
            if stalled {
                // Outside the locks: the owner discards the gate.
                (g.reclaim)();
                closed += 1;
            }
        }
        closed
    }

    /// Legacy connections open now.
    pub fn open(&self) -> usize {
        self.gates.lock().len()
    }
}

/// The receiving side of one stream with an upstream peer.
#[derive(Debug, Clone)]
pub struct LegacyLink {
    pool: Arc<LegacyPool>,
    /// The stream's budget, inside the process's.
    budget: Arc<Budget>,
    /// Bytes (cost) one connection may queue, unless it queues nothing.
    per_conn: i64,
    /// Packets one connection may queue.
    slots: usize,
    stall: Duration,
    stats: Arc<FlowStats>,
}

impl LegacyLink {
    pub(crate) fn new(
        pool: Arc<LegacyPool>,
        budget: Arc<Budget>,
        per_conn: i64,
        slots: usize,
        stall: Duration,
        stats: Arc<FlowStats>,
    ) -> Self {
        LegacyLink {
            pool,
            budget,
            per_conn: per_conn.max(FLOOR_WINDOW),
            slots: slots.max(1),
            stall,
            stats,
        }
    }

    /// The stream's budget (reserved: what its connections hold).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// A new connection's gate. `reclaim` closes the connection (its queued
    /// data dropped, then [`LegacyGate::discard`]) when the process needs the
    /// budget its stalled consumer holds; it must not block.
    pub fn open(&self, reclaim: impl Fn() + Send + Sync + 'static) -> LegacyGate {
        let id = self.pool.next.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                packets: 0,
                held: 0,
                bytes: 0,
                since: Instant::now(),
                discarded: false,
                reclaimed: false,
            }),
            wake: Notify::new(),
            stall: self.stall,
            reclaim: Box::new(reclaim),
        });
        self.pool.gates.lock().insert(id, Arc::downgrade(&shared));
        LegacyGate {
            id,
            shared,
            link: self.clone(),
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Woken when this connection's consumer takes a packet.
    wake: Notify,
    stall: Duration,
    reclaim: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("state", &*self.state.lock())
            .finish()
    }
}

#[derive(Debug)]
struct State {
    /// Packets queued.
    packets: usize,
    /// Their cost, all of it reserved in the budget.
    held: i64,
    /// Their length (the `parked` metric).
    bytes: i64,
    /// Since when the consumer has not taken anything while data was held.
    since: Instant,
    /// Nothing more is admitted; the budget was given back.
    discarded: bool,
    /// Its owner was asked to close it.
    reclaimed: bool,
}

/// Admission for one connection with an upstream peer.
#[derive(Debug)]
pub struct LegacyGate {
    id: u64,
    shared: Arc<Shared>,
    link: LegacyLink,
}

/// What stops a packet from being queued now.
enum Blocked {
    /// The connection's own bound (its consumer is behind).
    Own,
    /// The stream's or the process's budget.
    Budget,
}

impl LegacyGate {
    /// Whether a packet would wait for the consumer now.
    pub fn is_full(&self) -> bool {
        let s = self.shared.state.lock();
        s.packets >= self.link.slots || s.held >= self.link.per_conn
    }

    /// Queues DATA of `len` bytes once it fits (see the module's comment).
    pub async fn admit(&self, len: usize) -> Result<(), GateError> {
        let c = cost(len);
        let n = i64::try_from(len).unwrap_or(i64::MAX);
        let mut own_since: Option<Instant> = None;
        loop {
            // Registered before the look at the state, so a release in
            // between still wakes this reader.
            let own = self.shared.wake.notified();
            let freed = self.link.pool.freed.notified();
            tokio::pin!(own, freed);
            own.as_mut().enable();
            freed.as_mut().enable();
            let now = Instant::now();
            match self.try_admit(c, n, now)? {
                None => return Ok(()),
                Some(Blocked::Own) => {
                    let until = *own_since.get_or_insert(now) + self.link.stall;
                    if now >= until {
                        return Err(GateError::Stalled(self.link.stall));
                    }
                    tokio::select! {
                        _ = own => {}
                        _ = tokio::time::sleep_until(until) => {}
                    }
                }
                Some(Blocked::Budget) => {
                    own_since = None;
                    self.link.pool.reclaim_stalled(now);
                    // Budget also comes back from flow-controlled windows,
                    // which do not wake this: look again after a while.
                    tokio::select! {
                        _ = own => {}
                        _ = freed => {}
                        _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                    }
                }
            }
        }
    }

    fn try_admit(&self, c: i64, n: i64, now: Instant) -> Result<Option<Blocked>, GateError> {
        let mut s = self.shared.state.lock();
        if s.discarded {
            return Err(GateError::Stalled(self.link.stall));
        }
        let fits = s.packets < self.link.slots && (s.held == 0 || s.held + c <= self.link.per_conn);
        if !fits {
            return Ok(Some(Blocked::Own));
        }
        let budget = &self.link.budget;
        let got = budget.try_reserve(c);
        if got < c {
            budget.release(got);
            if s.held + c > FLOOR_WINDOW {
                return Ok(Some(Blocked::Budget));
            }
            // The floor every connection keeps, budget or not.
            budget.force(c);
        }
        if s.held == 0 {
            s.since = now;
        }
        s.held += c;
        s.bytes += n;
        s.packets += 1;
        self.link.stats.add_parked(n);
        Ok(None)
    }

    /// The consumer took DATA of `len` bytes (as admitted).
    pub fn consumed(&self, len: usize) {
        let n = i64::try_from(len).unwrap_or(i64::MAX);
        {
            let mut s = self.shared.state.lock();
            if s.discarded {
                return;
            }
            let c = cost(len).min(s.held);
            let n = n.min(s.bytes);
            s.held -= c;
            s.bytes -= n;
            s.packets = s.packets.saturating_sub(1);
            s.since = Instant::now();
            self.link.budget.release(c);
            self.link.stats.add_parked(-n);
        }
        self.woken();
    }

    /// The connection is over (or its queue was dropped): gives back all
    /// it holds, and nothing more is admitted. Idempotent.
    pub fn discard(&self) {
        {
            let mut s = self.shared.state.lock();
            if s.discarded {
                return;
            }
            s.discarded = true;
            self.link.budget.release(s.held);
            self.link.stats.add_parked(-s.bytes);
            s.held = 0;
            s.bytes = 0;
            s.packets = 0;
        }
        self.woken();
    }

    fn woken(&self) {
        self.shared.wake.notify_waiters();
        self.link.pool.freed.notify_waiters();
    }

    /// Bytes (cost) held now.
    pub fn held(&self) -> i64 {
        self.shared.state.lock().held
    }
}

impl Drop for LegacyGate {
    fn drop(&mut self) {
        self.discard();
        self.link.pool.gates.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const MIB: usize = 1 << 20;

    fn link(pool: &Arc<LegacyPool>, process: &Arc<Budget>, stream: i64) -> LegacyLink {
        LegacyLink::new(
            pool.clone(),
            Budget::new(stream, Some(process.clone())),
            256 << 10,
            10,
            Duration::from_millis(200),
            Arc::new(FlowStats::default()),
        )
    }

    #[tokio::test]
    async fn a_connection_queues_its_bytes_bound_or_one_large_packet() {
        let pool = Arc::new(LegacyPool::default());
        let process = Budget::new(64 << 20, None);
        let l = link(&pool, &process, 32 << 20);
        let g = l.open(|| {});
        assert_eq!(g.admit(4 * MIB).await, Ok(()), "one large packet passes");
        assert_eq!(
            g.admit(1).await,
            Err(GateError::Stalled(Duration::from_millis(200))),
            "nothing more while it is queued"
        );
        g.consumed(4 * MIB);
        assert_eq!(process.used(), 0);
        for _ in 0..4 {
            assert_eq!(g.admit(64 << 10).await, Ok(()));
        }
        assert_eq!(g.held(), 256 << 10);
        assert!(g.is_full());
        assert!(g.admit(1).await.is_err(), "256 KiB queued is the bound");
        drop(g);
        assert_eq!(process.used(), 0, "dropping gives the budget back");
        assert_eq!(pool.open(), 0);
    }

    /// A stream's budget bounds what its stalled connections hold; a
    /// reader waiting for it closes the ones whose consumers stopped for the
    /// stall limit, and then goes on.
    #[tokio::test]
    async fn the_stream_budget_bounds_stalled_connections_and_is_reclaimed() {
        let pool = Arc::new(LegacyPool::default());
        let process = Budget::new(64 << 20, None);
        let l = link(&pool, &process, 16 << 20);
        let reclaimed = Arc::new(AtomicUsize::new(0));
        let gates: Vec<Arc<LegacyGate>> = (0..8)
            .map(|_| {
                Arc::new_cyclic(|me: &Weak<LegacyGate>| {
                    let (me, n) = (me.clone(), reclaimed.clone());
                    l.open(move || {
                        n.fetch_add(1, Ordering::Relaxed);
                        if let Some(g) = me.upgrade() {
                            g.discard();
                        }
                    })
                })
            })
            .collect();
        for g in &gates[..4] {
            assert_eq!(g.admit(4 * MIB).await, Ok(()));
        }
        assert_eq!(l.budget().used(), 16 << 20);
        let started = Instant::now();
        assert_eq!(gates[4].admit(4 * MIB).await, Ok(()));
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(reclaimed.load(Ordering::Relaxed), 4);
        assert_eq!(l.budget().used(), 4 << 20);
        assert!(process.used() <= 16 << 20);
        // Small packets keep moving at the floor when the budget is spent.
        let other = link(&pool, &Budget::new(16 << 20, None), 1);
        let g = other.open(|| {});
        assert_eq!(g.admit(4 << 10).await, Ok(()));
        let over = tokio::time::timeout(Duration::from_millis(600), g.admit(FLOOR_WINDOW as usize));
        assert!(over.await.is_err(), "past the floor it waits for budget");
    }
}
