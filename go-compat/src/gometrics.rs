//! A metrics registry that exposes what Prometheus's Go client
//! (client_golang) exposes for the same use, so our `/metrics` and
//! upstream's have the same families, series and text after the same
//! events:
//!
//! - a labelled series appears when it is first used (client_golang creates
//!   it on `WithLabelValues`, followed by its first `Inc`/`Set`/`Observe`),
//!   and a family without series is not written at all; metrics client_golang
//!   creates without labels (`NewGauge`, `NewCounter`) are there from the
//!   start ([`Registry::gauge_always`], [`Registry::counter_always`]);
//! - families sorted by name, series by label values, label names sorted,
//!   `le` last; numbers as Go's `strconv.FormatFloat(f, 'g', -1, 64)`
//!   (`le="1e-06"`), HELP and label values escaped as client_golang does;
//!   histograms without buckets of their own get client_golang's defaults;
//! - `process_*` from `/proc`, as client_golang's process collector reports
//!   them ([`crate::procstat`]), and promhttp's scrape counters
//!   (`promhttp_metric_handler_requests_*`), when asked for. Go's runtime
//!   families (`go_*`) have no counterpart in a Rust process.
//!
//! Written here because no Rust crate writes client_golang's exposition:
//! metrics-exporter-prometheus registers series eagerly and spells floats
//! as Rust does (`le="0.000001"`). Handles are the `metrics` crate's, so the
//! code that counts does not depend on this module.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What [`Registry::gauge`] returns, for crates that keep gauges without
/// depending on `metrics` themselves.
pub use metrics::Gauge;
use metrics::{Counter, CounterFn, GaugeFn, Histogram, HistogramFn};
use parking_lot::Mutex;

use crate::exposition::{header, sample};
use crate::gofmt::go_float;

/// client_golang's `prometheus.DefBuckets`.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Whether a series has been used, so it is written.
#[derive(Debug, Default)]
struct Touched(AtomicBool);

impl Touched {
    fn mark(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct CounterCell {
    touched: Touched,
    value: AtomicU64,
}

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.touched.mark();
        self.value.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.touched.mark();
        self.value.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct GaugeCell {
    touched: Touched,
    bits: AtomicU64,
}

impl GaugeCell {
    fn update(&self, f: impl Fn(f64) -> f64) {
        self.touched.mark();
        let _ = self
            .bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(f(f64::from_bits(b)).to_bits())
            });
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::Relaxed))
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.touched.mark();
        self.bits.store(value.to_bits(), Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct HistogramCell {
    touched: Touched,
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last one is +Inf.
    counts: Vec<AtomicU64>,
    sum_bits: AtomicU64,
    count: AtomicU64,
}

impl HistogramCell {
    fn new(bounds: &'static [f64]) -> Self {
        HistogramCell {
            touched: Touched::default(),
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }
}

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.touched.mark();
        // client_golang: the first bucket whose upper bound is >= value.
        let i = self.bounds.partition_point(|b| *b < value);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((f64::from_bits(b) + value).to_bits())
            });
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
enum Cell {
    Counter(Arc<CounterCell>),
    Gauge(Arc<GaugeCell>),
    Histogram(Arc<HistogramCell>),
}

impl Cell {
    fn touched(&self) -> bool {
        match self {
            Cell::Counter(c) => c.touched.get(),
            Cell::Gauge(g) => g.touched.get(),
            Cell::Histogram(h) => h.touched.get(),
        }
    }
}

/// Label pairs sorted by name, as client_golang orders them.
type LabelSet = Vec<(&'static str, String)>;

#[derive(Debug)]
struct Family {
    kind: Kind,
    help: &'static str,
    series: BTreeMap<LabelSet, Cell>,
}

/// A family registry; cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Registry {
    families: Mutex<BTreeMap<&'static str, Family>>,
    help: Mutex<BTreeMap<&'static str, &'static str>>,
    buckets: BTreeMap<&'static str, &'static [f64]>,
    process: bool,
    promhttp: Option<PromHttp>,
}

/// promhttp's instrumentation of its own handler.
#[derive(Debug)]
struct PromHttp {
    in_flight: Gauge,
    ok: Counter,
}

const IN_FLIGHT: &str = "promhttp_metric_handler_requests_in_flight";
const REQUESTS: &str = "promhttp_metric_handler_requests_total";

impl Registry {
    /// `buckets` gives histograms their bucket bounds; the others get
    /// client_golang's [`DEFAULT_BUCKETS`].
    pub fn new(buckets: &[(&'static str, &'static [f64])]) -> Self {
        Registry {
            buckets: buckets.iter().copied().collect(),
            ..Registry::default()
        }
    }

    /// Adds the families `promhttp.Handler()` on the default registry adds
    /// to a Go program's exposition: `process_*` and promhttp's scrape
    /// counters. Scrapes must then go through [`Registry::scrape`].
    pub fn with_go_defaults(mut self) -> Self {
        self.process = true;
        self.describe_gauge(IN_FLIGHT, "Current number of scrapes being served.");
        self.describe_counter(REQUESTS, "Total number of scrapes by HTTP status code.");
        let in_flight = self.gauge_always(IN_FLIGHT, &[]);
        let ok = self.counter_always(REQUESTS, &[("code", "200")]);
        for code in ["500", "503"] {
            let _ = self.counter_always(REQUESTS, &[("code", code)]);
        }
        self.promhttp = Some(PromHttp { in_flight, ok });
        self
    }

    fn describe(&self, name: &'static str, help: &'static str) {
        self.help.lock().insert(name, help);
        if let Some(f) = self.families.lock().get_mut(name) {
            f.help = help;
        }
    }

    pub fn describe_counter(&self, name: &'static str, help: &'static str) {
        self.describe(name, help)
    }

    pub fn describe_gauge(&self, name: &'static str, help: &'static str) {
        self.describe(name, help)
    }

    pub fn describe_histogram(&self, name: &'static str, help: &'static str) {
        self.describe(name, help)
    }

    fn cell(
        &self,
        name: &'static str,
        kind: Kind,
        labels: &[(&'static str, &str)],
        make: impl FnOnce() -> Cell,
    ) -> Cell {
        let mut set: LabelSet = labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
        set.sort_by(|a, b| a.0.cmp(b.0));
        let help = self.help.lock().get(name).copied().unwrap_or("");
        let mut families = self.families.lock();
        let family = families.entry(name).or_insert_with(|| Family {
            kind,
            help,
            series: BTreeMap::new(),
        });
        debug_assert_eq!(family.kind, kind, "{name} registered as two kinds");
        family.series.entry(set).or_insert_with(make).clone()
    }

    /// The counter `name{labels}`, written from its first increment on.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        match self.cell(name, Kind::Counter, labels, || {
            Cell::Counter(Arc::new(CounterCell::default()))
        }) {
            Cell::Counter(c) => Counter::from_arc(c),
            _ => Counter::noop(),
        }
    }

    /// A counter written from the start, as client_golang's `NewCounter`.
    pub fn counter_always(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        let c = self.counter(name, labels);
        c.increment(0);
        c
    }

    /// The gauge `name{labels}`, written from its first change on.
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        match self.cell(name, Kind::Gauge, labels, || {
            Cell::Gauge(Arc::new(GaugeCell::default()))
        }) {
            Cell::Gauge(g) => Gauge::from_arc(g),
            _ => Gauge::noop(),
        }
    }

    /// A gauge written from the start, as client_golang's `NewGauge`.
    pub fn gauge_always(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        let g = self.gauge(name, labels);
        g.increment(0.0);
        g
    }

    /// The histogram `name{labels}`, written from its first observation on.
    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        let bounds = self.buckets.get(name).copied().unwrap_or(DEFAULT_BUCKETS);
        match self.cell(name, Kind::Histogram, labels, || {
            Cell::Histogram(Arc::new(HistogramCell::new(bounds)))
        }) {
            Cell::Histogram(h) => Histogram::from_arc(h),
            _ => Histogram::noop(),
        }
    }

    /// The exposition, as promhttp serves it: promhttp's own counters move
    /// as they do around a scrape (in flight while it renders, counted once
    /// it is done).
    pub fn scrape(&self) -> String {
        match &self.promhttp {
            Some(p) => {
                p.in_flight.increment(1.0);
                let text = self.render();
                p.in_flight.decrement(1.0);
                p.ok.increment(1);
                text
            }
            None => self.render(),
        }
    }

    /// The exposition text: client_golang's text format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut extra = if self.process {
            crate::procstat::families()
        } else {
            Vec::new()
        };
        // Ours and the process families, merged by name.
        extra.sort_by(|a, b| a.name.cmp(b.name));
        let mut extra = extra.into_iter().peekable();
        let families = self.families.lock();
        for (name, family) in families.iter() {
            while let Some(e) = extra.next_if(|e| e.name < *name) {
                e.write(&mut out);
            }
            write_family(&mut out, name, family);
        }
        drop(families);
        for e in extra {
            e.write(&mut out);
        }
        out
    }
}

fn write_family(out: &mut String, name: &str, family: &Family) {
    let live: Vec<(&LabelSet, &Cell)> = family.series.iter().filter(|(_, c)| c.touched()).collect();
    if live.is_empty() {
        return;
    }
    header(out, name, family.help, family.kind.name());
    for (labels, cell) in live {
        match cell {
            Cell::Counter(c) => sample(
                out,
                name,
                "",
                labels,
                None,
                go_float(c.value.load(Ordering::Relaxed) as f64),
            ),
            Cell::Gauge(g) => sample(out, name, "", labels, None, go_float(g.get())),
            Cell::Histogram(h) => {
                let mut cumulative = 0u64;
                for (i, c) in h.counts.iter().enumerate() {
                    cumulative += c.load(Ordering::Relaxed);
                    let le = h.bounds.get(i).copied().unwrap_or(f64::INFINITY);
                    sample(
                        out,
                        name,
                        "_bucket",
                        labels,
                        Some(&go_float(le)),
                        go_float(cumulative as f64),
                    );
                }
                let sum = f64::from_bits(h.sum_bits.load(Ordering::Relaxed));
                sample(out, name, "_sum", labels, None, go_float(sum));
                sample(
                    out,
                    name,
                    "_count",
                    labels,
                    None,
                    go_float(h.count.load(Ordering::Relaxed) as f64),
                );
            }
        }
    }
}

/// Counters for every combination of two small label sets (say segment ×
/// packet type), looked up by index on a hot path; each series is written
/// from its first increment on, as client_golang would create it.
pub struct CounterGrid {
    cells: Vec<Counter>,
    cols: usize,
}

impl CounterGrid {
    pub fn new(
        registry: &Registry,
        name: &'static str,
        rows: (&'static str, &[&str]),
        cols: (&'static str, &[&str]),
    ) -> Self {
        let mut cells = Vec::with_capacity(rows.1.len() * cols.1.len());
        for r in rows.1 {
            for c in cols.1 {
                cells.push(registry.counter(name, &[(rows.0, r), (cols.0, c)]));
            }
        }
        CounterGrid {
            cells,
            cols: cols.1.len(),
        }
    }

    /// The counter at (`row`, `col`); `None` outside the grid.
    pub fn get(&self, row: usize, col: usize) -> Option<&Counter> {
        if col >= self.cols {
            return None;
        }
        self.cells.get(row * self.cols + col)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_appear_on_first_use_as_client_golang_creates_them() {
        let r = Registry::new(&[("lat_seconds", &[0.000001, 0.0001, 12.5])]);
        r.describe_counter("fail_total", "Failures.\nBy \\reason.");
        r.describe_histogram("lat_seconds", "Latency");
        r.describe_gauge("up", "Up.");
        let timeout = r.counter("fail_total", &[("reason", "timeout")]);
        let _unknown = r.counter("fail_total", &[("reason", "unknown")]);
        let lat = r.histogram("lat_seconds", &[]);
        let _up = r.gauge_always("up", &[]);
        assert_eq!(r.render(), "# HELP up Up.\n# TYPE up gauge\nup 0\n");
        timeout.increment(2);
        lat.record(0.00005);
        lat.record(20.0);
        assert_eq!(
            r.render(),
            "# HELP fail_total Failures.\\nBy \\\\reason.\n# TYPE fail_total counter\nfail_total{reason=\"timeout\"} 2\n\
             # HELP lat_seconds Latency\n# TYPE lat_seconds histogram\n\
             lat_seconds_bucket{le=\"1e-06\"} 0\nlat_seconds_bucket{le=\"0.0001\"} 1\nlat_seconds_bucket{le=\"12.5\"} 1\nlat_seconds_bucket{le=\"+Inf\"} 2\n\
             lat_seconds_sum 20.00005\nlat_seconds_count 2\n\
             # HELP up Up.\n# TYPE up gauge\nup 0\n"
        );
    }

    #[test]
    fn labels_sorted_by_name_series_by_values_le_last() {
        let r = Registry::new(&[]);
        r.describe_histogram("h", "H");
        r.histogram("h", &[("zone", "b"), ("code", "200")])
            .record(1.0);
        r.histogram("h", &[("zone", "a"), ("code", "200")])
            .record(0.001);
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "h_bucket{code=\"200\",zone=\"a\",le=\"0.005\"} 1");
        assert!(
            text.find("zone=\"a\"").unwrap_or(usize::MAX) < text.find("zone=\"b\"").unwrap_or(0)
        );
        // DefBuckets: 11 bounds and +Inf per series.
        assert_eq!(text.matches("_bucket{").count(), 24);
        r.counter("c", &[("v", "a\"b\\\n")]).increment(1);
        assert!(
            r.render().contains("c{v=\"a\\\"b\\\\\\n\"} 1\n"),
            "{}",
            r.render()
        );
    }

    #[test]
    fn scrapes_count_themselves_after_they_are_served() {
        let r = Registry::new(&[]).with_go_defaults();
        let first = r.scrape();
        assert!(first.contains("promhttp_metric_handler_requests_in_flight 1\n"));
        assert!(first.contains("promhttp_metric_handler_requests_total{code=\"200\"} 0\n"));
        assert!(first.contains("promhttp_metric_handler_requests_total{code=\"503\"} 0\n"));
        assert!(first.contains("# TYPE process_cpu_seconds_total counter\n"));
        let second = r.scrape();
        assert!(second.contains("promhttp_metric_handler_requests_total{code=\"200\"} 1\n"));
        let names: Vec<&str> = second
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "families sorted by name");
    }

    #[test]
    fn gauges_and_counter_grid() {
        let r = Registry::new(&[]);
        let g = r.gauge("pending", &[]);
        assert_eq!(r.render(), "");
        g.increment(3.0);
        g.decrement(1.0);
        assert!(r.render().ends_with("pending 2\n"));
        let grid = CounterGrid::new(&r, "grid_total", ("row", &["a", "b"]), ("col", &["x", "y"]));
        assert!(!r.render().contains("grid_total"));
        if let Some(c) = grid.get(1, 0) {
            c.increment(3);
        }
        assert!(grid.get(0, 2).is_none() && grid.get(2, 0).is_none());
        let text = r.render();
        assert!(
            text.contains("grid_total{col=\"x\",row=\"b\"} 3\n"),
            "{text}"
        );
        assert_eq!(text.matches("grid_total{").count(), 1, "{text}");
    }
}
