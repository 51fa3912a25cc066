//! `local-stack`: the whole data path on loopback; Ctrl-C stops it.

use anyhow::Context;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let values = go_compat::flags::FlagSet::new("local-stack", "Runs proxy-server, proxy-agent, nodeport-proxy, tunnel-agent and demo destinations on loopback.")
        .with_klog(0)
        .parse_env_or_exit();
    go_compat::logging::init(&values).map_err(anyhow::Error::msg)?;
    let mut signals =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    let running = local_stack::start(local_stack::Ports::default()).await?;
    println!("{}", running.instructions());
    signals.next().await;
    println!("stopping...");
    running.stop().await;
    println!("stopped.");
    Ok(())
}
