//! Memory budgets for receive windows: how many bytes the peers of one
//! connection (and of the whole process) may have sent us that we have not
//! passed on yet.
//!
//! A window is a promise: the peer may send that much before it hears from
//! us again, and if our reader stops, that is what we hold. So windows grow
//! only by reserving from a budget, and give their reservation back when they
//! shrink or end. A budget may have a parent (connection → process): a
//! reservation must fit in both.
//!
//! `force` exists for the small floor every tunnel needs to make progress at
//! all; it may take a budget past its limit, and then nothing else grows
//! until enough is released.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

#[derive(Debug)]
pub struct Budget {
    limit: i64,
    used: AtomicI64,
    parent: Option<Arc<Budget>>,
}

impl Budget {
    /// A budget of `limit` bytes (at least 0), inside `parent` if given.
    pub fn new(limit: i64, parent: Option<Arc<Budget>>) -> Arc<Budget> {
        Arc::new(Budget {
            limit: limit.max(0),
            used: AtomicI64::new(0),
            parent,
        })
    }

    /// A budget with no limit of its own (its parent's, if any, still applies).
    pub fn unlimited(parent: Option<Arc<Budget>>) -> Arc<Budget> {
        Budget::new(i64::MAX, parent)
    }

    pub fn limit(&self) -> i64 {
        self.limit
    }

    pub fn used(&self) -> i64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves up to `want` bytes; returns what it got (0 when full).
    pub fn try_reserve(&self, want: i64) -> i64 {
        if want <= 0 {
            return 0;
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        let got = loop {
            let room = self.limit.saturating_sub(cur).max(0);
            let take = want.min(room);
            if take == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                cur,
                cur + take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break take,
                Err(now) => cur = now,
            }
        };
        let Some(parent) = &self.parent else {
            return got;
        };
        let kept = parent.try_reserve(got);
        if kept < got {
            self.used.fetch_sub(got - kept, Ordering::AcqRel);
        }
        kept
    }

    /// Reserves `n` bytes whether or not they fit (a tunnel's floor).
    pub fn force(&self, n: i64) {
        if n <= 0 {
            return;
        }
        self.used.fetch_add(n, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.force(n);
        }
    }

    /// Gives back `n` bytes reserved earlier.
    pub fn release(&self, n: i64) {
        if n <= 0 {
            return;
        }
        self.used.fetch_sub(n, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.release(n);
        }
    }

    /// Whether half or more is reserved, here or above.
    pub fn is_half_used(&self) -> bool {
        self.used() >= self.limit / 2 || self.parent.as_ref().is_some_and(|p| p.is_half_used())
    }

    /// Whether nothing more can be reserved here or above.
    pub fn is_full(&self) -> bool {
        self.used() >= self.limit || self.parent.as_ref().is_some_and(|p| p.is_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_fits_in_the_budget_and_its_parent() {
        let process = Budget::new(100, None);
        let a = Budget::new(80, Some(process.clone()));
        let b = Budget::new(80, Some(process.clone()));
        assert_eq!(a.try_reserve(60), 60);
        // b has room for 80 of its own, the process only for 40 more.
        assert_eq!(b.try_reserve(60), 40);
        assert_eq!(process.used(), 100);
        assert!(b.is_full());
        assert_eq!(a.try_reserve(1), 0);
        a.release(60);
        assert_eq!(process.used(), 40);
        assert_eq!(
            a.try_reserve(100),
            60,
            "a has room for 80, the process for 60"
        );
        a.force(30);
        assert_eq!(a.used(), 90);
        assert_eq!(process.used(), 130);
        assert_eq!(b.try_reserve(1), 0);
    }
}
