//! Envoy's Prometheus exposition: the one path nodeport-proxy's and
//! tunnel-agent's stats are written through (proxy-server and proxy-agent
//! write client_golang's instead, [`go_compat::gometrics`]).
//!
//! Written here rather than with metrics-exporter-prometheus (used before)
//! because this is cheaper where it matters and covers both kinds of
//! series the two binaries have:
//! - an update is one atomic operation on the series' own cell (the
//!   exporter's cells carried a generation counter too, a second atomic on
//!   every byte count), and a handle is looked up only when registered;
//! - the same writer renders the per-cluster series nodeport-proxy keeps
//!   outside the [`Registry`] (tens of thousands of clusters at seed scale,
//!   a few atomics each, removed with the cluster, [`MsHistogram`]s
//!   allocated on first use), so the two can not drift apart in format.
//!
//! A [`Registry`] belongs to one component instance (not a process-global
//! recorder), so two servers in one test process never share counters.
//! Handles are the `metrics` crate's, so code that counts does not know
//! where its counts go. Which `envoy_*` series both binaries export is
//! declared in [`crate::envoy_stats`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Gauge};
use parking_lot::Mutex;

/// A series' label pairs, keys in the order given at registration.
type Labels = Vec<(&'static str, Box<str>)>;

/// Counters and gauges by name, then by label set.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Families>,
}

#[derive(Default)]
struct Families {
    help: BTreeMap<&'static str, Cow<'static, str>>,
    counters: BTreeMap<&'static str, BTreeMap<Labels, Arc<AtomicU64>>>,
    /// f64 bits.
    gauges: BTreeMap<&'static str, BTreeMap<Labels, Arc<AtomicU64>>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Registry")
    }
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, Box::from(*v))).collect()
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The HELP text of `name`; the first description given wins. A name
    /// is rendered only once it has a series.
    pub fn describe_counter(&self, name: &'static str, help: impl Into<Cow<'static, str>>) {
        self.describe(name, help.into());
    }

    pub fn describe_gauge(&self, name: &'static str, help: impl Into<Cow<'static, str>>) {
        self.describe(name, help.into());
    }

    fn describe(&self, name: &'static str, help: Cow<'static, str>) {
        self.inner.lock().help.entry(name).or_insert(help);
    }

    /// The counter `name{labels}`, at zero if new: the same one for the
    /// same name and labels.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        Counter::from_arc(Self::cell(&mut self.inner.lock().counters, name, labels))
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        Gauge::from_arc(Self::cell(&mut self.inner.lock().gauges, name, labels))
    }

    fn cell(
        families: &mut BTreeMap<&'static str, BTreeMap<Labels, Arc<AtomicU64>>>,
        name: &'static str,
        pairs: &[(&'static str, &str)],
    ) -> Arc<AtomicU64> {
        families
            .entry(name)
            .or_default()
            .entry(labels(pairs))
            .or_default()
            .clone()
    }

    /// The exposition text: counters, then gauges, each family followed by
    /// an empty line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = self.render_to(&mut out);
        out
    }

    fn render_to(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let f = self.inner.lock();
        let kinds = [(&f.counters, Kind::Counter), (&f.gauges, Kind::Gauge)];
        for (families, kind) in kinds {
            for (name, series) in families.iter().filter(|(_, s)| !s.is_empty()) {
                header(out, name, f.help.get(name).map(|h| &**h), kind)?;
                for (pairs, cell) in series {
                    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, &**v)).collect();
                    let bits = cell.load(Ordering::Relaxed);
                    match kind {
                        Kind::Counter => sample(out, name, "", &pairs, None, bits)?,
                        _ => sample(out, name, "", &pairs, None, f64::from_bits(bits))?,
                    }
                }
                out.write_char('\n')?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The `# HELP` (when there is a text) and `# TYPE` lines of a family.
pub fn header(
    out: &mut impl fmt::Write,
    name: &str,
    help: Option<&str>,
    kind: Kind,
) -> fmt::Result {
    if let Some(help) = help {
        writeln!(out, "# HELP {name} {}", escape(help, false))?;
    }
    writeln!(out, "# TYPE {name} {}", kind.as_str())
}

/// One sample line: `name` + `suffix`, the labels (and `extra`, as
/// histogram buckets' `le`), the value.
pub fn sample(
    out: &mut impl fmt::Write,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    extra: Option<(&str, &dyn fmt::Display)>,
    value: impl fmt::Display,
) -> fmt::Result {
    out.write_str(name)?;
    out.write_str(suffix)?;
    if !labels.is_empty() || extra.is_some() {
        out.write_char('{')?;
        for (i, (k, v)) in labels.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            write!(out, "{comma}{k}=\"{}\"", escape(v, true))?;
        }
        if let Some((k, v)) = extra {
            let comma = if labels.is_empty() { "" } else { "," };
            write!(out, "{comma}{k}=\"{v}\"")?;
        }
        out.write_char('}')?;
    }
    writeln!(out, " {value}")
}

/// A label value (`quote`) or HELP text as the exposition format wants it.
fn escape(v: &str, quote: bool) -> Cow<'_, str> {
    let special: &[char] = if quote {
        &['\\', '\n', '"']
    } else {
        &['\\', '\n']
    };
    if !v.contains(special) {
        return v.into();
    }
    let mut s = v.replace('\\', "\\\\").replace('\n', "\\n");
    if quote {
        s = s.replace('"', "\\\"");
    }
    s.into()
}

/// Envoy's default histogram buckets, in milliseconds.
pub const MS_BUCKETS: &[f64] = &[
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

/// A histogram over [`MS_BUCKETS`] in atomics: Envoy's millisecond timings.
#[derive(Default)]
pub struct MsHistogram {
    buckets: [AtomicU64; MS_BUCKETS.len()],
    /// f64 bits.
    sum: AtomicU64,
    count: AtomicU64,
}

impl MsHistogram {
    pub fn record(&self, v: f64) {
        if let Some(i) = MS_BUCKETS.iter().position(|b| v <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        add_f64(&self.sum, v);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The `_bucket`, `_sum` and `_count` lines of `h` (all zero for
    /// `None`, a histogram never recorded to).
    pub fn write(
        h: Option<&MsHistogram>,
        out: &mut impl fmt::Write,
        name: &str,
        labels: &[(&str, &str)],
    ) -> fmt::Result {
        let mut cumulative = 0;
        for (j, bound) in MS_BUCKETS.iter().enumerate() {
            cumulative += h.map_or(0, |h| h.buckets[j].load(Ordering::Relaxed));
            sample(
                out,
                name,
                "_bucket",
                labels,
                Some(("le", bound)),
                cumulative,
            )?;
        }
        let count = h.map_or(0, |h| h.count.load(Ordering::Relaxed));
        let sum = h.map_or(0.0, |h| f64::from_bits(h.sum.load(Ordering::Relaxed)));
        sample(out, name, "_bucket", labels, Some(("le", &"+Inf")), count)?;
        sample(out, name, "_sum", labels, None, sum)?;
        sample(out, name, "_count", labels, None, count)
    }
}

/// Adds `v` to the f64 whose bits `cell` holds.
pub fn add_f64(cell: &AtomicU64, v: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
        Some((f64::from_bits(b) + v).to_bits())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_labels_and_shares_series() {
        let r = Registry::new();
        r.describe_counter("x_total", "How many x happened.");
        r.describe_counter("x_total", "ignored: the first description wins");
        r.describe_gauge(
            "y",
            "Undescribed families are left out until they have a series.",
        );
        r.counter("x_total", &[("reason", "a")]).increment(2);
        r.counter("x_total", &[("reason", "a")]).increment(1);
        r.gauge("g", &[("addr", "[::1]:80"), ("k", "q\"\\\n")])
            .set(1.5);
        let text = r.render();
        assert_eq!(
            text,
            "# HELP x_total How many x happened.\n# TYPE x_total counter\n\
             x_total{reason=\"a\"} 3\n\n\
             # TYPE g gauge\ng{addr=\"[::1]:80\",k=\"q\\\"\\\\\\n\"} 1.5\n\n"
        );
        let other = Registry::new();
        assert!(
            !other.render().contains("x_total"),
            "registries must not share state"
        );
    }

    #[test]
    fn histogram_is_cumulative_and_none_is_zero() {
        let h = MsHistogram::default();
        h.record(0.3);
        h.record(7.0);
        h.record(1e9);
        let mut text = String::new();
        let _ = MsHistogram::write(Some(&h), &mut text, "t", &[("c", "x")]);
        for line in [
            "t_bucket{c=\"x\",le=\"0.5\"} 1\n",
            "t_bucket{c=\"x\",le=\"5\"} 1\n",
            "t_bucket{c=\"x\",le=\"10\"} 2\n",
            "t_bucket{c=\"x\",le=\"3600000\"} 2\n",
            "t_bucket{c=\"x\",le=\"+Inf\"} 3\n",
            "t_count{c=\"x\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        let mut none = String::new();
        let _ = MsHistogram::write(None, &mut none, "t", &[]);
        assert!(
            none.contains("t_bucket{le=\"+Inf\"} 0\nt_sum 0\nt_count 0\n"),
            "{none}"
        );
    }
}
