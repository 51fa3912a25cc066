//! Loading the inventory from a file (YAML, or JSON by extension) and keeping
//! the table in step with it: re-read when the file changes (the directory is
//! watched, so editors' rename-into-place and ConfigMap symlink swaps count;
//! see [`daemon::file_watch`]) and when asked (SIGHUP). A file that fails to
//! load leaves the table as it is, and is reported once per change, not once
//! per event in its directory. Reading and parsing run on a blocking thread,
//! never on a runtime worker that serves connections.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use daemon::file_watch::{FileWatch, read_bounded};
use tokio::sync::Notify;

use crate::config::TableSource;
use crate::limits::MAX_TABLE_FILE;
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
}

/// Parses inventory text: JSON when `json`, otherwise YAML.
pub fn parse(text: &str, json: bool) -> Result<Inventory, String> {
    if json {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

/// Parses the bytes of the table file at `path`.
pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Inventory, SourceError> {
    let json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let text = std::str::from_utf8(bytes).map_err(|e| SourceError::Parse {
        path: path.to_path_buf(),
        message: format!("not UTF-8: {e}"),
    })?;
    parse(text, json).map_err(|message| SourceError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

pub fn embedded_default() -> Inventory {
    // The embedded file is checked by a unit test; an empty table is the safe fallback.
    parse(EMBEDDED_DEFAULT, false).unwrap_or_default()
}

pub fn load_file(path: &Path) -> Result<Inventory, SourceError> {
    let bytes = read_bounded(path, MAX_TABLE_FILE).map_err(|source| SourceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &bytes)
}

pub fn load(source: &TableSource) -> Result<Inventory, SourceError> {
    match source {
        TableSource::File(p) => load_file(p),
        TableSource::Inline(inv) => Ok(inv.clone()),
    }
}

/// A table source being followed: the file watch starts before the first
/// read, so no change between the two is missed.
pub struct Follower {
    source: TableSource,
    watch: Option<FileWatch>,
}

impl Follower {
    /// Starts watching `source` and loads it once. Without a watch (the
    /// directory cannot be watched) reloads happen on SIGHUP only.
    pub fn start(source: TableSource) -> (Self, Result<Inventory, SourceError>) {
        let (watch, first) = match &source {
            TableSource::File(path) => {
                let mut watch = FileWatch::new(path, MAX_TABLE_FILE)
                    .map_err(|e| {
                        tracing::error!(error = %e, "routing table file not watched; reload with SIGHUP");
                    })
                    .ok();
                let read = read_bounded(path, MAX_TABLE_FILE);
                if let Some(w) = watch.as_mut() {
                    w.seen(&read);
                }
                let first = read
                    .map_err(|source| SourceError::Read {
                        path: path.clone(),
                        source,
                    })
                    .and_then(|b| parse_file(path, &b));
                (watch, first)
            }
            TableSource::Inline(inv) => (None, Ok(inv.clone())),
        };
        (Follower { source, watch }, first)
    }

    /// Re-applies the source whenever `reload` is notified or (for a file)
    /// its content changes, until the process drains.
    pub async fn run(
        mut self,
        store: Arc<TableStore>,
        reload: Arc<Notify>,
        drain: daemon::drain::Drain,
    ) {
        loop {
            let changed = async {
                match self.watch.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            let bytes = tokio::select! {
                _ = reload.notified() => match self.watch.as_mut() {
                    Some(w) => Some(w.read_now().await),
                    None => None,
                },
                Some(read) = changed => Some(read),
                _ = drain.draining() => return,
            };
            let (source, store) = (self.source.clone(), store.clone());
            // Parsing and building the table take long at seed scale: not
            // on a worker that serves connections.
            let applied = tokio::task::spawn_blocking(move || {
                let loaded = match (&source, bytes) {
                    (TableSource::File(path), Some(read)) => read
                        .map_err(|e| SourceError::Read {
                            path: path.clone(),
                            source: e,
                        })
                        .and_then(|b| parse_file(path, &b)),
                    (source, _) => load(source),
                };
                match loaded {
                    Ok(inv) => {
                        store.apply(&inv);
                    }
                    Err(e) => store.failed(e.to_string()),
                }
            })
            .await;
            if let Err(e) = applied {
                tracing::error!(error = %e, "routing table reload did not finish");
            }
        }
    }
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
