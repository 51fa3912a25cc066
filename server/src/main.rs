//! `proxy-server`: parse flags, bind, serve; first SIGTERM drains, second exits.

use anyhow::Context;
use go_compat::flags::{fatal, usage_error};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (values, flags) = proxy_server::options::parse_env_or_exit();
    if let Err(e) = go_compat::logging::init(&flags.log) {
        usage_error(&e);
    }
    daemon::process::init();
    let (config, addrs) = proxy_server::options::parse(&values).unwrap_or_else(|e| usage_error(&e));
    let kubernetes = proxy_server::options::kubernetes(&values).unwrap_or_else(|e| usage_error(&e));
    let listeners = proxy_server::bind(&addrs)
        .await
        .unwrap_or_else(|e| fatal(&e.to_string()));
    let mut signals =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    let server = proxy_server::Server::new(config)
        .with_kubernetes(kubernetes)
        .with_profiling(flags.enable_profiling)
        .with_otlp_traces(
            proxy_server::options::otlp_traces(&flags).unwrap_or_else(|e| usage_error(&e)),
        );
    let shutdown = async move {
        signals.next().await;
        tracing::info!("received termination signal; draining (send it again to exit at once)");
        tokio::spawn(async move {
            signals.next().await;
            std::process::exit(1);
        });
    };
    if let Err(e) = server.run(listeners, shutdown).await {
        fatal(&e.to_string());
    }
    Ok(())
}
