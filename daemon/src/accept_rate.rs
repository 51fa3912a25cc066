//! A cap on how many new connections a listener takes on per second (a
//! token bucket): past it, the accept loop holds the newcomer it accepted and
//! the rest wait in the kernel's listen backlog, instead of each costing a
//! task, a TLS handshake and an HTTP/2 preface.
//!
//! Why: once every flooding connection is sent away after a bounded number
//! of frames (`link::h2flood`), what an authenticated flooder still costs
//! scales with how fast it reconnects (RELIABILITY.md, "Floods"). Envoy's
//! listener filter `envoy.filters.listener.local_ratelimit` caps the same
//! thing; it closes the excess connections, we leave them queued so that a
//! legitimate newcomer is only delayed, and nothing is spent on the excess.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// New connections per second and the burst taken at once.
pub struct AcceptRate {
    per_second: f64,
    burst: f64,
    state: Mutex<Bucket>,
    /// Called for each accept that has to wait, with `true` for the first of
    /// a spell (after an accept that did not wait), e.g. to count and log.
    on_wait: Option<Box<dyn Fn(bool) + Send + Sync>>,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
    dry: bool,
}

impl AcceptRate {
    /// `per_second` > 0 new connections a second, after a first `burst` (at
    /// least 1).
    pub fn new(per_second: f64, burst: f64) -> Self {
        let burst = burst.max(1.0);
        AcceptRate {
            per_second,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                refilled: Instant::now(),
                dry: false,
            }),
            on_wait: None,
        }
    }

    pub fn on_wait(mut self, f: impl Fn(bool) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(Box::new(f));
        self
    }

    /// Waits until one more connection may be accepted, and takes it.
    pub async fn take(&self) {
        let mut waited = false;
        loop {
            let wait = {
                let mut b = self.state.lock();
                let now = Instant::now();
                let earned = now.duration_since(b.refilled).as_secs_f64() * self.per_second;
                b.tokens = (b.tokens + earned).min(self.burst);
                b.refilled = now;
                if b.tokens >= 1.0 {
                    b.tokens -= 1.0;
                    // A spell ends with an accept that did not wait.
                    if !waited {
                        b.dry = false;
                    }
                    return;
                }
                if !waited && let Some(f) = &self.on_wait {
                    f(!b.dry);
                }
                b.dry = true;
                // A rate so low that the wait overflows a Duration waits
                // for ever rather than panicking.
                Duration::try_from_secs_f64((1.0 - b.tokens) / self.per_second)
                    .unwrap_or(Duration::MAX)
            };
            waited = true;
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The burst goes at once, then one connection per 1/rate; running dry
    /// is reported once per dry spell.
    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let (dry, waits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (d, w) = (dry.clone(), waits.clone());
        let rate = AcceptRate::new(10.0, 5.0).on_wait(move |spell| {
            w.fetch_add(1, Ordering::Relaxed);
            if spell {
                d.fetch_add(1, Ordering::Relaxed);
            }
        });
        let start = Instant::now();
        for _ in 0..5 {
            rate.take().await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the burst waits for nothing"
        );
        assert_eq!(dry.load(Ordering::Relaxed), 0);
        for _ in 0..10 {
            rate.take().await;
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(999) && took <= Duration::from_millis(1001),
            "10 more at 10/s took {took:?} of virtual time"
        );
        assert_eq!(dry.load(Ordering::Relaxed), 1, "one dry spell");
        assert_eq!(waits.load(Ordering::Relaxed), 10, "ten accepts waited");
        // Quiet long enough to refill the burst: it goes at once again.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let again = Instant::now();
        for _ in 0..5 {
            rate.take().await;
        }
        assert_eq!(again.elapsed(), Duration::ZERO);
        rate.take().await;
        assert_eq!(dry.load(Ordering::Relaxed), 2, "a second dry spell");
    }

    /// A rate whose wait does not fit a `Duration` (a flag such as
    /// `--agent-accept-rate=1e-300`) waits instead of panicking.
    #[tokio::test(start_paused = true)]
    async fn an_absurdly_low_rate_waits_without_panicking() {
        let rate = AcceptRate::new(1e-300, 1.0);
        rate.take().await;
        let next = tokio::time::timeout(Duration::from_secs(3600), rate.take()).await;
        assert!(next.is_err(), "the second connection still waits");
    }
}
