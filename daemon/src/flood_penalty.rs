//! A slower lane for the clients that flooded: once a connection from a
//! client has been sent away for a flood (an HTTP/2 control-frame flood
//! ending in GOAWAY `ENHANCE_YOUR_CALM`), that client's new connections
//! start at most [`Penalty::rate`] a second for [`Penalty::period`] after its
//! last flood. The excess waits before anything of it is read; past
//! [`MAX_FLOOD_PENALTY_WAIT`] of queue it is closed at once.
//!
//! Why: sending a flooder away bounds what one of its connections costs,
//! not how often it comes back. A client that reconnects at once spends the
//! whole burst every time, and on a listener that must take many new
//! connections (an HTTP/1.1 CONNECT client opens one per tunnel) a
//! listener-wide accept rate would slow every client with it. Charging only
//! the address that flooded leaves other clients and connections already
//! open alone. Envoy has no such thing (its `local_ratelimit` listener
//! filter counts every client together).
//!
//! A client ([`Source`]) is an IPv4 address, an IPv6 /64 (what one IPv6
//! host usually holds), or on a Unix socket the peer process. At most
//! [`MAX_FLAGGED_SOURCES`] are remembered; when full, the one whose penalty
//! ends first makes room.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::limits::{MAX_FLAGGED_SOURCES, MAX_FLOOD_PENALTY_WAIT};

/// Longer periods are taken as this (a century).
const LONGEST_PERIOD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The penalty's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalty {
    /// How long an address stays slowed after its last flood.
    pub period: Duration,
    /// New connections a second a slowed address may start (after a first
    /// one at once).
    pub rate: f64,
}

/// Why a connection from a slowed client was not taken on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "client: this client flooded a connection recently and already has more new connections waiting than the flood penalty queues"
)]
pub struct Refused;

/// Who a penalty is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A client address: IPv4, or the /64 of an IPv6 one (IPv4-mapped
    /// addresses are IPv4). Made with `From<IpAddr>`.
    Address(IpAddr),
    /// A Unix socket's peer process, by its pid: every local client shares
    /// the socket's path, and the process is what floods.
    Process(u32),
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        Source::Address(key(ip))
    }
}

/// The clients a listener is slowing.
pub struct FloodPenalty {
    penalty: Penalty,
    max_wait: Duration,
    flagged: Mutex<HashMap<Source, Flagged>>,
}

#[derive(Debug, Clone, Copy)]
struct Flagged {
    until: Instant,
    /// When the next connection from this address may start.
    next: Instant,
}

/// Before one more entry goes into `map`, which holds at most `max`: the
/// entries whose time (`until`) has passed are dropped, and if it is still
/// full, the one whose time ends first. Shared with `crate::slow_lane`.
pub(crate) fn make_room<K: Copy + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    max: usize,
    now: Instant,
    until: impl Fn(&V) -> Instant,
) {
    if map.len() >= max {
        map.retain(|_, v| until(v) > now);
    }
    if map.len() >= max
        && let Some(first) = map.iter().min_by_key(|(_, v)| until(v)).map(|(k, _)| *k)
    {
        map.remove(&first);
    }
}

/// What one address's penalty is keyed by: an IPv4 address, or the /64 of
/// an IPv6 one (IPv4-mapped addresses are IPv4).
pub(crate) fn key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

impl FloodPenalty {
    pub fn new(penalty: Penalty) -> Self {
        Self::with_max_wait(penalty, MAX_FLOOD_PENALTY_WAIT)
    }

    fn with_max_wait(penalty: Penalty, max_wait: Duration) -> Self {
        // A period from a flag such as `=2562047h` must not overflow an
        // Instant when added to now.
        let penalty = Penalty {
            period: penalty.period.min(LONGEST_PERIOD),
            ..penalty
        };
        FloodPenalty {
            penalty,
            max_wait,
            flagged: Mutex::new(HashMap::new()),
        }
    }

    /// A connection from `source` was sent away for a flood: slow that
    /// client (again) from now.
    pub fn flag(&self, source: impl Into<Source>) {
        let source = source.into();
        let now = Instant::now();
        let until = now + self.penalty.period;
        let mut map = self.flagged.lock();
        if let Some(f) = map.get_mut(&source) {
            f.until = until;
            return;
        }
        make_room(&mut map, MAX_FLAGGED_SOURCES, now, |f| f.until);
        map.insert(source, Flagged { until, next: now });
    }

    /// How many clients are being slowed now.
    #[cfg(test)]
    fn flagged(&self) -> usize {
        let now = Instant::now();
        self.flagged
            .lock()
            .values()
            .filter(|f| f.until > now)
            .count()
    }

    /// Takes a new connection from `source`: at once unless that client is
    /// slowed, else when its rate allows it; refused when that is more than
    /// the longest wait away. The wait happens in the connection's own task;
    /// `on_wait` is told how long it will be first.
    pub async fn admit(
        &self,
        source: impl Into<Source>,
        on_wait: impl FnOnce(Duration),
    ) -> Result<(), Refused> {
        match self.reserve(source.into())? {
            None => Ok(()),
            Some(at) => {
                on_wait(at.saturating_duration_since(Instant::now()));
                tokio::time::sleep_until(at).await;
                Ok(())
            }
        }
    }

    /// When a connection from `source` may start (`None`: now).
    fn reserve(&self, source: impl Into<Source>) -> Result<Option<Instant>, Refused> {
        let k = source.into();
        let now = Instant::now();
        let mut map = self.flagged.lock();
        let Some(f) = map.get_mut(&k) else {
            return Ok(None);
        };
        if f.until <= now {
            map.remove(&k);
            if map.is_empty() {
                // What a burst of flooders took is given back.
                map.shrink_to_fit();
            }
            return Ok(None);
        }
        let at = f.next.max(now);
        if at.saturating_duration_since(now) > self.max_wait {
            return Err(Refused);
        }
        // A rate too low for a Duration queues nobody after this one.
        let gap = Duration::try_from_secs_f64(1.0 / self.penalty.rate).unwrap_or(Duration::MAX);
        f.next = at.checked_add(gap).unwrap_or(f.until.max(at));
        Ok((at > now).then_some(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn penalty() -> FloodPenalty {
        FloodPenalty::with_max_wait(
            Penalty {
                period: Duration::from_secs(30),
                rate: 10.0,
            },
            Duration::from_secs(1),
        )
    }

    /// Unflagged addresses wait for nothing; a flagged one's connections
    /// start one at once, then one per 1/rate, up to the longest wait, past
    /// which they are refused; other addresses are not slowed.
    #[tokio::test(start_paused = true)]
    async fn a_flooder_is_slowed_and_nobody_else() {
        let p = penalty();
        let start = Instant::now();
        for _ in 0..100 {
            p.admit(ip("127.0.0.1"), |_| panic!("not flagged"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(start.elapsed(), Duration::ZERO);

        p.flag(ip("127.0.0.1"));
        assert_eq!(p.flagged(), 1);
        // 1 at once and 10 more within the 1 s wait, 1/rate apart; the 12th
        // would start 1.1 s from now and is refused.
        let now = Instant::now();
        assert_eq!(p.reserve(ip("127.0.0.1")), Ok(None));
        for i in 1..=10u64 {
            assert_eq!(
                p.reserve(ip("127.0.0.1")),
                Ok(Some(now + Duration::from_millis(100 * i)))
            );
        }
        assert_eq!(p.admit(ip("127.0.0.1"), |_| {}).await, Err(Refused));
        // An IPv4-mapped client is its IPv4 address.
        assert_eq!(p.reserve(ip("::ffff:127.0.0.1")), Err(Refused));
        // Another address, and another IPv6 /64, are not slowed.
        p.admit(ip("127.0.0.2"), |_| panic!("not flagged"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        p.flag(ip("2001:db8:0:1::5"));
        p.admit(ip("2001:db8:0:2::5"), |_| panic!("another /64"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        p.admit(ip("2001:db8:0:1::5"), |_| panic!("first one at once"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut waited = None;
        p.admit(ip("2001:db8:0:1::9"), |w| waited = Some(w))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            waited,
            Some(Duration::from_millis(100)),
            "same /64, 1/rate later"
        );

        // The queue moves at the rate: 0.6 s on, the 12th fits (0.5 s away).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut waited = None;
        p.admit(ip("127.0.0.1"), |w| waited = Some(w))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(waited, Some(Duration::from_millis(500)));

        // A fresh flood restarts the period; once it has passed, nobody
        // waits and the addresses are forgotten.
        p.flag(ip("127.0.0.1"));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(p.flagged(), 0);
        for _ in 0..100 {
            p.admit(ip("127.0.0.1"), |_| panic!("penalty over"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        p.admit(ip("2001:db8:0:1::5"), |_| panic!("penalty over"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(p.flagged.lock().is_empty());
    }

    /// A Unix socket's peer processes are slowed one by one: another
    /// process, and an address, are not charged for one that flooded.
    #[tokio::test(start_paused = true)]
    async fn a_flooding_process_is_slowed_and_no_other() {
        let p = penalty();
        p.flag(Source::Process(4242));
        assert_eq!(p.reserve(Source::Process(4242)), Ok(None));
        assert!(matches!(p.reserve(Source::Process(4242)), Ok(Some(_))));
        assert_eq!(p.reserve(Source::Process(4243)), Ok(None));
        assert_eq!(p.reserve(Source::Process(4243)), Ok(None));
        assert_eq!(p.reserve(ip("127.0.0.1")), Ok(None));
        assert_eq!(p.reserve(ip("127.0.0.1")), Ok(None));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(p.reserve(Source::Process(4242)), Ok(None));
        assert_eq!(p.reserve(Source::Process(4242)), Ok(None));
    }

    /// However many addresses flood, at most MAX_FLAGGED_SOURCES are kept,
    /// the newest among them.
    #[tokio::test(start_paused = true)]
    async fn the_flagged_addresses_are_bounded() {
        let p = penalty();
        for i in 0..(MAX_FLAGGED_SOURCES as u32 + 100) {
            p.flag(IpAddr::V4((0x0a00_0000 + i).into()));
            tokio::time::advance(Duration::from_micros(1)).await;
        }
        assert_eq!(p.flagged.lock().len(), MAX_FLAGGED_SOURCES);
        let newest = IpAddr::V4((0x0a00_0000 + MAX_FLAGGED_SOURCES as u32 + 99).into());
        assert_eq!(p.reserve(newest), Ok(None), "the newest is kept");
        assert!(matches!(p.reserve(newest), Ok(Some(_))), "and slowed");
        assert_eq!(
            p.reserve(IpAddr::V4(0x0a00_0000.into())),
            Ok(None),
            "the oldest made room"
        );
    }

    /// A period too long to add to an Instant is taken as a century
    /// instead of panicking.
    #[tokio::test(start_paused = true)]
    async fn an_absurdly_long_period_does_not_panic() {
        let p = FloodPenalty::new(Penalty {
            period: Duration::MAX,
            rate: 10.0,
        });
        p.flag(ip("127.0.0.1"));
        assert_eq!(p.flagged(), 1);
        assert_eq!(p.reserve(ip("127.0.0.1")), Ok(None));
    }

    /// A rate so low that 1/rate overflows a Duration lets one through and
    /// queues nobody, instead of panicking.
    #[tokio::test(start_paused = true)]
    async fn an_absurdly_low_rate_does_not_panic() {
        let p = FloodPenalty::new(Penalty {
            period: Duration::from_secs(30),
            rate: 1e-300,
        });
        p.flag(ip("127.0.0.1"));
        assert_eq!(p.reserve(ip("127.0.0.1")), Ok(None));
        assert_eq!(p.reserve(ip("127.0.0.1")), Err(Refused));
    }
}
