//! `--count-server-leases`: the number of proxy servers to hold streams to
//! is the number of valid Leases labelled `--lease-label` in
//! `--lease-namespace` (each server publishes one, see the server's
//! `--enable-lease-controller`), watched through the apiserver. With
//! `--server-count-source=max` the larger of that and the servers' own
//! `servercount` header wins. The count is never below 1, and a failing
//! apiserver leaves the last good count in place.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use daemon::lease::is_valid;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::servers::lease_calls::ObserveLeaseCalls;

/// How often lease validity is re-evaluated: leases expire without events.
const RECOUNT_INTERVAL: Duration = Duration::from_secs(1);

/// The lease-counting flags.
#[derive(Debug, Clone)]
pub struct LeaseCounting {
    pub namespace: String,
    /// A label selector (`k=v,k2=v2`).
    pub selector: String,
    /// Empty: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--server-count-source=max`: the larger of the lease count and the
    /// servers' `servercount`.
    pub max_with_header: bool,
}

/// The current lease count, shared with the sync loop.
#[derive(Debug)]
pub struct LeaseCount {
    count: AtomicUsize,
    changed: watch::Sender<usize>,
    pub max_with_header: bool,
}

impl LeaseCount {
    pub fn new(max_with_header: bool) -> Arc<Self> {
        let (changed, _) = watch::channel(1);
        Arc::new(LeaseCount {
            count: AtomicUsize::new(1),
            changed,
            max_with_header,
        })
    }

    /// Valid leases, at least 1.
    pub fn get(&self) -> usize {
        self.count.load(Ordering::Relaxed).max(1)
    }

    fn set(&self, n: usize) {
        let n = n.max(1);
        if self.count.swap(n, Ordering::Relaxed) != n {
            tracing::info!(servers = n, "server count from leases changed");
            self.changed.send_replace(n);
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.changed.subscribe()
    }
}

async fn client(
    kubeconfig: Option<&std::path::Path>,
    metrics: &Arc<Metrics>,
) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => kube::Config::incluster().map_err(|e| e.to_string())?,
    };
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| e.to_string())?;
    Ok(builder
        .with_layer(&ObserveLeaseCalls {
            metrics: metrics.clone(),
        })
        .build())
}

/// Keeps `count` in step with the Leases until `stop`.
pub async fn run(
    cfg: LeaseCounting,
    count: Arc<LeaseCount>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_secs(1);
    let client = loop {
        match client(cfg.kubeconfig.as_deref(), &metrics).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?backoff, "lease counting: no kubernetes client");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    };
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // As client-go's informers (upstream's agent): the initial list is a
    // streaming watch where the apiserver serves one; on any error before it
    // completes, list and watch instead, for good.
    let mut streaming = true;
    while follow(&api, &cfg.selector, streaming, &count, &stop).await == Followed::NoStreamingList {
        tracing::info!(
            "the apiserver does not serve streaming lists of leases; listing and watching instead"
        );
        streaming = false;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Followed {
    Stopped,
    NoStreamingList,
}

async fn follow(
    api: &Api<Lease>,
    selector: &str,
    streaming: bool,
    count: &LeaseCount,
    stop: &CancellationToken,
) -> Followed {
    let config = watcher::Config::default().labels(selector);
    let config = if streaming {
        config.streaming_lists()
    } else {
        config
    };
    let (store, writer) = reflector::store();
    let events = watcher(api.clone(), config)
        .default_backoff()
        .reflect(writer);
    tokio::pin!(events);
    let mut synced = false;
    let mut tick = tokio::time::interval(RECOUNT_INTERVAL);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::InitDone)) => synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) if streaming && !synced => {
                    tracing::debug!(error = %e, "streaming list of leases failed");
                    return Followed::NoStreamingList;
                }
                Some(Err(e)) => tracing::warn!(error = %e, "watching server leases; keeping the last count"),
                None => return Followed::Stopped,
            },
            _ = tick.tick() => {}
            _ = stop.cancelled() => return Followed::Stopped,
        }
        // Before the first list completes, an empty store is not news.
        if synced {
            let now = Timestamp::now();
            count.set(store.state().iter().filter(|l| is_valid(l, now)).count());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn count_is_at_least_one_and_notifies_changes() {
        let c = LeaseCount::new(false);
        let mut rx = c.subscribe();
        assert_eq!(c.get(), 1);
        c.set(0);
        assert_eq!(c.get(), 1);
        assert!(!rx.has_changed().unwrap());
        c.set(3);
        assert_eq!(c.get(), 3);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 3);
    }
}
