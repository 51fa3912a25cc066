//! `proxy-agent`: parse flags, bind, run. The first SIGTERM drains: the agent
//! sends DRAIN and keeps serving (servers still route dials to it when no
//! other agent can take them) until a second signal or
//! `--graceful-shutdown-timeout`, whichever comes first; it exits sooner only
//! when it holds no stream to any server and no connection.

use anyhow::Context;
use go_compat::flags::{fatal, usage_error};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (values, flags) = proxy_agent::options::parse_env_or_exit();
    if let Err(e) = go_compat::logging::init(&flags.log) {
        usage_error(&e);
    }
    daemon::process::init();
    let (config, addrs) = proxy_agent::options::parse(&values).unwrap_or_else(|e| usage_error(&e));
    let lease_counting =
        proxy_agent::options::lease_counting(&values).unwrap_or_else(|e| usage_error(&e));
    let grace = flags.graceful_shutdown_timeout;
    let listeners = proxy_agent::bind(&addrs)
        .await
        .unwrap_or_else(|e| fatal(&e.to_string()));
    let mut signals =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    // How many termination signals have arrived.
    let (count_tx, count) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            signals.next().await;
            count_tx.send_modify(|n| *n += 1);
        }
    });
    let agent = proxy_agent::Agent::new(config)
        .with_lease_counting(lease_counting)
        .with_profiling(flags.enable_profiling);
    let handle = agent.handle();
    let mut first = count.clone();
    // `stop` starts only once `drain` has run, so the first signal always
    // sends DRAIN before the agent may exit, however the two are polled.
    let (drained_tx, drained) = tokio::sync::oneshot::channel::<()>();
    let drain = async move {
        let _ = first.wait_for(|n| *n >= 1).await;
        let _ = drained_tx.send(());
    };
    let mut signalled = count;
    let stop = async move {
        let _ = drained.await;
        tokio::select! {
            _ = handle.unreachable() => {
                tracing::info!("no server stream and no connection left: exiting");
            }
            _ = signalled.wait_for(|n| *n >= 2) => {
                tracing::info!("second termination signal: exiting now");
            }
            _ = tokio::time::sleep(grace) => match handle.open_connections() {
                0 => tracing::info!(
                    "--graceful-shutdown-timeout ({}) is over: exiting",
                    go_compat::duration::format(grace)
                ),
                n => tracing::warn!(
                    connections = n,
                    "--graceful-shutdown-timeout ({}) is over: closing the connections left",
                    go_compat::duration::format(grace)
                ),
            },
        }
    };
    agent.run(listeners, drain, stop).await;
    Ok(())
}
