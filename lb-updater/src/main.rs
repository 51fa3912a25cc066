//! `lb-updater`: KKP's flags (single dash), a watch on Services, and an
//! update of the LoadBalancer Service whenever its ports should change.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use go_compat::flags::{Given, usage_error};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use lb_updater::{Options, desired_ports, differs};
use tokio::sync::Notify;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = lb_updater::Flags::parse_env_or_exit();
    if let Err(e) = go_compat::logging::init(&flags.log) {
        usage_error(&e);
    }
    daemon::process::init();
    let port = |flag: &Given<i64>| -> i32 {
        match flag.value {
            p @ 0..=65535 => p as i32,
            p => usage_error(&format!("-{}: {p} is not a port", flag.name())),
        }
    };
    let opts = Options {
        sni_port: port(&flags.envoy_sni_port),
        tunneling_port: port(&flags.envoy_tunneling_port),
        lb_name: flags.lb_name,
        lb_namespace: flags.lb_namespace,
        namespaced: flags.namespaced,
        expose_annotation_key: flags.expose_annotation_key,
    };
    if opts.lb_name.is_empty()
        || opts.lb_namespace.is_empty()
        || opts.expose_annotation_key.is_empty()
    {
        usage_error("-lb-name, -lb-namespace and -expose-annotation-key must not be empty");
    }
    let kubeconfig = flags
        .kubeconfig
        .existing_file()
        .unwrap_or_else(|e| usage_error(&e));
    let client = nodeport_proxy::sources::kube::client(kubeconfig.as_deref())
        .await
        .context("kubernetes client")?;
    let services: Api<Service> = if opts.namespaced {
        Api::namespaced(client.clone(), &opts.lb_namespace)
    } else {
        Api::all(client.clone())
    };
    let lb_api: Api<Service> = Api::namespaced(client, &opts.lb_namespace);
    let (store, writer) = reflector::store::<Service>();
    let changed = Arc::new(Notify::new());
    let c = changed.clone();
    tokio::spawn(async move {
        let events = watcher(services, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        tokio::pin!(events);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => c.notify_one(),
                Err(e) => tracing::warn!(error = %e, "watching services; retrying"),
            }
        }
    });
    let mut terms = daemon::signals::Terminations::install().context("signal handlers")?;
    store.wait_until_ready().await.context("services watch")?;
    tracing::info!(lb = %format!("{}/{}", opts.lb_namespace, opts.lb_name), "watching services");
    loop {
        reconcile(&store, &lb_api, &opts).await;
        tokio::select! {
            _ = changed.notified() => {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            // A failed update is retried even without a new event.
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            _ = terms.next() => {
                tracing::info!("termination signal: exiting");
                return Ok(());
            }
        }
    }
}

async fn reconcile(store: &Store<Service>, lb_api: &Api<Service>, opts: &Options) {
    let lb = match lb_api.get_opt(&opts.lb_name).await {
        Ok(Some(lb)) => lb,
        Ok(None) => {
            tracing::warn!(name = %opts.lb_name, "load balancer service not found");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "getting the load balancer service");
            return;
        }
    };
    let services: Vec<Service> = store.state().iter().map(|s| (**s).clone()).collect();
    let desired = desired_ports(&lb, &services, opts);
    let current = lb
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    if !differs(&current, &desired) {
        return;
    }
    let mut updated = lb.clone();
    if let Some(spec) = updated.spec.as_mut() {
        spec.ports = Some(desired.clone());
    }
    match lb_api
        .replace(&opts.lb_name, &PostParams::default(), &updated)
        .await
    {
        Ok(_) => tracing::info!(
            ports = ?desired.iter().filter_map(|p| p.name.clone()).collect::<Vec<_>>(),
            "updated load balancer ports"
        ),
        Err(e) => tracing::warn!(error = %e, "updating the load balancer service"),
    }
}
