//! The flow-control and HTTP/2 window gauges (ours, not upstream's) that
//! proxy-server and proxy-agent both show, read from the process's
//! [`FlowPool`] when the metrics are rendered (docs/konnectivity.md,
//! "Windows that follow the link"). Each side names them and words the HELP.

use std::sync::{Arc, OnceLock};

use go_compat::gometrics::{Gauge, Registry};

use super::FlowPool;

/// One side's family names and HELP text, `(name, help)` each.
pub struct FlowGaugeNames {
    pub windows: (&'static str, &'static str),
    pub parked: (&'static str, &'static str),
    pub reserved: (&'static str, &'static str),
    pub budget: (&'static str, &'static str),
    pub http2: (&'static str, &'static str),
}

pub struct FlowGauges {
    pool: OnceLock<Arc<FlowPool>>,
    windows: Gauge,
    parked: Gauge,
    reserved: Gauge,
    budget: Gauge,
    http2: Gauge,
}

impl FlowGauges {
    pub fn new(r: &Registry, n: &FlowGaugeNames) -> Self {
        let gauge = |(name, help): (&'static str, &'static str)| {
            r.describe_gauge(name, help);
            r.gauge(name, &[])
        };
        FlowGauges {
            pool: OnceLock::new(),
            windows: gauge(n.windows),
            parked: gauge(n.parked),
            reserved: gauge(n.reserved),
            budget: gauge(n.budget),
            http2: gauge(n.http2),
        }
    }

    /// Shows `pool`'s windows and budget from now on.
    pub fn watch(&self, pool: Arc<FlowPool>) {
        let _ = self.pool.set(pool);
    }

    /// Reads the pool into the gauges (before a scrape).
    pub fn update(&self) {
        let Some(pool) = self.pool.get() else { return };
        let s = pool.snapshot();
        self.windows.set(s.windows as f64);
        self.parked.set(s.parked as f64);
        self.reserved.set(s.reserved as f64);
        self.budget.set(s.budget as f64);
        self.http2.set(s.http2_windows as f64);
    }
}
