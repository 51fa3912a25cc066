//! `--enable-lease-controller`: this server's Lease
//! `konnectivity-proxy-server-<server id>` in `--lease-namespace`, labelled
//! with `--lease-label`, held for 30 s and renewed every 15 s; every 15 s
//! (and at start) expired Leases with those labels are deleted, with a
//! resourceVersion precondition so a Lease renewed meanwhile survives. On
//! shutdown the server deletes its own Lease. Agents with
//! `--count-server-leases` count the valid ones.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::lease::is_valid;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

pub const LEASE_DURATION: Duration = Duration::from_secs(30);
pub const RENEW_INTERVAL: Duration = Duration::from_secs(15);
pub const GC_INTERVAL: Duration = Duration::from_secs(15);
/// Deadline for one API call, so a hung apiserver cannot stall the loops.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The lease flags.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub kubeconfig: Option<std::path::PathBuf>,
    pub duration: Duration,
    pub renew_interval: Duration,
    pub gc_interval: Duration,
}

/// Parses `--lease-label`: comma-separated `key=value`.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for kv in s.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("--lease-label {s:?} is not a list of key=value"));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(format!("--lease-label {s:?} has an empty key"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    if out.is_empty() {
        return Err("--lease-label must name at least one key=value".into());
    }
    Ok(out)
}

pub fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn lease_name(server_id: &str) -> String {
    format!("konnectivity-proxy-server-{server_id}")
}

/// The running controller.
pub struct LeaseController {
    api: Api<Lease>,
    name: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseController {
    /// Starts renewing and collecting in the background.
    pub fn start(
        client: kube::Client,
        cfg: LeaseConfig,
        server_id: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
        let name = lease_name(server_id);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            api.clone(),
            name.clone(),
            server_id.to_string(),
            cfg,
            metrics,
            stop.clone(),
        ));
        LeaseController {
            api,
            name,
            stop,
            task,
        }
    }

    /// Stops the loops and deletes this server's Lease.
    pub async fn release(self) {
        self.stop.cancel();
        let _ = self.task.await;
        match tokio::time::timeout(
            CALL_TIMEOUT,
            self.api.delete(&self.name, &DeleteParams::default()),
        )
        .await
        {
            Ok(Ok(_)) => tracing::info!(lease = %self.name, "deleted own lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "could not delete own lease")
            }
            Err(_) => tracing::warn!(lease = %self.name, "deleting own lease timed out"),
        }
    }
}

async fn run(
    api: Api<Lease>,
    name: String,
    holder: String,
    cfg: LeaseConfig,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let selector = selector(&cfg.labels);
    let mut next_renew = Instant::now();
    let mut next_gc = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_renew {
            next_renew = match renew(&api, &name, &holder, &cfg).await {
                Ok(()) => now + cfg.renew_interval,
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "could not renew lease; retrying");
                    now + Duration::from_secs(1).min(cfg.renew_interval)
                }
            };
        }
        if now >= next_gc {
            collect(&api, &selector, &metrics).await;
            next_gc = now + cfg.gc_interval;
        }
        let wake = next_renew.min(next_gc);
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.cancelled() => return,
        }
    }
}

fn timed<T>(
    r: Result<Result<T, kube::Error>, tokio::time::error::Elapsed>,
) -> Result<T, kube::Error> {
    r.unwrap_or_else(|_| {
        Err(kube::Error::Service(
            format!("timed out after {CALL_TIMEOUT:?}").into(),
        ))
    })
}

/// Creates the Lease or renews it (taking it over if another holder had it,
/// as the upstream lease controller does for its own name).
async fn renew(
    api: &Api<Lease>,
    name: &str,
    holder: &str,
    cfg: &LeaseConfig,
) -> Result<(), kube::Error> {
    let now = MicroTime(Timestamp::now());
    let duration = i32::try_from(cfg.duration.as_secs()).unwrap_or(i32::MAX);
    let existing = timed(tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name)).await)?;
    match existing {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(cfg.labels.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(holder.to_string()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            timed(
                tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &lease))
                    .await,
            )?;
            tracing::info!(lease = %name, "created lease");
        }
        Some(mut lease) => {
            let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(cfg.labels.clone());
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(holder) {
                spec.holder_identity = Some(holder.to_string());
                spec.acquire_time = Some(now.clone());
            }
            spec.lease_duration_seconds = Some(duration);
            spec.renew_time = Some(now);
            timed(
                tokio::time::timeout(
                    CALL_TIMEOUT,
                    api.replace(name, &PostParams::default(), &lease),
                )
                .await,
            )?;
            tracing::debug!(lease = %name, "renewed lease");
        }
    }
    Ok(())
}

/// The HTTP status and reason of an API error, as client-go's `APIStatus`
/// gives them; `None` for an error that is not an API status (no response,
/// a timeout), which upstream logs but does not count.
fn api_status(e: &kube::Error) -> Option<(u16, String)> {
    match e {
        kube::Error::Api(s) => Some((s.code, s.reason.clone())),
        _ => None,
    }
}

/// Deletes the expired Leases carrying our labels, counting and timing each
/// call as upstream's garbage collection does.
async fn collect(api: &Api<Lease>, selector: &str, metrics: &Metrics) {
    let started = std::time::Instant::now();
    let list = timed(
        tokio::time::timeout(
            CALL_TIMEOUT,
            api.list(&ListParams::default().labels(selector)),
        )
        .await,
    );
    let leases = match list {
        Ok(l) => {
            metrics.lease_list(200, "", started.elapsed());
            l.items
        }
        Err(e) => {
            if let Some((code, reason)) = api_status(&e) {
                metrics.lease_list(code, &reason, started.elapsed());
            }
            tracing::warn!(error = %e, "could not list leases to garbage collect");
            return;
        }
    };
    let now = Timestamp::now();
    for lease in leases.iter().filter(|l| !is_valid(l, now)) {
        let Some(name) = lease.metadata.name.as_deref() else {
            continue;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: None,
            }),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        match timed(tokio::time::timeout(CALL_TIMEOUT, api.delete(name, &params)).await) {
            Ok(_) => {
                metrics.culled_leases.increment(1);
                metrics.lease_delete(200, "", started.elapsed());
                tracing::info!(lease = %name, "deleted expired lease");
            }
            Err(e) => {
                let status = api_status(&e);
                if let Some((code, reason)) = &status {
                    metrics.lease_delete(*code, reason, started.elapsed());
                }
                if status.is_some_and(|(code, _)| code == 404) {
                    tracing::debug!(lease = %name, "lease already deleted");
                } else {
                    tracing::warn!(lease = %name, error = %e, "could not delete expired lease");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels_parse_like_upstream() {
        let l = parse_labels("k8s-app=konnectivity-server").unwrap();
        assert_eq!(selector(&l), "k8s-app=konnectivity-server");
        let l = parse_labels("b=2, a=1").unwrap();
        assert_eq!(selector(&l), "a=1,b=2");
        assert!(parse_labels("novalue").is_err());
        assert!(parse_labels("=x").is_err());
        assert!(parse_labels("").is_err());
    }

    #[test]
    fn lease_names() {
        assert_eq!(lease_name("abc"), "konnectivity-proxy-server-abc");
    }
}
