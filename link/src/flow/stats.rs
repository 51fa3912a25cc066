//! What both kinds of agent stream (credit-based and legacy) report and
//! fail with: the process's window and parked-byte totals, and why DATA was
//! refused.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Totals over every receive window of a process, for its metrics.
#[derive(Debug, Default)]
pub struct FlowStats {
    windows: AtomicI64,
    parked: AtomicI64,
}

impl FlowStats {
    /// Sum of the current receive windows of all flow-controlled connections.
    pub fn windows(&self) -> i64 {
        self.windows.load(Ordering::Relaxed)
    }

    /// Bytes received from the peer and not yet passed on, every connection
    /// (with upstream peers too).
    pub fn parked(&self) -> i64 {
        self.parked.load(Ordering::Relaxed)
    }

    pub(crate) fn add_parked(&self, n: i64) {
        self.parked.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn add_windows(&self, n: i64) {
        self.windows.fetch_add(n, Ordering::Relaxed);
    }
}

/// Why incoming DATA was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// Legacy peer: the consumer left the queue full for the whole stall limit.
    #[error("the reader did not take data for {0:?}")]
    Stalled(Duration),
    /// Flow-controlled peer: it sent more than it was granted.
    #[error("peer exceeded the flow-control window of {0} bytes")]
    Exceeded(i64),
}
