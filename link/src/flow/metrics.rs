//! The flow-control and HTTP/2 window gauges (ours, not upstream's) that
//! proxy-server and proxy-agent both show, read from the process's
//! [`FlowPool`] when the metrics are rendered (docs/konnectivity.md,
//! "Windows that follow the link"). Each side names them by its prefix and
//! words the HELP by what it is linked to ([`crate::flow_gauge_names!`]).

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

/// One side's [`FlowGaugeNames`], as a constant: the families
/// `<prefix>_flow_control_{window,parked,reserved,budget}_bytes` and
/// `<prefix>_http2_window_bytes`, their HELP naming the side's `peers`
/// (who send it DATA under flow control), what it passes that DATA `on_to`,
/// and the flag that bounds its HTTP/2 windows.
#[macro_export]
macro_rules! flow_gauge_names {
    (prefix: $prefix:literal, peers: $peers:literal, on_to: $to:literal, http2_flag: $flag:literal $(,)?) => {
        $crate::flow::metrics::FlowGaugeNames {
            windows: (
                concat!($prefix, "_flow_control_window_bytes"),
                concat!(
                    "Ours: sum of the current flow-control windows of connections through ",
                    $peers,
                    " of this project, bytes the ",
                    $peers,
                    " may send before hearing from us (each grows with its link, see --flow-control-max-window)."
                ),
            ),
            parked: (
                concat!($prefix, "_flow_control_parked_bytes"),
                concat!(
                    "Ours: bytes received from ",
                    $peers,
                    " and not yet passed on to ",
                    $to,
                    ", every connection."
                ),
            ),
            reserved: (
                concat!($prefix, "_flow_control_reserved_bytes"),
                "Ours: bytes reserved against --flow-control-budget by flow-control and HTTP/2 windows.",
            ),
            budget: (
                concat!($prefix, "_flow_control_budget_bytes"),
                "Ours: --flow-control-budget in bytes.",
            ),
            http2: (
                concat!($prefix, "_http2_window_bytes"),
                concat!(
                    "Ours: sum of the current HTTP/2 receive windows of the connections to ",
                    $peers,
                    " (each grows with its link, see ",
                    $flag,
                    ")."
                ),
            ),
        }
    };
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
