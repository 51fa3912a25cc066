//! Loading the inventory from a file (YAML, or JSON by extension) and keeping
//! the table in step with it: re-read when the file changes (the directory is
//! watched, so editors' rename-into-place and ConfigMap symlink swaps count)
//! and when asked (SIGHUP). A file that fails to load leaves the table as it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;
use tokio::sync::{Notify, mpsc};

use crate::config::TableSource;
use crate::model::Inventory;
use crate::store::TableStore;

/// The demo inventory used when no file is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../config/demo.yaml");

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("watching {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// Parses inventory text: JSON when `json`, otherwise YAML.
pub fn parse(text: &str, json: bool) -> Result<Inventory, String> {
    if json {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

pub fn embedded_default() -> Inventory {
    // The embedded file is checked by a unit test; an empty table is the safe fallback.
    parse(EMBEDDED_DEFAULT, false).unwrap_or_default()
}

pub fn load_file(path: &Path) -> Result<Inventory, SourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| SourceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    parse(&text, json).map_err(|message| SourceError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

pub fn load(source: &TableSource) -> Result<Inventory, SourceError> {
    match source {
        TableSource::File(p) => load_file(p),
        TableSource::Inline(inv) => Ok(inv.clone()),
    }
}

/// Re-applies the source whenever `reload` is notified or (for a file) the
/// file changes, until the process drains.
pub async fn follow(
    source: TableSource,
    store: Arc<TableStore>,
    reload: Arc<Notify>,
    drain: daemon::drain::Drain,
) -> Result<(), SourceError> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let _watcher = match &source {
        TableSource::File(path) => Some(watch_file(path, tx)?),
        TableSource::Inline(_) => None,
    };
    loop {
        tokio::select! {
            _ = reload.notified() => {}
            Some(()) = rx.recv() => {
                // Editors write in bursts; one re-read after they settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = drain.draining() => return Ok(()),
        }
        match load(&source) {
            Ok(inv) => {
                store.apply(&inv);
            }
            Err(e) => store.failed(e.to_string()),
        }
    }
}

fn watch_file(
    path: &Path,
    tx: mpsc::Sender<()>,
) -> Result<notify::RecommendedWatcher, SourceError> {
    let err = |source| SourceError::Watch {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && !matches!(ev.kind, notify::EventKind::Access(_))
        {
            // A full channel already means "re-read"; nothing is lost.
            let _ = tx.try_send(());
        }
    })
    .map_err(err)?;
    watcher
        .watch(&dir, notify::RecursiveMode::NonRecursive)
        .map_err(err)?;
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses_and_exposes_every_kind() {
        let inv = parse(EMBEDDED_DEFAULT, false).unwrap_or_else(|e| panic!("{e}"));
        let (plan, warnings) = crate::plan::build(&inv, &crate::plan::PlanOptions::default());
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(plan.node_ports.len(), 2);
        assert_eq!(plan.sni.len(), 1);
        assert_eq!(plan.tunnels.len(), 2);
    }

    #[test]
    fn json_and_yaml_load_alike_and_typos_fail() {
        let yaml = "services: []\nendpointSlices: []\n";
        let json = r#"{"services": [], "endpointSlices": []}"#;
        assert_eq!(parse(yaml, false), parse(json, true));
        assert!(parse("endpointslices: []", false).is_err());
        assert!(
            parse(
                "services: [{metadata: {name: a}, spec: {ports: [{port: 70000}]}}]",
                false
            )
            .is_err()
        );
    }
}
