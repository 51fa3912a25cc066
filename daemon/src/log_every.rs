//! Warnings about something a flood can make happen thousands of times a
//! second (streams refused under memory pressure): one line per interval,
//! carrying how many happened since the previous line, so the log neither
//! floods nor hides the scale.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct LogEvery {
    interval: Duration,
    epoch: OnceLock<Instant>,
    /// Milliseconds after `epoch` before which no line is due.
    next: AtomicU64,
    count: AtomicU64,
}

impl LogEvery {
    /// At most one line per `interval`; usable in a `static`.
    pub const fn new(interval: Duration) -> LogEvery {
        LogEvery {
            interval,
            epoch: OnceLock::new(),
            next: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence; when a line is due, how many occurred since
    /// the previous one (this one included).
    pub fn due(&self) -> Option<u64> {
        self.count.fetch_add(1, Ordering::AcqRel);
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next.load(Ordering::Acquire);
        if now < next {
            return None;
        }
        let every = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        self.next
            .compare_exchange(
                next,
                now.saturating_add(every),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        Some(self.count.swap(0, Ordering::AcqRel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_since_the_last() {
        let every = LogEvery::new(Duration::from_secs(3600));
        assert_eq!(every.due(), Some(1));
        for _ in 0..999 {
            assert_eq!(every.due(), None);
        }
        // Due again once the interval passed, with everything since.
        every.next.store(0, Ordering::Release);
        assert_eq!(every.due(), Some(1000));
        assert_eq!(every.due(), None);
    }
}
