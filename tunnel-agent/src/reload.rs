//! Following the bootstrap file: it is read again when it changes
//! ([`daemon::file_watch`]: its directory is watched, so editors'
//! rename-into-place and a ConfigMap volume's symlink swap count, and only a
//! different outcome counts as a change) and on SIGHUP, and applied without a
//! restart. A file that does not load is logged once per change, counted,
//! and shown on `/healthz`; the agent keeps the last good configuration.
//!
//! Under KKP this rarely matters: the ConfigMap is mounted by subPath, which
//! never updates, and a changed config restarts the pods (`checksum/config`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use daemon::file_watch::FileWatch;
use tokio::sync::mpsc;

use crate::TunnelAgent;
use crate::cli::FlagSettings;
use crate::limits::MAX_CONFIG_BYTES;
use crate::metrics::ReloadResult;

/// A configuration file being followed. Made before the agent serves (or
/// at least before anyone may change the file): from then on every change
/// is seen.
pub struct Follow {
    watch: Option<FileWatch>,
    /// What the agent was configured from.
    loaded: Vec<u8>,
    path: PathBuf,
    follower: Follower,
}

impl Follow {
    /// Starts watching `path`, whose content the agent was configured from
    /// is `loaded`; `stats` is the stats address in use (changing it takes a
    /// restart).
    pub fn new(
        agent: Arc<TunnelAgent>,
        path: PathBuf,
        loaded: Vec<u8>,
        flags: FlagSettings,
        stats: Option<std::net::SocketAddr>,
    ) -> Follow {
        let watch = match FileWatch::new(&path, MAX_CONFIG_BYTES as u64) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::error!(error = %e, "configuration file not watched; reload with SIGHUP only");
                None
            }
        };
        Follow {
            watch,
            loaded,
            follower: Follower {
                agent,
                flags,
                stats,
                name: path.display().to_string(),
            },
            path,
        }
    }

    /// Applies every change (and a re-read on each `hangups` message) until
    /// `stop` resolves.
    pub async fn run(
        mut self,
        mut hangups: Option<mpsc::Receiver<()>>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        // A change between the first load and the watch's start is caught
        // here.
        if let Some(w) = &mut self.watch {
            let now = w.read_now().await;
            if now.as_ref().ok() != Some(&self.loaded) {
                self.follower.apply(now).await;
            }
        }
        loop {
            let outcome = tokio::select! {
                Some(outcome) = async {
                    match &mut self.watch {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                } => outcome,
                Some(()) = async {
                    match &mut hangups {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => match &mut self.watch {
                    Some(w) => w.read_now().await,
                    None => daemon::file_watch::read_bounded(&self.path, MAX_CONFIG_BYTES as u64),
                },
                _ = &mut stop => return,
            };
            self.follower.apply(outcome).await;
        }
    }
}

struct Follower {
    agent: Arc<TunnelAgent>,
    flags: FlagSettings,
    stats: Option<std::net::SocketAddr>,
    name: String,
}

impl Follower {
    /// Applies what a read of the file gave.
    async fn apply(&self, outcome: io::Result<Vec<u8>>) {
        let name = &self.name;
        let loaded = outcome
            .map_err(|e| format!("reading {name}: {e}"))
            .and_then(|bytes| {
                let b = crate::bootstrap::parse_with(&bytes, self.flags.bootstrap_options())
                    .map_err(|e| format!("{name}: {e}"))?;
                let (config, stats) = self
                    .flags
                    .resolve(Some(&b))
                    .map_err(|e| format!("{name}: {e}"))?;
                Ok((config, stats, b.notes))
            });
        let result = match loaded {
            Err(e) => Err(e),
            Ok((config, stats, notes)) => {
                if stats != self.stats {
                    tracing::warn!(path = %name, "the stats listener changed; that takes a restart, the rest is applied");
                }
                let applied = self
                    .agent
                    .apply(config)
                    .await
                    .map_err(|e| format!("{name}: {e}"));
                if applied.is_ok() {
                    self.agent.note_bootstrap(name, &notes);
                }
                applied
            }
        };
        let metrics = self.agent.metrics();
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
                // Once per change: the watch reports the same broken file
                // only once.
                tracing::error!(error = %e, "configuration not reloaded; keeping the previous one");
                metrics.reload(ReloadResult::Failed);
                self.agent.set_reload_error(Some(e));
            }
        }
    }
}
