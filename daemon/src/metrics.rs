//! A Prometheus registry owned by one component instance (not a
//! process-global recorder), so two servers in one test process never share
//! counters: nodeport-proxy's and tunnel-agent's Envoy-named stats.
//! proxy-server and proxy-agent write client_golang's exposition instead
//! ([`go_compat::gometrics`]).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub struct Registry {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

const META: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, None);

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label::new(*k, v.to_string()))
        .collect();
    Key::from_parts(name, labels)
}

impl Registry {
    /// `buckets` lists the histograms and their bucket bounds; histograms not
    /// listed would be rendered as summaries, which upstream never uses.
    pub fn new(buckets: &[(&'static str, &[f64])]) -> Self {
        let mut builder = PrometheusBuilder::new();
        for (name, bounds) in buckets.iter().filter(|(_, b)| !b.is_empty()) {
            // Only an empty bucket list is rejected, and those are filtered out.
            builder = builder
                .set_buckets_for_metric(Matcher::Full((*name).to_string()), bounds)
                .unwrap_or_else(|_| PrometheusBuilder::new());
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        Registry { recorder, handle }
    }

    pub fn describe_counter(&self, name: &'static str, help: &'static str) {
        self.recorder.describe_counter(
            KeyName::from_const_str(name),
            None,
            SharedString::const_str(help),
        );
    }

    pub fn describe_gauge(&self, name: &'static str, help: &'static str) {
        self.recorder.describe_gauge(
            KeyName::from_const_str(name),
            None,
            SharedString::const_str(help),
        );
    }

    pub fn describe_histogram(&self, name: &'static str, help: &'static str) {
        self.recorder.describe_histogram(
            KeyName::from_const_str(name),
            None,
            SharedString::const_str(help),
        );
    }

    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.recorder.register_counter(&key(name, labels), &META)
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.recorder.register_gauge(&key(name, labels), &META)
    }

    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.recorder.register_histogram(&key(name, labels), &META)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Folds pending histogram samples; call periodically so they do not pile up
    /// between scrapes.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Runs [`Registry::upkeep`] every few seconds until `drain` stops.
    pub async fn run_upkeep(self: std::sync::Arc<Self>, drain: crate::drain::Drain) {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => self.upkeep(),
                _ = drain.stopping() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_labels_and_buckets() {
        let r = Registry::new(&[("x_seconds", &[0.5, 1.0])]);
        r.describe_counter("x_total", "How many x happened.");
        r.counter("x_total", &[("reason", "a")]).increment(2);
        r.histogram("x_seconds", &[]).record(0.7);
        let text = r.render();
        assert!(
            text.contains("# HELP x_total How many x happened."),
            "{text}"
        );
        assert!(text.contains("x_total{reason=\"a\"} 2"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"1\"} 1"), "{text}");
        let other = Registry::new(&[]);
        assert!(
            !other.render().contains("x_total"),
            "registries must not share state"
        );
    }
}
