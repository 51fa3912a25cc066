//! Identifiers that travel in packets and metadata. Each is its own type so a
//! dial id can never be used where a connect id is meant.

use std::fmt;

/// The `random` of DIAL_REQ / DIAL_RSP / DIAL_CLS: chosen by whoever dials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DialId(pub i64);

/// The `connectID` an agent assigns to an established connection, unique only
/// within one agent stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectId(pub i64);

/// An agent's self-declared id (`agentid` metadata).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub String);

/// A proxy server's id (`serverid` response header).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(pub String);

impl DialId {
    /// A fresh non-negative id, like Go's `rand.Int63()`.
    pub fn random() -> Self {
        DialId(rand_i63())
    }
}

fn rand_i63() -> i64 {
    // Mixing the time with a per-process counter through SipHash's random keys
    // gives unpredictable ids without another dependency.
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() >> 1) as i64
}

macro_rules! display {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    )*};
}
display!(DialId, ConnectId, AgentId, ServerId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_dial_ids_are_non_negative_and_distinct() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| DialId::random()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|d| d.0 >= 0));
    }
}
