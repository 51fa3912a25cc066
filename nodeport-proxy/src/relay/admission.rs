//! Per-cluster circuit breakers (issue 38, KKP #15962): one cluster whose
//! apiserver is blackholed or stalled must not take the memory every other
//! cluster needs. Each cluster bounds its open upstream connections, its
//! connects still pending and the bytes its connections hold in our
//! buffers; past a bound a new connection fails at once (Envoy's `UO`):
//! SNI and NodePort clients are closed, a CONNECT gets 503. The bounds are
//! Envoy's circuit breakers (whose defaults KKP leaves in place), with ours
//! where ours differ: 4,096 connections instead of 1,024, and a byte bound
//! Envoy does not have (nodeport-proxy/src/limits.rs, docs/kkp.md).
//!
//! Unlike Envoy, a connection past `max_connections` is not queued as a
//! pending request waiting for another to close: with a stalled upstream
//! none ever does, and the queue is what holds the memory.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use link::duplex::{ChunkRead, ChunkWrite, Duplex};
use metrics::Gauge;
use parking_lot::Mutex;

use crate::stats::metrics::ClusterStats;

/// The bounds every cluster gets (`-max-connections-per-cluster`,
/// `-max-pending-connects-per-cluster`, `-max-buffered-bytes-per-cluster`);
/// 0 turns a bound off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterLimits {
    /// Upstream connections open or being opened (Envoy's `max_connections`).
    pub max_connections: usize,
    /// Upstream connects not yet answered (Envoy's `max_pending_requests`).
    pub max_pending: usize,
    /// Bytes read from one side and not yet written to the other, over all
    /// the cluster's connections, plus what pending ones hold (a
    /// ClientHello, early tunnel data). A cluster past it admits no new
    /// connection until it drains.
    pub max_buffered: usize,
}

impl Default for ClusterLimits {
    fn default() -> Self {
        ClusterLimits {
            max_connections: crate::limits::DEFAULT_MAX_CONNECTIONS_PER_CLUSTER,
            max_pending: crate::limits::DEFAULT_MAX_PENDING_CONNECTS_PER_CLUSTER,
            max_buffered: crate::limits::DEFAULT_MAX_BUFFERED_BYTES_PER_CLUSTER,
        }
    }
}

/// Which bound refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Overflow {
    #[error("-max-connections-per-cluster connections are open")]
    Connections,
    #[error("-max-pending-connects-per-cluster connects are pending")]
    Pending,
    #[error("more than -max-buffered-bytes-per-cluster bytes are held")]
    Buffered,
}

impl Overflow {
    /// The close reason (access log, `rejected_connections_total`).
    pub fn reason(self) -> &'static str {
        match self {
            Overflow::Connections => "upstream_cx_overflow",
            Overflow::Pending => "upstream_rq_pending_overflow",
            Overflow::Buffered => "upstream_buffer_overflow",
        }
    }
}

/// One cluster's counts; kept with its stats ([`ClusterStats::gate`]), so
/// the cluster's versions share them across table updates.
#[derive(Debug, Default)]
pub struct Gate {
    /// (open, pending); updated together with their gauges.
    counts: Mutex<(usize, usize)>,
    buffered: AtomicUsize,
}

impl Gate {
    pub fn open(&self) -> usize {
        self.counts.lock().0
    }

    pub fn pending(&self) -> usize {
        self.counts.lock().1
    }

    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }
}

/// The circuit-breaker gauges of a cluster, set while its counts are locked.
fn publish(stats: &ClusterStats, limits: &ClusterLimits, open: usize, pending: usize) {
    stats.upstream_rq_pending_active().set(pending as f64);
    if limits.max_connections > 0 {
        let full = open >= limits.max_connections;
        stats.cx_open().set(f64::from(u8::from(full)));
        stats
            .remaining_cx()
            .set(limits.max_connections.saturating_sub(open) as f64);
    }
    if limits.max_pending > 0 {
        let full = pending >= limits.max_pending;
        stats.rq_pending_open().set(f64::from(u8::from(full)));
        stats
            .remaining_pending()
            .set(limits.max_pending.saturating_sub(pending) as f64);
    }
}

/// A connection's place in its cluster, from admission until it closes:
/// it counts as open for its whole life and as pending until
/// [`Slot::connected`]. Dropping it gives everything back.
pub struct Slot {
    stats: ClusterStats,
    limits: ClusterLimits,
    pending: bool,
    /// Bytes held before the relay (early data while connecting).
    early: usize,
}

/// Takes a slot in the cluster for a connection holding `early` bytes, or
/// says which bound is reached (counted in the cluster's overflow counters).
pub fn admit(stats: &ClusterStats, limits: &ClusterLimits, early: usize) -> Result<Slot, Overflow> {
    let gate = stats.gate();
    if limits.max_buffered > 0 && gate.buffered() + early > limits.max_buffered {
        stats.upstream_cx_overflow().increment(1);
        return Err(Overflow::Buffered);
    }
    let mut counts = gate.counts.lock();
    let (open, pending) = *counts;
    if limits.max_pending > 0 && pending >= limits.max_pending {
        stats.upstream_rq_pending_overflow().increment(1);
        return Err(Overflow::Pending);
    }
    if limits.max_connections > 0 && open >= limits.max_connections {
        stats.upstream_cx_overflow().increment(1);
        return Err(Overflow::Connections);
    }
    *counts = (open + 1, pending + 1);
    publish(stats, limits, open + 1, pending + 1);
    drop(counts);
    gate.buffered.fetch_add(early, Ordering::Relaxed);
    stats
        .upstream_cx_tx_bytes_buffered()
        .increment(early as f64);
    Ok(Slot {
        stats: stats.clone(),
        limits: *limits,
        pending: true,
        early,
    })
}

impl Slot {
    /// The connect is over (answered or failed): no longer pending; the
    /// early bytes are the relay's from now on.
    pub fn connected(&mut self) {
        if !self.pending {
            return;
        }
        self.pending = false;
        let mut counts = self.stats.gate().counts.lock();
        counts.1 = counts.1.saturating_sub(1);
        publish(&self.stats, &self.limits, counts.0, counts.1);
        drop(counts);
        self.release_early();
    }

    fn release_early(&mut self) {
        let early = std::mem::take(&mut self.early);
        self.stats
            .gate()
            .buffered
            .fetch_sub(early, Ordering::Relaxed);
        self.stats
            .upstream_cx_tx_bytes_buffered()
            .decrement(early as f64);
    }

    /// What the relay's two sides count their held bytes into.
    pub fn meter(&self) -> Arc<Meter> {
        Arc::new(Meter {
            stats: self.stats.clone(),
            tx_gauge: self.stats.upstream_cx_tx_bytes_buffered(),
            rx_gauge: self.stats.upstream_cx_rx_bytes_buffered(),
            tx: AtomicUsize::new(0),
            rx: AtomicUsize::new(0),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release_early();
        let mut counts = self.stats.gate().counts.lock();
        counts.0 = counts.0.saturating_sub(1);
        if self.pending {
            counts.1 = counts.1.saturating_sub(1);
        }
        publish(&self.stats, &self.limits, counts.0, counts.1);
    }
}

/// One connection's bytes in our buffers, by direction: `tx` read from the
/// client and not yet written upstream, `rx` the other way. Whatever is
/// still counted when the relay ends is given back on drop.
pub struct Meter {
    stats: ClusterStats,
    tx_gauge: Gauge,
    rx_gauge: Gauge,
    tx: AtomicUsize,
    rx: AtomicUsize,
}

#[derive(Clone, Copy)]
enum Dir {
    Tx,
    Rx,
}

impl Meter {
    fn parts(&self, dir: Dir) -> (&AtomicUsize, &Gauge) {
        match dir {
            Dir::Tx => (&self.tx, &self.tx_gauge),
            Dir::Rx => (&self.rx, &self.rx_gauge),
        }
    }

    fn hold(&self, dir: Dir, n: usize) {
        let (mine, gauge) = self.parts(dir);
        mine.fetch_add(n, Ordering::Relaxed);
        self.stats.gate().buffered.fetch_add(n, Ordering::Relaxed);
        gauge.increment(n as f64);
    }

    fn release(&self, dir: Dir, n: usize) {
        let (mine, gauge) = self.parts(dir);
        mine.fetch_sub(n, Ordering::Relaxed);
        self.stats.gate().buffered.fetch_sub(n, Ordering::Relaxed);
        gauge.decrement(n as f64);
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        for dir in [Dir::Tx, Dir::Rx] {
            let (mine, _) = self.parts(dir);
            let left = mine.load(Ordering::Relaxed);
            self.release(dir, left);
        }
    }
}

/// A side of the relay whose chunks count as held from the moment they are
/// read until the other side has written them.
pub struct Metered<D> {
    inner: D,
    meter: Arc<Meter>,
    /// What this side's reads hold (its writes give back the other).
    reads: Dir,
}

impl<D> Metered<D> {
    /// The client side: its reads are held towards the upstream (tx).
    pub fn client(inner: D, meter: &Arc<Meter>) -> Self {
        Metered {
            inner,
            meter: meter.clone(),
            reads: Dir::Tx,
        }
    }

    /// The upstream side: its reads are held towards the client (rx).
    pub fn upstream(inner: D, meter: &Arc<Meter>) -> Self {
        Metered {
            inner,
            meter: meter.clone(),
            reads: Dir::Rx,
        }
    }
}

pub struct MeteredRead<R> {
    inner: R,
    meter: Arc<Meter>,
    dir: Dir,
}

pub struct MeteredWrite<W> {
    inner: W,
    meter: Arc<Meter>,
    dir: Dir,
}

impl<D: Duplex> Duplex for Metered<D> {
    type Read = MeteredRead<D::Read>;
    type Write = MeteredWrite<D::Write>;

    fn split(self, max_chunk: usize) -> (Self::Read, Self::Write) {
        let (r, w) = self.inner.split(max_chunk);
        let writes = match self.reads {
            Dir::Tx => Dir::Rx,
            Dir::Rx => Dir::Tx,
        };
        (
            MeteredRead {
                inner: r,
                meter: self.meter.clone(),
                dir: self.reads,
            },
            MeteredWrite {
                inner: w,
                meter: self.meter,
                dir: writes,
            },
        )
    }
}

impl<R: ChunkRead> ChunkRead for MeteredRead<R> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        let got = self.inner.poll_chunk(cx);
        if let Poll::Ready(Ok(chunk)) = &got {
            self.meter.hold(self.dir, chunk.len());
        }
        got
    }
}

impl<W: ChunkWrite> ChunkWrite for MeteredWrite<W> {
    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        let before = chunk.len();
        let sent = self.inner.poll_send(cx, chunk);
        let gone = before.saturating_sub(chunk.len());
        if gone > 0 {
            self.meter.release(self.dir, gone);
        }
        sent
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_finish(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_pending: usize, max_buffered: usize) -> ClusterLimits {
        ClusterLimits {
            max_connections,
            max_pending,
            max_buffered,
        }
    }

    #[test]
    fn each_bound_refuses_past_it_and_gives_back_on_drop() {
        let stats = ClusterStats::default();
        let gate = stats.gate();
        let l = limits(3, 2, 100);
        let mut a = admit(&stats, &l, 10).unwrap_or_else(|e| panic!("{e}"));
        let b = admit(&stats, &l, 10).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((gate.open(), gate.pending(), gate.buffered()), (2, 2, 20));
        assert_eq!(admit(&stats, &l, 0).err(), Some(Overflow::Pending));
        a.connected();
        assert_eq!((gate.open(), gate.pending(), gate.buffered()), (2, 1, 10));
        let mut c = admit(&stats, &l, 0).unwrap_or_else(|e| panic!("{e}"));
        c.connected();
        assert_eq!(admit(&stats, &l, 0).err(), Some(Overflow::Connections));
        drop((b, c));
        assert_eq!((gate.open(), gate.pending(), gate.buffered()), (1, 0, 0));
        let m = a.meter();
        m.hold(Dir::Tx, 95);
        assert_eq!(admit(&stats, &l, 10).err(), Some(Overflow::Buffered));
        drop(m);
        drop(a);
        assert_eq!((gate.open(), gate.pending(), gate.buffered()), (0, 0, 0));
        let off = limits(0, 0, 0);
        let many: Vec<_> = (0..10)
            .map(|_| admit(&stats, &off, 1 << 20).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(gate.open(), 10);
        drop(many);
        assert_eq!((gate.open(), gate.buffered()), (0, 0));
    }

    /// A chunk counts from its read until the other side has written it,
    /// partial writes included; the relay over a stalled upstream holds
    /// what it read.
    #[tokio::test]
    async fn relay_chunks_count_while_held() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stats = ClusterStats::default();
        let gate = stats.gate();
        let slot = admit(&stats, &limits(0, 0, 0), 0).unwrap_or_else(|e| panic!("{e}"));
        let meter = slot.meter();
        let (mut client, client_side) = tokio::io::duplex(64 << 10);
        // The upstream's pipe takes 1 KiB and is never read.
        let (mut upstream, upstream_side) = tokio::io::duplex(1024);
        let relay = tokio::spawn({
            let meter = meter.clone();
            async move {
                link::relay::relay(
                    Metered::client(link::duplex::Plain(client_side), &meter),
                    Metered::upstream(link::duplex::Plain(upstream_side), &meter),
                    link::relay::RelayOptions::default(),
                    &(),
                    std::future::pending(),
                )
                .await
            }
        });
        client
            .write_all(&[7u8; 8 << 10])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // 8 KiB read in one or more chunks, 1 KiB of it written: the rest
        // is held once the relay is blocked.
        for _ in 0..1000 {
            if gate.buffered() == 7 << 10 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.buffered(), 7 << 10);
        let mut sink = vec![0u8; 8 << 10];
        upstream
            .read_exact(&mut sink)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(client);
        drop(upstream);
        let _ = relay.await;
        drop(meter);
        assert_eq!(gate.buffered(), 0);
        drop(slot);
        assert_eq!(gate.open(), 0);
    }
}
