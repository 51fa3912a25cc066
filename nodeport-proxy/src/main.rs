//! The nodeport-proxy binary: flags, a runtime, bound listeners, signals.
//! Invoked as `cp` it copies one file: KKP's nodeport-proxy pod runs
//! `/bin/cp /envoy.yaml /etc/envoy/envoy.yaml` from this image in an init
//! container, and the image (distroless) has no other `cp` (docs/kkp.md).

use std::sync::Arc;

use anyhow::Context;
use go_compat::flags::usage_error;
use nodeport_proxy::{Listeners, NodePortProxy, cli};
use tokio::net::TcpListener;

fn main() {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("cp")) {
        std::process::exit(copy_file(args.collect()));
    }
    let values = cli::flag_set().parse_env_or_exit();
    if let Err(e) = go_compat::logging::init(&cli::Flags::from_values(&values).log) {
        usage_error(&e);
    }
    daemon::process::init();
    let cli = cli::from_values(&values).unwrap_or_else(|e| usage_error(&e));
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all().thread_name("nodeport-proxy");
    if cli.worker_threads > 0 {
        rt.worker_threads(cli.worker_threads);
    }
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: starting runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(serve(cli)) {
        tracing::error!("{e:#}");
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

async fn bind(cli: &cli::Cli, port: u16, what: &str) -> anyhow::Result<Option<TcpListener>> {
    if port == 0 {
        return Ok(None);
    }
    let l = daemon::listen::bind_tcp(&cli.bind_address.to_string(), port)
        .await
        .with_context(|| format!("binding {what} listener on {}:{port}", cli.bind_address))?;
    Ok(Some(l))
}

/// The SNI listener, with its slow lane when `-sni-overflow-slow-lane` is on.
async fn bind_sni(
    cli: &cli::Cli,
) -> anyhow::Result<(Option<TcpListener>, Option<daemon::slow_lane::SlowLane>)> {
    let period = cli.config.sni_overflow_slow_lane;
    if cli.sni_port == 0 || period.is_zero() {
        return Ok((bind(cli, cli.sni_port, "SNI").await?, None));
    }
    let (l, lane) = daemon::slow_lane::bind(&cli.bind_address.to_string(), cli.sni_port, period)
        .await
        .with_context(|| {
            format!(
                "binding SNI listener with its slow lane (-sni-overflow-slow-lane) on {}:{}",
                cli.bind_address, cli.sni_port
            )
        })?;
    Ok((Some(l), Some(lane)))
}

/// The admin listener is a debugging aid: one that cannot be bound is
/// reported and the proxy serves without it.
async fn bind_admin(cli: &cli::Cli) -> Option<TcpListener> {
    if cli.admin_port == 0 {
        return None;
    }
    let addr = cli.admin_address.to_string();
    match daemon::listen::bind_tcp(&addr, cli.admin_port).await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(
                "binding the admin listener on {addr}:{} (-admin-address, -envoy-admin-port): {e}; /debug/connections is not served",
                cli.admin_port
            );
            None
        }
    }
}

async fn serve(cli: cli::Cli) -> anyhow::Result<()> {
    if matches!(cli.config.source, nodeport_proxy::TableSource::Inline(_)) {
        tracing::warn!("-source=demo: serving the embedded demo routing table");
    }
    let (sni, sni_slow_lane) = bind_sni(&cli).await?;
    let listeners = Listeners {
        admin: bind_admin(&cli).await,
        stats: bind(&cli, cli.stats_port, "stats").await?,
        sni,
        sni_slow_lane,
        tunneling: bind(&cli, cli.tunneling_port, "tunneling").await?,
        node_ports: Vec::new(),
    };
    let mut terms =
        daemon::signals::Terminations::install().context("installing signal handlers")?;
    let proxy = Arc::new(NodePortProxy::start(cli.config, listeners).await?);
    let reloader = proxy.clone();
    if let Some(source) = cli.kubernetes {
        let sync = proxy.source_sync();
        let client =
            nodeport_proxy::sources::kube::watch_client(source.kubeconfig.as_deref(), sync.clone())
                .await?;
        let p = proxy.clone();
        tokio::spawn(async move {
            nodeport_proxy::sources::kube::follow(client, source, sync, |changes| {
                p.apply_changes(changes)
            })
            .await;
        });
    } else {
        tokio::spawn(async move {
            let Some(mut hup) = daemon::signals::hangups().await else {
                return;
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the routing table");
                reloader.reload();
            }
        });
    }
    terms.next().await;
    tracing::info!("termination signal: shutting down (a second one exits at once)");
    tokio::select! {
        _ = proxy.shutdown() => {}
        _ = terms.next() => tracing::warn!("second termination signal: exiting now"),
    }
    Ok(())
}

/// `cp SOURCE DEST` (DEST may be a directory), nothing more; 0 on success,
/// 1 with one line on stderr otherwise.
fn copy_file(args: Vec<std::ffi::OsString>) -> i32 {
    let [src, dst] = args.as_slice() else {
        eprintln!(
            "cp: usage: cp SOURCE DEST (this cp copies one file, for KKP's copy-envoy-config init container)"
        );
        return 1;
    };
    let (src, mut dst) = (std::path::Path::new(src), std::path::PathBuf::from(dst));
    if dst.is_dir()
        && let Some(name) = src.file_name()
    {
        dst.push(name);
    }
    match std::fs::copy(src, &dst) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("cp: copying {} to {}: {e}", src.display(), dst.display());
            1
        }
    }
}
