//! Following the bootstrap file: it is read again when it changes (its
//! directory is watched, so editors' rename-into-place and a ConfigMap
//! volume's symlink swap count) and on SIGHUP, and applied without a
//! restart. A file that does not load is logged once per change, counted,
//! and shown on `/healthz`; the agent keeps the last good configuration.
//!
//! Under KKP this rarely matters: the ConfigMap is mounted by subPath, which
//! never updates, and a changed config restarts the pods (`checksum/config`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;
use tokio::sync::mpsc;

use crate::TunnelAgent;
use crate::bootstrap::read;
use crate::cli::FlagSettings;
use crate::metrics::ReloadResult;

/// Events arriving within this are one change (editors write in bursts).
const SETTLE: Duration = Duration::from_millis(50);

/// Reloads `path` into `agent` until `stop` resolves. `stats` is the stats
/// address in use (changing it needs a restart). `hangups` delivers SIGHUP.
pub async fn follow(
    agent: Arc<TunnelAgent>,
    path: PathBuf,
    flags: FlagSettings,
    stats: Option<std::net::SocketAddr>,
    mut hangups: Option<mpsc::Receiver<()>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let _watcher = match watch(&path, tx) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "configuration file not watched; reload with SIGHUP only");
            None
        }
    };
    let mut follower = Follower {
        agent,
        flags,
        stats,
        last: read(&path),
        path,
    };
    tokio::pin!(stop);
    loop {
        let forced = tokio::select! {
            Some(()) = rx.recv() => {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
                false
            }
            Some(()) = async {
                match &mut hangups {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            _ = &mut stop => return,
        };
        follower.reload(forced).await;
    }
}

struct Follower {
    agent: Arc<TunnelAgent>,
    flags: FlagSettings,
    stats: Option<std::net::SocketAddr>,
    path: PathBuf,
    /// What the file held when last acted on (or why it could not be read).
    last: Result<Vec<u8>, String>,
}

impl Follower {
    /// Reads and applies the file if it changed (or `forced`: SIGHUP).
    async fn reload(&mut self, forced: bool) {
        let now = read(&self.path);
        if now == self.last && !forced {
            return;
        }
        self.last = now.clone();
        let metrics = self.agent.metrics();
        let name = self.path.display().to_string();
        let loaded = now.and_then(|bytes| {
            let b = crate::bootstrap::parse(&bytes).map_err(|e| format!("{name}: {e}"))?;
            self.flags
                .resolve(Some(&b))
                .map_err(|e| format!("{name}: {e}"))
        });
        let result = match loaded {
            Err(e) => Err(e),
            Ok((config, stats)) => {
                if stats != self.stats {
                    tracing::warn!(path = %name, "the stats listener changed; that takes a restart, the rest is applied");
                }
                self.agent
                    .apply(config)
                    .await
                    .map_err(|e| format!("{name}: {e}"))
            }
        };
        match result {
            Ok(changed) => {
                self.agent.set_reload_error(None);
                let r = if changed {
                    tracing::info!(path = %name, "configuration reloaded and applied");
                    ReloadResult::Applied
                } else {
                    ReloadResult::Unchanged
                };
                metrics.reload(r);
            }
            Err(e) => {
                // Once per change: the same broken file is not re-read until
                // it changes again.
                tracing::error!(error = %e, "configuration not reloaded; keeping the previous one");
                metrics.reload(ReloadResult::Failed);
                self.agent.set_reload_error(Some(e));
            }
        }
    }
}

fn watch(path: &Path, tx: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && !matches!(ev.kind, notify::EventKind::Access(_))
        {
            // A full channel already means "read again"; nothing is lost.
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
