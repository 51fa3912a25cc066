//! `proxy-agent`: parse flags, bind, run; first SIGTERM drains, second exits.

use anyhow::Context;
use daemon::flags::usage_error;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let values = proxy_agent::options::flags().parse_env_or_exit();
    if let Err(e) = daemon::logging::init(&values) {
        usage_error(&e);
    }
    daemon::process::init();
    let (config, addrs) = proxy_agent::options::parse(&values).unwrap_or_else(|e| usage_error(&e));
    let lease_counting =
        proxy_agent::options::lease_counting(&values).unwrap_or_else(|e| usage_error(&e));
    let listeners = proxy_agent::bind(&addrs)
        .await
        .context("binding health and admin ports")?;
    let mut signals =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = async move {
        signals.next().await;
        tokio::spawn(async move {
            signals.next().await;
            let _ = stop_tx.send(());
        });
    };
    let stop = async move {
        let _ = stop_rx.await;
    };
    proxy_agent::Agent::new(config)
        .with_lease_counting(lease_counting)
        .run(listeners, drain, stop)
        .await;
    Ok(())
}
