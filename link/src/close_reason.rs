//! Why a connection (tunnel, dial, stream) ended, as a fixed set of words:
//! the `reason` label of every binary's closed-connections counter and the
//! `close_cause` of a `/debug/connections` record. A fixed set keeps the
//! label's series bounded whatever peers send; the free text beside it in
//! `/debug/connections` (`close_reason`) carries the detail.
//!
//! "Client" and "upstream" are the two ends as the process sees them, as in
//! `bytes_from_client` / `bytes_from_upstream`: proxy-server's client is the
//! frontend (kube-apiserver) and its upstream the agent; proxy-agent's client
//! is the server stream and its upstream the destination; nodeport-proxy's
//! client is the downstream connection and its upstream the user cluster's
//! apiserver; tunnel-agent's client is the local connection and its upstream
//! the tunnel to nodeport-proxy.

use crate::relay::RelayEnd;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Both directions ended normally; which side went first is not known.
    Closed,
    /// The client ended it: EOF, CLOSE_REQ, DIAL_CLS, or it left mid-dial.
    ClientClosed,
    /// The upstream ended it: the destination's EOF, the agent's CLOSE_RSP.
    UpstreamClosed,
    /// The client's connection failed or its stream ended without a close.
    ClientLost,
    /// The upstream's connection, or the stream carrying it, failed.
    UpstreamLost,
    /// Not dialled: no agent or route, destination or source not allowed.
    DialRefused,
    /// Dialled, and the destination could not be reached.
    DialFailed,
    /// The dial was not answered in time.
    DialTimeout,
    /// The client did not send its request (hello, header) in time.
    ClientTimeout,
    /// Nothing moved either way for the idle timeout.
    IdleTimeout,
    /// One side stopped reading past the stall limit.
    Stalled,
    /// A peer broke the protocol: a malformed or oversize request, a
    /// window breach, mismatched ids.
    ProtocolError,
    /// A limit refused or cut it.
    Overloaded,
    /// The process is stopping or draining.
    Shutdown,
    /// None was recorded.
    Other,
}

impl CloseReason {
    /// Whether the close was a failure (a trace span's ERROR status): not
    /// one of the sides ending it normally, nor an unknown cause.
    pub fn is_failure(self) -> bool {
        !matches!(
            self,
            CloseReason::Closed
                | CloseReason::ClientClosed
                | CloseReason::UpstreamClosed
                | CloseReason::Other
        )
    }

    pub const ALL: [CloseReason; 15] = [
        CloseReason::Closed,
        CloseReason::ClientClosed,
        CloseReason::UpstreamClosed,
        CloseReason::ClientLost,
        CloseReason::UpstreamLost,
        CloseReason::DialRefused,
        CloseReason::DialFailed,
        CloseReason::DialTimeout,
        CloseReason::ClientTimeout,
        CloseReason::IdleTimeout,
        CloseReason::Stalled,
        CloseReason::ProtocolError,
        CloseReason::Overloaded,
        CloseReason::Shutdown,
        CloseReason::Other,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CloseReason::Closed => "closed",
            CloseReason::ClientClosed => "client_closed",
            CloseReason::UpstreamClosed => "upstream_closed",
            CloseReason::ClientLost => "client_lost",
            CloseReason::UpstreamLost => "upstream_lost",
            CloseReason::DialRefused => "dial_refused",
            CloseReason::DialFailed => "dial_failed",
            CloseReason::DialTimeout => "dial_timeout",
            CloseReason::ClientTimeout => "client_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Stalled => "stalled",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::Overloaded => "overloaded",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Other => "other",
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl From<&RelayEnd> for CloseReason {
    fn from(end: &RelayEnd) -> Self {
        match end {
            RelayEnd::Closed => CloseReason::Closed,
            RelayEnd::Idle => CloseReason::IdleTimeout,
            RelayEnd::Stopped => CloseReason::Shutdown,
            RelayEnd::ClientError(_) => CloseReason::ClientLost,
            RelayEnd::UpstreamError(_) => CloseReason::UpstreamLost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_words() {
        let mut seen = std::collections::HashSet::new();
        for r in CloseReason::ALL {
            let l = r.label();
            assert!(
                l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{l}"
            );
            assert!(seen.insert(l), "{l} twice");
        }
    }
}
