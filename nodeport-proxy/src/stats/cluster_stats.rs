//! Envoy's per-cluster stats (`envoy_cluster_*{envoy_cluster_name}`), kept
//! outside the Prometheus registry because a seed has tens of thousands of
//! clusters: each cluster's values are a few atomics (its histograms are
//! allocated on first use), removed with the cluster, and rendered by hand.
//! A scrape renders every series of clusters that carried traffic and only
//! the membership gauges of the others, unless it asks for everything
//! (`?usedonly=false`): Envoy's `usedonly`, the default here, so a scrape of
//! 20,000 idle clusters is a few MB, not a hundred.
//!
//! The handles given to the data path are the `metrics` crate's, so code
//! that counts does not know where its counts go; the text is written by
//! daemon's Envoy exposition ([`daemon::metrics`]), as the registry's is.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use daemon::envoy_stats as envoy;
use daemon::metrics::{Kind, MsHistogram, add_f64, header, sample};
use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn};
use parking_lot::Mutex;

use crate::routing::names::ClusterName;

/// Counters, in the order of [`COUNTERS`].
const CX_TOTAL: usize = 0;
const CX_CONNECT_FAIL: usize = 1;
const CX_CONNECT_TIMEOUT: usize = 2;
const CX_NONE_HEALTHY: usize = 3;
const CX_RX_BYTES: usize = 4;
const CX_TX_BYTES: usize = 5;
const RQ_TOTAL: usize = 6;
const CX_OVERFLOW: usize = 7;
const RQ_PENDING_OVERFLOW: usize = 8;
const COUNTERS: [(&str, &str); 9] = [
    (
        envoy::CLUSTER_UPSTREAM_CX_TOTAL,
        "Upstream connections opened.",
    ),
    (
        envoy::CLUSTER_UPSTREAM_CX_CONNECT_FAIL,
        "Upstream connects refused or failed.",
    ),
    (
        "envoy_cluster_upstream_cx_connect_timeout",
        "Upstream connects that timed out.",
    ),
    (
        "envoy_cluster_upstream_cx_none_healthy",
        "Connections with no endpoint to try.",
    ),
    (
        envoy::CLUSTER_UPSTREAM_CX_RX_BYTES,
        "Bytes received from upstreams.",
    ),
    (
        envoy::CLUSTER_UPSTREAM_CX_TX_BYTES,
        "Bytes sent to upstreams.",
    ),
    (
        envoy::CLUSTER_UPSTREAM_RQ_TOTAL,
        "CONNECT tunnels routed to the cluster.",
    ),
    (
        "envoy_cluster_upstream_cx_overflow",
        "Connections refused because the cluster had -max-connections-per-cluster open or held -max-buffered-bytes-per-cluster.",
    ),
    (
        "envoy_cluster_upstream_rq_pending_overflow",
        "Connections refused because the cluster had -max-pending-connects-per-cluster connects pending.",
    ),
];

/// Gauges, in the order of [`GAUGES`]; the membership ones are rendered for
/// every cluster.
const CX_ACTIVE: usize = 0;
const RQ_ACTIVE: usize = 1;
const MEMBERSHIP_HEALTHY: usize = 2;
const MEMBERSHIP_TOTAL: usize = 3;
const RQ_PENDING_ACTIVE: usize = 4;
const TX_BUFFERED: usize = 5;
const RX_BUFFERED: usize = 6;
const CB_CX_OPEN: usize = 7;
const CB_RQ_PENDING_OPEN: usize = 8;
const CB_REMAINING_CX: usize = 9;
const CB_REMAINING_PENDING: usize = 10;
const GAUGES: [(&str, &str); 11] = [
    (
        envoy::CLUSTER_UPSTREAM_CX_ACTIVE,
        "Open upstream connections.",
    ),
    (
        envoy::CLUSTER_UPSTREAM_RQ_ACTIVE,
        "Open CONNECT tunnels to the cluster.",
    ),
    (
        "envoy_cluster_membership_healthy",
        "Ready endpoints of the cluster.",
    ),
    (
        "envoy_cluster_membership_total",
        "Endpoints of the cluster.",
    ),
    (
        "envoy_cluster_upstream_rq_pending_active",
        "Upstream connects not yet answered.",
    ),
    (
        "envoy_cluster_upstream_cx_tx_bytes_buffered",
        "Bytes read from clients (or held while connecting) not yet written to upstreams.",
    ),
    (
        "envoy_cluster_upstream_cx_rx_bytes_buffered",
        "Bytes read from upstreams not yet written to clients.",
    ),
    (
        "envoy_cluster_circuit_breakers_default_cx_open",
        "1 while the cluster has -max-connections-per-cluster connections open.",
    ),
    (
        "envoy_cluster_circuit_breakers_default_rq_pending_open",
        "1 while the cluster has -max-pending-connects-per-cluster connects pending.",
    ),
    (
        "envoy_cluster_circuit_breakers_default_remaining_cx",
        "Connections the cluster may still open (0 when the bound is off).",
    ),
    (
        "envoy_cluster_circuit_breakers_default_remaining_pending",
        "Connects the cluster may still have pending (0 when the bound is off).",
    ),
];

const CONNECT_MS: usize = 0;
const RQ_TIME: usize = 1;
const HISTOGRAMS: [(&str, &str); 2] = [
    (
        "envoy_cluster_upstream_cx_connect_ms",
        "Upstream connect time in milliseconds.",
    ),
    (
        "envoy_cluster_upstream_rq_time",
        "Time to the CONNECT response in milliseconds.",
    ),
];

/// Counters and gauges before these indices live in [`Cells`], the
/// circuit breakers' ones after them in [`Breakers`].
const BASE_COUNTERS: usize = CX_OVERFLOW;
const BASE_GAUGES: usize = RQ_PENDING_ACTIVE;

/// One cluster's values.
#[derive(Default)]
struct Cells {
    counters: [AtomicU64; BASE_COUNTERS],
    /// f64 bits.
    gauges: [AtomicU64; BASE_GAUGES],
    /// Both histograms, allocated together on first use: one cell for
    /// both keeps a cluster's values in a 128-byte allocation (issue 21).
    hists: OnceLock<Box<[MsHistogram; HISTOGRAMS.len()]>>,
    /// Allocated on the cluster's first connection, for the same reason.
    breakers: OnceLock<Box<Breakers>>,
    /// Anything but membership was ever updated.
    used: AtomicBool,
}

/// A cluster's circuit breakers: their series and counts.
#[derive(Default)]
struct Breakers {
    counters: [AtomicU64; COUNTERS.len() - BASE_COUNTERS],
    gauges: [AtomicU64; GAUGES.len() - BASE_GAUGES],
    gate: crate::relay::admission::Gate,
}

impl Cells {
    fn breakers(&self) -> &Breakers {
        self.breakers.get_or_init(Box::default)
    }

    fn counter(&self, i: usize) -> &AtomicU64 {
        match self.counters.get(i) {
            Some(c) => c,
            None => &self.breakers().counters[i - BASE_COUNTERS],
        }
    }

    fn gauge(&self, i: usize) -> &AtomicU64 {
        match self.gauges.get(i) {
            Some(g) => g,
            None => &self.breakers().gauges[i - BASE_GAUGES],
        }
    }

    /// Counter `i` without allocating the breakers (0 until they are).
    fn counter_value(&self, i: usize) -> u64 {
        let b = self.breakers.get();
        self.counters
            .get(i)
            .or_else(|| b.and_then(|b| b.counters.get(i - BASE_COUNTERS)))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn gauge_value(&self, i: usize) -> f64 {
        let b = self.breakers.get();
        self.gauges
            .get(i)
            .or_else(|| b.and_then(|b| b.gauges.get(i - BASE_GAUGES)))
            .map_or(0.0, |g| f64::from_bits(g.load(Ordering::Relaxed)))
    }
}

struct CounterCell(Arc<Cells>, usize);
impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.counter(self.1).fetch_add(value, Ordering::Relaxed);
        self.0.used.store(true, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.counter(self.1).fetch_max(value, Ordering::Relaxed);
        self.0.used.store(true, Ordering::Relaxed);
    }
}

struct GaugeCell(Arc<Cells>, usize);
impl GaugeCell {
    fn touch(&self) {
        if self.1 != MEMBERSHIP_HEALTHY && self.1 != MEMBERSHIP_TOTAL {
            self.0.used.store(true, Ordering::Relaxed);
        }
    }
}
impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        add_f64(self.0.gauge(self.1), value);
        self.touch();
    }
    fn decrement(&self, value: f64) {
        add_f64(self.0.gauge(self.1), -value);
        self.touch();
    }
    fn set(&self, value: f64) {
        self.0
            .gauge(self.1)
            .store(value.to_bits(), Ordering::Relaxed);
        self.touch();
    }
}

struct HistCell(Arc<Cells>, usize);
impl HistogramFn for HistCell {
    fn record(&self, value: f64) {
        self.0.hists.get_or_init(Box::default)[self.1].record(value);
        self.0.used.store(true, Ordering::Relaxed);
    }
}

/// Envoy `cluster.<name>.*` of one cluster. The data path asks for a
/// handle when it counts (a small allocation per connection); holding
/// thirteen handles per cluster would cost more than the cluster's routes.
#[derive(Clone, Default)]
pub struct ClusterStats(Arc<Cells>);

impl ClusterStats {
    fn counter(&self, i: usize) -> Counter {
        Counter::from_arc(Arc::new(CounterCell(self.0.clone(), i)))
    }

    fn gauge(&self, i: usize) -> Gauge {
        Gauge::from_arc(Arc::new(GaugeCell(self.0.clone(), i)))
    }

    fn histogram(&self, i: usize) -> Histogram {
        Histogram::from_arc(Arc::new(HistCell(self.0.clone(), i)))
    }

    pub fn upstream_cx_total(&self) -> Counter {
        self.counter(CX_TOTAL)
    }
    pub fn upstream_cx_active(&self) -> Gauge {
        self.gauge(CX_ACTIVE)
    }
    pub fn upstream_cx_connect_fail(&self) -> Counter {
        self.counter(CX_CONNECT_FAIL)
    }
    pub fn upstream_cx_connect_timeout(&self) -> Counter {
        self.counter(CX_CONNECT_TIMEOUT)
    }
    pub fn upstream_cx_none_healthy(&self) -> Counter {
        self.counter(CX_NONE_HEALTHY)
    }
    pub fn upstream_cx_rx_bytes_total(&self) -> Counter {
        self.counter(CX_RX_BYTES)
    }
    pub fn upstream_cx_tx_bytes_total(&self) -> Counter {
        self.counter(CX_TX_BYTES)
    }
    pub fn upstream_cx_connect_ms(&self) -> Histogram {
        self.histogram(CONNECT_MS)
    }
    pub fn upstream_rq_total(&self) -> Counter {
        self.counter(RQ_TOTAL)
    }
    pub fn upstream_rq_active(&self) -> Gauge {
        self.gauge(RQ_ACTIVE)
    }
    pub fn upstream_rq_time(&self) -> Histogram {
        self.histogram(RQ_TIME)
    }
    pub fn membership_healthy(&self) -> Gauge {
        self.gauge(MEMBERSHIP_HEALTHY)
    }
    pub fn membership_total(&self) -> Gauge {
        self.gauge(MEMBERSHIP_TOTAL)
    }
    /// The cluster's circuit-breaker counts (`relay::admission`).
    pub fn gate(&self) -> &crate::relay::admission::Gate {
        &self.0.breakers().gate
    }
    pub fn upstream_cx_overflow(&self) -> Counter {
        self.counter(CX_OVERFLOW)
    }
    pub fn upstream_rq_pending_overflow(&self) -> Counter {
        self.counter(RQ_PENDING_OVERFLOW)
    }
    pub fn upstream_rq_pending_active(&self) -> Gauge {
        self.gauge(RQ_PENDING_ACTIVE)
    }
    pub fn upstream_cx_tx_bytes_buffered(&self) -> Gauge {
        self.gauge(TX_BUFFERED)
    }
    pub fn upstream_cx_rx_bytes_buffered(&self) -> Gauge {
        self.gauge(RX_BUFFERED)
    }
    pub fn cx_open(&self) -> Gauge {
        self.gauge(CB_CX_OPEN)
    }
    pub fn rq_pending_open(&self) -> Gauge {
        self.gauge(CB_RQ_PENDING_OPEN)
    }
    pub fn remaining_cx(&self) -> Gauge {
        self.gauge(CB_REMAINING_CX)
    }
    pub fn remaining_pending(&self) -> Gauge {
        self.gauge(CB_REMAINING_PENDING)
    }
}

/// Every live cluster's values, for rendering.
#[derive(Default)]
pub struct ClusterSet {
    clusters: Mutex<BTreeMap<ClusterName, Arc<Cells>>>,
}

impl ClusterSet {
    /// The stats of cluster `name`, starting at zero.
    pub fn add(&self, name: &ClusterName) -> ClusterStats {
        let stats = ClusterStats::default();
        self.clusters.lock().insert(name.clone(), stats.0.clone());
        stats
    }

    /// Drops cluster `name`'s series (the cluster left the table).
    pub fn remove(&self, name: &ClusterName) {
        self.clusters.lock().remove(name);
    }

    /// Writes the exposition text of every cluster's series (`used_only`:
    /// of clusters never used, the membership gauges only) to `out`;
    /// stops at the first write that fails.
    pub fn render(&self, used_only: bool, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        let list: Vec<(ClusterName, Arc<Cells>)> = self
            .clusters
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if list.is_empty() {
            return Ok(());
        }
        let shown = |c: &Cells| !used_only || c.used.load(Ordering::Relaxed);
        for (i, (name, help)) in COUNTERS.iter().enumerate() {
            header(out, name, Some(help), Kind::Counter)?;
            for (cluster, c) in list.iter().filter(|(_, c)| shown(c)) {
                let v = c.counter_value(i);
                sample(out, name, "", &label(cluster), None, v)?;
            }
        }
        for (i, (name, help)) in GAUGES.iter().enumerate() {
            header(out, name, Some(help), Kind::Gauge)?;
            let always = i == MEMBERSHIP_HEALTHY || i == MEMBERSHIP_TOTAL;
            for (cluster, c) in list.iter().filter(|(_, c)| always || shown(c)) {
                let v = c.gauge_value(i);
                sample(out, name, "", &label(cluster), None, v)?;
            }
        }
        for (i, (name, help)) in HISTOGRAMS.iter().enumerate() {
            header(out, name, Some(help), Kind::Histogram)?;
            for (cluster, c) in list.iter().filter(|(_, c)| shown(c)) {
                let h = c.hists.get().map(|h| &h[i]);
                MsHistogram::write(h, out, name, &label(cluster))?;
            }
        }
        Ok(())
    }
}

/// A cluster's label pair.
fn label(cluster: &ClusterName) -> [(&'static str, &str); 1] {
    [(envoy::CLUSTER_NAME_LABEL, cluster.as_str())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_used_clusters_whole_and_idle_ones_by_membership() {
        let set = ClusterSet::default();
        let busy = set.add(&ClusterName::for_port("ns", "busy", "tcp"));
        let idle = set.add(&ClusterName::for_port("ns", "idle", ""));
        busy.membership_total().set(2.0);
        idle.membership_total().set(1.0);
        busy.upstream_cx_total().increment(3);
        busy.upstream_cx_connect_ms().record(7.0);
        busy.upstream_cx_active().increment(1.0);
        let mut text = String::new();
        let _ = set.render(true, &mut text);
        for line in [
            "envoy_cluster_upstream_cx_total{envoy_cluster_name=\"ns/busy-tcp\"} 3\n",
            "envoy_cluster_upstream_cx_active{envoy_cluster_name=\"ns/busy-tcp\"} 1\n",
            "envoy_cluster_membership_total{envoy_cluster_name=\"ns/busy-tcp\"} 2\n",
            "envoy_cluster_membership_total{envoy_cluster_name=\"ns/idle\"} 1\n",
            "envoy_cluster_upstream_cx_connect_ms_bucket{envoy_cluster_name=\"ns/busy-tcp\",le=\"5\"} 0\n",
            "envoy_cluster_upstream_cx_connect_ms_bucket{envoy_cluster_name=\"ns/busy-tcp\",le=\"10\"} 1\n",
            "envoy_cluster_upstream_cx_connect_ms_count{envoy_cluster_name=\"ns/busy-tcp\"} 1\n",
            "# TYPE envoy_cluster_upstream_cx_connect_ms histogram\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(
            !text.contains("upstream_cx_total{envoy_cluster_name=\"ns/idle\"}"),
            "{text}"
        );
        let mut all = String::new();
        let _ = set.render(false, &mut all);
        assert!(
            all.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"ns/idle\"} 0\n"),
            "{all}"
        );
        assert!(
            all.contains(
                "envoy_cluster_upstream_rq_time_count{envoy_cluster_name=\"ns/idle\"} 0\n"
            ),
            "{all}"
        );
        set.remove(&ClusterName::for_port("ns", "idle", ""));
        let mut after = String::new();
        let _ = set.render(false, &mut after);
        assert!(!after.contains("ns/idle"), "{after}");
    }
}
