//! Per-connection flow control between peers of this project (not part of
//! upstream's protocol; upstream peers never see it).
//!
//! Upstream multiplexes every connection of an agent over one stream with no
//! per-connection flow control, so one reader that stops reading stalls all
//! of them. Here, when both ends announce it at stream set-up (request
//! metadata from the agent, response header from the server, both
//! [`crate::header::FLOW_WINDOW`]), each side of each connection may have at
//! most `window` bytes of DATA in flight that the other side has not yet
//! passed on; the receiver returns credit with WINDOW_UPDATE as it delivers
//! (to the frontend, or to the destination). A side that ignores the
//! announcement simply falls back to upstream's behaviour.
//!
//! Every DATA packet costs at least [`MIN_COST`] bytes of credit, so the
//! number of queued packets is bounded too (`window / MIN_COST`); a packet
//! larger than the window costs exactly the window, so it can still pass.
//! Both ends compute the same charge; a peer that sends past the window is
//! broken and loses that connection.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

/// Smallest credit a DATA packet costs, whatever its length.
pub const MIN_COST: i64 = 256;
/// Largest gRPC message either side accepts (grpc-go's default).
pub const MAX_PACKET: i64 = 4 << 20;
/// The window we announce by default, per connection and direction.
pub const DEFAULT_WINDOW: i64 = 1 << 20;
/// Smallest and largest windows a peer may ask for.
pub const MIN_WINDOW: i64 = 64 << 10;
pub const MAX_WINDOW: i64 = 64 << 20;

/// The credit a DATA payload of `len` bytes costs.
pub fn cost(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX).max(MIN_COST)
}

/// Parses a peer's announced window: a decimal byte count, clamped to
/// [`MIN_WINDOW`]..=[`MAX_WINDOW`]. `None` if absent or not a number.
pub fn parse_window(value: Option<&str>) -> Option<i64> {
    value?
        .trim()
        .parse::<i64>()
        .ok()
        .map(|w| w.clamp(MIN_WINDOW, MAX_WINDOW))
}

/// Credit is returned once this much has been consumed: fewer updates, still
/// well before the sender runs dry.
pub fn update_threshold(window: i64) -> i64 {
    (window / 4).max(MIN_COST)
}

/// Why incoming DATA was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// Legacy peer: the consumer left the queue full for the whole stall limit.
    #[error("the reader did not take data for {0:?}")]
    Stalled(Duration),
    /// Flow-controlled peer: it sent more than the window allows.
    #[error("peer exceeded the flow-control window of {0} bytes")]
    Exceeded(i64),
}

/// Admission for one connection's incoming DATA, before it is queued for the
/// local consumer (frontend or destination).
pub enum RecvGate {
    /// Upstream peer: at most `slots` packets queued; when full, the stream
    /// reader waits at most `stall` before the connection is given up.
    Legacy { slots: Semaphore, stall: Duration },
    /// Flow-controlled peer: at most `window` bytes of credit outstanding;
    /// credit goes back in batches as the consumer passes data on.
    Window {
        window: i64,
        outstanding: AtomicI64,
        unreported: AtomicI64,
    },
}

impl RecvGate {
    pub fn legacy(slots: usize, stall: Duration) -> Self {
        RecvGate::Legacy {
            slots: Semaphore::new(slots.max(1)),
            stall,
        }
    }

    pub fn window(window: i64) -> Self {
        RecvGate::Window {
            window,
            outstanding: AtomicI64::new(0),
            unreported: AtomicI64::new(0),
        }
    }

    /// Whether admitting now would have to wait (legacy only).
    pub fn is_full(&self) -> bool {
        matches!(self, RecvGate::Legacy { slots, .. } if slots.available_permits() == 0)
    }

    /// Admits DATA of `len` bytes, waiting (legacy only) for room.
    pub async fn admit(&self, len: usize) -> Result<(), GateError> {
        match self {
            RecvGate::Legacy { slots, stall } => {
                match tokio::time::timeout(*stall, slots.acquire()).await {
                    Ok(Ok(p)) => {
                        p.forget();
                        Ok(())
                    }
                    _ => Err(GateError::Stalled(*stall)),
                }
            }
            RecvGate::Window {
                window,
                outstanding,
                ..
            } => {
                let charge = charge(len, *window);
                let now = outstanding.fetch_add(charge, Ordering::AcqRel) + charge;
                if now > *window {
                    return Err(GateError::Exceeded(*window));
                }
                Ok(())
            }
        }
    }

    /// The consumer passed on DATA of `len` bytes. Returns credit to grant
    /// the peer now (flow control, once enough has built up).
    pub fn consumed(&self, len: usize) -> Option<i64> {
        match self {
            RecvGate::Legacy { slots, .. } => {
                slots.add_permits(1);
                None
            }
            RecvGate::Window {
                window,
                outstanding,
                unreported,
            } => {
                let charge = charge(len, *window);
                outstanding.fetch_sub(charge, Ordering::AcqRel);
                let pending = unreported.fetch_add(charge, Ordering::AcqRel) + charge;
                if pending < update_threshold(*window) {
                    return None;
                }
                let taken = unreported.swap(0, Ordering::AcqRel);
                (taken > 0).then_some(taken)
            }
        }
    }
}

/// The sending side's credit for one connection, granted by the peer.
pub struct SendGate {
    window: i64,
    credit: Semaphore,
}

impl SendGate {
    pub fn new(window: i64) -> Self {
        SendGate {
            window,
            credit: Semaphore::new(usize::try_from(window).unwrap_or(0)),
        }
    }

    /// Waits until DATA of `len` bytes may be sent, and takes its credit.
    pub async fn acquire(&self, len: usize) {
        let n = u32::try_from(charge(len, self.window)).unwrap_or(u32::MAX);
        if let Ok(p) = self.credit.acquire_many(n).await {
            p.forget();
        }
    }

    /// Credit the peer returned. More than one window in hand is ignored: a
    /// peer cannot make us buffer more than we agreed on.
    pub fn grant(&self, bytes: i64) {
        let have = i64::try_from(self.credit.available_permits()).unwrap_or(i64::MAX);
        let add = bytes.min(self.window - have).max(0);
        self.credit.add_permits(usize::try_from(add).unwrap_or(0));
    }

    /// Wakes any waiting sender for good (the connection is closing).
    pub fn close(&self) {
        self.credit.close();
    }
}

/// What DATA of `len` bytes counts against a window: its cost, but never more
/// than the whole window, so one oversize packet can still pass.
fn charge(len: usize, window: i64) -> i64 {
    cost(len).min(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn window_admits_up_to_the_window_and_returns_credit_in_batches() {
        let gate = RecvGate::window(MIN_WINDOW);
        let chunk = (MIN_WINDOW / 8) as usize;
        for _ in 0..8 {
            assert_eq!(gate.admit(chunk).await, Ok(()));
        }
        assert_eq!(gate.admit(1).await, Err(GateError::Exceeded(MIN_WINDOW)));
        assert_eq!(gate.consumed(chunk), None);
        assert_eq!(gate.consumed(chunk), Some(2 * chunk as i64));
    }

    #[tokio::test]
    async fn legacy_stalls_after_the_limit() {
        let gate = RecvGate::legacy(1, Duration::from_millis(20));
        assert_eq!(gate.admit(10).await, Ok(()));
        assert_eq!(
            gate.admit(10).await,
            Err(GateError::Stalled(Duration::from_millis(20)))
        );
        assert_eq!(gate.consumed(10), None);
        assert_eq!(gate.admit(10).await, Ok(()));
    }

    #[tokio::test]
    async fn sender_waits_for_credit_and_ignores_excess_grants() {
        let gate = std::sync::Arc::new(SendGate::new(MIN_WINDOW));
        gate.acquire(MIN_WINDOW as usize).await;
        let g = gate.clone();
        let waiting = tokio::spawn(async move { g.acquire(10).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        gate.grant(i64::MAX);
        waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(gate.credit.available_permits() <= MIN_WINDOW as usize);
        // Oversize packets take the whole window, never more.
        gate.grant(MIN_WINDOW);
        gate.acquire(MAX_PACKET as usize).await;
    }

    #[test]
    fn costs_and_windows() {
        assert_eq!(cost(1), MIN_COST);
        assert_eq!(cost(65536), 65536);
        assert_eq!(parse_window(Some("1048576")), Some(1 << 20));
        assert_eq!(parse_window(Some("1")), Some(MIN_WINDOW));
        assert_eq!(
            parse_window(Some(&(1i64 << 40).to_string())),
            Some(MAX_WINDOW)
        );
        assert_eq!(parse_window(Some("lots")), None);
        assert_eq!(parse_window(None), None);
    }
}
