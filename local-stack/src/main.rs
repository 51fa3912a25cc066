//! `local-stack`: the whole data path on loopback; Ctrl-C stops it.

use anyhow::Context;
use go_compat::flags::{FlagSet, Klog};

go_compat::typed_flags! {
    /// Only the logging flags.
    struct Flags = (FlagSet::new("local-stack", "Runs proxy-server, proxy-agent, nodeport-proxy, tunnel-agent and demo destinations on loopback.")) {
        #[embed(with_klog(0))]
        log: Klog,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse_env_or_exit();
    go_compat::logging::init(&flags.log).map_err(anyhow::Error::msg)?;
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
