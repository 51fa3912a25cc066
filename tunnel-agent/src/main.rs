//! The tunnel-agent binary. Its runtime is fixed-size (one worker and two
//! blocking threads by default) so a 128-thread node costs what a 2-core one
//! does (KKP #13095: Envoy started a worker per hardware thread and OOMed).

use std::sync::Arc;

use anyhow::Context;
use go_compat::flags::usage_error;
use tokio_util::sync::CancellationToken;
use tunnel_agent::{AgentListeners, TunnelAgent, cli};

fn main() {
    let values = cli::flag_set().parse_env_or_exit();
    if let Err(e) = go_compat::logging::init(&cli::Flags::from_values(&values).log) {
        usage_error(&e);
    }
    daemon::process::init();
    if cli::Flags::from_values(&values).mode == "validate" {
        // Envoy's --mode validate: the verdict, exit 0 or 1; nothing bound.
        match cli::from_values(&values) {
            Ok(cli) => {
                let file = cli.config_path.as_ref().map(|p| p.display().to_string());
                if let (Some(file), Some(notes)) = (&file, &cli.notes) {
                    tunnel_agent::agent::report_notes(file, notes);
                }
                println!("configuration '{}' OK", file.unwrap_or_default());
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("Error: {e}");
                std::process::exit(1);
            }
        }
    }
    let cli = cli::from_values(&values).unwrap_or_else(|e| usage_error(&e));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.worker_threads)
        .max_blocking_threads(2)
        .thread_name("tunnel-agent")
        .enable_all()
        .build();
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: starting runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(serve(cli)) {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

async fn serve(cli: cli::Cli) -> anyhow::Result<()> {
    if cli.idle {
        return idle(cli).await;
    }
    let stats = match cli.stats {
        None => None,
        Some(addr) => Some(
            daemon::listen::bind_tcp(&addr.ip().to_string(), addr.port())
                .await
                .with_context(|| format!("binding stats on {addr}"))?,
        ),
    };
    let mut terms =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    let agent = Arc::new(
        TunnelAgent::start(
            cli.config,
            AgentListeners {
                tunnels: Vec::new(),
                stats,
                admin: bind_admin(cli.admin).await,
            },
        )
        .await?,
    );
    if let (Some(path), Some(notes)) = (&cli.config_path, &cli.notes) {
        agent.note_bootstrap(&path.display().to_string(), notes);
    }
    let stop = CancellationToken::new();
    if let Some(path) = cli.config_path {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        if let Some(mut hup) = daemon::signals::hangups().await {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = tx.try_send(());
                }
            });
        }
        let follow = tunnel_agent::reload::Follow::new(
            agent.clone(),
            path,
            cli.config_bytes,
            cli.flags,
            cli.stats,
        );
        let stop = stop.clone();
        tokio::spawn(follow.run(Some(rx), stop.cancelled_owned()));
    }
    terms.next().await;
    stop.cancel();
    tracing::info!("termination signal: draining tunnels (a second one exits at once)");
    tokio::select! {
        _ = agent.shutdown() => {}
        _ = terms.next() => tracing::warn!("second termination signal: exiting now"),
    }
    Ok(())
}

/// The admin listener is a debugging aid: one that cannot be bound is
/// reported and the agent serves without it.
async fn bind_admin(addr: Option<std::net::SocketAddr>) -> Option<tokio::net::TcpListener> {
    let addr = addr?;
    match daemon::listen::bind_tcp(&addr.ip().to_string(), addr.port()).await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(
                "binding the admin listener on {addr} (-admin-address or the bootstrap's admin.address): {e}; /debug/connections is not served"
            );
            None
        }
    }
}

/// A bootstrap declaring nothing: serve nothing, bind nothing, exit 0 on the
/// first termination signal.
async fn idle(cli: cli::Cli) -> anyhow::Result<()> {
    let mut terms =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    tracing::info!(
        config = %cli.config_path.map(|p| p.display().to_string()).unwrap_or_default(),
        "the bootstrap declares no listener and no cluster: nothing to serve here (in KKP's nodeport-proxy pod, nodeport-proxy serves from the envoy-manager container); waiting for termination"
    );
    terms.next().await;
    Ok(())
}
