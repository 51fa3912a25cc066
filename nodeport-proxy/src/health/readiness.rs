//! What `/ready` says: whether this proxy serves what its routing source
//! says. Not ready until the first table from the source is applied (a
//! Kubernetes watch that never lists, for wrong RBAC or an apiserver out of
//! reach, keeps it so for ever), and not ready again once the source has been
//! out of sync for longer than `-ready-out-of-sync-limit` (a table file that
//! no longer loads, a watch whose requests fail). Within the limit the last
//! table keeps serving and the body says why it may be stale. `/healthz`
//! stays liveness (health/mod.rs).
//!
//! A Kubernetes watch is in sync when its latest request was answered
//! (2xx) or its latest event arrived after its latest error: kube-rs's
//! watcher resumes a broken watch without an event when nothing changed, so
//! the HTTP answers are watched too (sources/kube.rs's client layer).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::Gauge;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::routing::store::TableStatus;

/// `-ready-out-of-sync-limit`'s default: a seed apiserver restart or a
/// watch's back-off (at most 30 s between attempts) stays well inside it,
/// while a replica cut off from its source for good leaves the load balancer
/// within minutes.
pub const DEFAULT_OUT_OF_SYNC_LIMIT: Duration = Duration::from_secs(300);

/// Parts of a source that can fall out of sync on their own (a Kubernetes
/// source's two watches), each with when it did and why.
#[derive(Default)]
pub struct SourceSync {
    failing: Mutex<BTreeMap<&'static str, (Instant, String)>>,
}

impl SourceSync {
    pub fn new() -> Arc<Self> {
        Arc::new(SourceSync::default())
    }

    /// `part` failed; it counts as out of sync from its first failure on.
    pub fn failing(&self, part: &'static str, why: String) {
        let mut f = self.failing.lock();
        match f.get_mut(part) {
            Some((_, w)) => *w = why,
            None => {
                tracing::warn!(part, error = %why, "routing source out of sync");
                f.insert(part, (Instant::now(), why));
            }
        }
    }

    /// `part` answered or delivered: in sync again.
    pub fn in_sync(&self, part: &'static str) {
        if let Some((since, _)) = self.failing.lock().remove(part) {
            tracing::info!(
                part,
                after = ?since.elapsed(),
                "routing source in sync again"
            );
        }
    }

    /// The parts out of sync: since when, and why.
    fn failing_parts(&self) -> Vec<(Instant, String)> {
        self.failing
            .lock()
            .iter()
            .map(|(part, (since, why))| (*since, format!("{part}: {why}")))
            .collect()
    }
}

pub struct Readiness {
    table: watch::Receiver<TableStatus>,
    parts: Arc<SourceSync>,
    /// Zero: once the first table is applied, staleness never fails `/ready`.
    limit: Duration,
    /// The source, as the body names it.
    source: &'static str,
}

/// One look at the source.
struct Look {
    applied: bool,
    /// When the source fell out of sync (its oldest failing part), and why.
    out_of_sync: Option<(Instant, Vec<String>)>,
}

impl Readiness {
    pub fn new(
        table: watch::Receiver<TableStatus>,
        parts: Arc<SourceSync>,
        limit: Duration,
        source: &'static str,
    ) -> Self {
        Readiness {
            table,
            parts,
            limit,
            source,
        }
    }

    fn look(&self) -> Look {
        let status = self.table.borrow().clone();
        let mut failing = self.parts.failing_parts();
        if let (Some(since), Some(e)) = (status.failing_since, &status.last_error) {
            failing.push((since, format!("last load failed: {e}")));
        }
        let since = failing.iter().map(|(t, _)| *t).min();
        Look {
            applied: status.last_success.is_some(),
            out_of_sync: since.map(|s| (s, failing.into_iter().map(|(_, w)| w).collect())),
        }
    }

    /// Whether the source's first table is applied and the source is in
    /// sync now (`nodeport_proxy_source_synced`).
    pub fn synced(&self) -> bool {
        let look = self.look();
        look.applied && look.out_of_sync.is_none()
    }

    /// The status and body `/ready` answers with, `draining` once shutdown
    /// began.
    pub fn report(&self, draining: bool) -> (bool, String) {
        self.report_at(Instant::now(), draining)
    }

    fn report_at(&self, now: Instant, draining: bool) -> (bool, String) {
        if draining {
            return (false, "draining\n".into());
        }
        let look = self.look();
        let reasons = |out: &mut String| {
            for why in look.out_of_sync.iter().flat_map(|(_, w)| w) {
                out.push_str(&format!("  {why}\n"));
            }
        };
        if !look.applied {
            let mut body = format!("not ready: no routing table from {} yet\n", self.source);
            reasons(&mut body);
            return (false, body);
        }
        let Some((since, _)) = &look.out_of_sync else {
            return (true, "ok\n".into());
        };
        let out_for = now.saturating_duration_since(*since);
        let secs = out_for.as_secs();
        if !self.limit.is_zero() && out_for > self.limit {
            let mut body = format!(
                "not ready: {} out of sync for {secs}s (-ready-out-of-sync-limit {:?}); serving the last table\n",
                self.source, self.limit
            );
            reasons(&mut body);
            return (false, body);
        }
        let mut body = format!(
            "ok\n{} out of sync for {secs}s; serving the last table\n",
            self.source
        );
        reasons(&mut body);
        (true, body)
    }
}

/// Keeps `gauge` at 1 while `readiness` is synced, read at each scrape.
pub fn gauge_probe(readiness: Arc<Readiness>, gauge: Gauge) -> impl Fn() + Send + Sync {
    move || gauge.set(if readiness.synced() { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(applied: bool, failing_since: Option<Instant>) -> TableStatus {
        TableStatus {
            version: u64::from(applied),
            loads: 1,
            last_error: failing_since.map(|_| "parsing t.yaml: bad".to_string()),
            last_success: applied.then(std::time::SystemTime::now),
            failing_since,
        }
    }

    fn readiness(s: TableStatus, parts: Arc<SourceSync>, limit: Duration) -> Readiness {
        let (_tx, rx) = watch::channel(s);
        Readiness::new(rx, parts, limit, "the test source")
    }

    const LIMIT: Duration = Duration::from_secs(60);

    #[test]
    fn unready_until_the_first_table_and_past_the_limit_out_of_sync() {
        let none = SourceSync::new();
        let t0 = Instant::now();
        let r = readiness(status(false, None), none.clone(), LIMIT);
        let (ok, body) = r.report(false);
        assert!(
            !ok && body.contains("no routing table from the test source"),
            "{body}"
        );
        assert!(!r.synced());

        let r = readiness(status(true, None), none.clone(), LIMIT);
        assert_eq!(r.report(false), (true, "ok\n".to_string()));
        assert!(r.synced());
        assert_eq!(r.report(true), (false, "draining\n".to_string()));

        // Out of sync within the limit: ready, saying so; past it: not.
        let r = readiness(status(true, Some(t0)), none.clone(), LIMIT);
        assert!(!r.synced());
        let (ok, body) = r.report_at(t0 + Duration::from_secs(10), false);
        assert!(
            ok && body.contains("out of sync for 10s") && body.contains("bad"),
            "{body}"
        );
        let (ok, body) = r.report_at(t0 + LIMIT + Duration::from_secs(1), false);
        assert!(!ok && body.contains("-ready-out-of-sync-limit"), "{body}");
        // Limit 0: staleness never fails /ready.
        let r = readiness(status(true, Some(t0)), none, Duration::ZERO);
        assert!(r.report_at(t0 + Duration::from_secs(86400), false).0);
    }

    #[test]
    fn a_failing_part_counts_from_its_first_failure_until_it_answers() {
        let parts = SourceSync::new();
        let r = readiness(status(true, None), parts.clone(), LIMIT);
        let before = Instant::now();
        parts.failing("services watch", "connection refused".into());
        let late = Instant::now() + LIMIT + Duration::from_secs(1);
        // A later failure of the same part does not restart the clock.
        parts.failing("services watch", "timed out".into());
        let (ok, body) = r.report_at(late, false);
        assert!(!ok && body.contains("services watch: timed out"), "{body}");
        assert!(r.report_at(before + LIMIT, false).0, "within the limit");
        parts.in_sync("endpointslices watch");
        assert!(!r.report_at(late, false).0);
        parts.in_sync("services watch");
        assert_eq!(r.report_at(late, false), (true, "ok\n".to_string()));
    }
}
