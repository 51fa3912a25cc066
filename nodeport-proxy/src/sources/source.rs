//! Loading the inventory from a file (YAML, or JSON by extension) and keeping
//! the table in step with it: re-read when the file changes (the directory is
//! watched, so editors' rename-into-place and ConfigMap symlink swaps count;
//! see [`daemon::file_watch`]) and when asked (SIGHUP). A file that fails to
//! load leaves the table as it is, and is reported once per change, not once
//! per event in its directory. Reading and parsing run on a blocking thread,
//! never on a runtime worker that serves connections.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use daemon::file_watch::{FileWatch, read_bounded};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::TableSource;
use crate::limits::MAX_TABLE_FILE;
use crate::routing::index::ObjKey;
use crate::routing::model::Inventory;
use crate::routing::store::{Change, TableStore};

/// The demo inventory used when no file is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../config/demo.yaml");

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
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| e.to_string())
    }
}

/// How table files are read as YAML: YAML 1.2 scalars (`yes` is a string,
/// not a boolean), a repeated key refused in an object (`duplicate field`)
/// and the last one kept in a map (labels), errors in one line (the
/// log's), and a parse budget sized for the largest table file.
fn yaml_options() -> serde_saphyr::Options {
    use crate::limits::{MAX_TABLE_YAML_DEPTH, MAX_TABLE_YAML_NODES};
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = MAX_TABLE_YAML_NODES;
    budget.max_nodes = MAX_TABLE_YAML_NODES;
    budget.max_total_scalar_bytes = MAX_TABLE_YAML_NODES;
    budget.max_depth = MAX_TABLE_YAML_DEPTH;
    serde_saphyr::options! {
        budget: Some(budget),
        strict_booleans: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        with_snippet: false,
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

/// What `source` holds now (a Kubernetes source: nothing, its watch feeds
/// the table).
pub fn load(source: &TableSource) -> Result<Inventory, SourceError> {
    match source {
        TableSource::File(p) => load_file(p),
        TableSource::Inline(inv) => Ok(inv.clone()),
        TableSource::Kubernetes => Ok(Inventory::default()),
    }
}

/// What one load of the source says.
#[derive(Debug)]
pub enum Loaded {
    /// The whole inventory (the table becomes exactly this).
    Whole(Inventory),
    /// What changed since the last load (the file's items that changed).
    Changes(Vec<Change>),
}

impl Loaded {
    /// Applies it to `store`; returns whether the table changed.
    pub fn apply(self, store: &TableStore) -> bool {
        match self {
            Loaded::Whole(inv) => store.apply(&inv),
            Loaded::Changes(changes) => store.apply_changes(changes),
        }
    }
}

/// The items of the last load of a YAML table file (by a hash of their
/// text) and the objects they made, so the next load parses only the items
/// whose text is new (see yaml_items.rs).
pub struct ItemCache {
    services: HashMap<u64, ObjKey>,
    slices: HashMap<u64, ObjKey>,
    /// Whether the maps describe what the table holds (not after a load
    /// that had to parse the whole file).
    valid: bool,
}

impl Default for ItemCache {
    /// Nothing loaded yet: an empty table, described exactly.
    fn default() -> Self {
        ItemCache {
            services: HashMap::new(),
            slices: HashMap::new(),
            valid: true,
        }
    }
}

fn item_hash(text: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// One list's items against their previous load: new items parsed and
/// upserted, vanished ones deleted. `None` when an item does not parse on
/// its own or two items name one object (the whole file is parsed then).
fn diff_items<T: serde::de::DeserializeOwned>(
    texts: &[String],
    before: &HashMap<u64, ObjKey>,
    key_of: impl Fn(&T) -> ObjKey,
    change: impl Fn(ObjKey, Option<T>) -> Change,
    changes: &mut Vec<Change>,
) -> Option<HashMap<u64, ObjKey>> {
    let mut now: HashMap<u64, ObjKey> = HashMap::with_capacity(texts.len());
    let mut keys: HashSet<ObjKey> = HashSet::with_capacity(texts.len());
    for text in texts {
        let h = item_hash(text);
        let key = match before.get(&h) {
            Some(k) => k.clone(),
            None => {
                let mut one: Vec<T> =
                    serde_saphyr::from_str_with_options(text, yaml_options()).ok()?;
                let item = one.pop().filter(|_| one.is_empty())?;
                let k = key_of(&item);
                changes.push(change(k.clone(), Some(item)));
                k
            }
        };
        if !keys.insert(key.clone()) || now.insert(h, key).is_some() {
            return None;
        }
    }
    for (h, k) in before {
        if !now.contains_key(h) && !keys.contains(k) {
            changes.push(change(k.clone(), None));
        }
    }
    Some(now)
}

/// Loads the table file's `bytes`: only the items that changed since the
/// load `cache` remembers when the file is plain block YAML, else all of it.
/// A file that does not load leaves `cache` as it was (the table stays).
pub fn load_items(path: &Path, bytes: &[u8], cache: &mut ItemCache) -> Result<Loaded, SourceError> {
    let json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let split = (!json)
        .then(|| std::str::from_utf8(bytes).ok())
        .flatten()
        .and_then(crate::sources::yaml_items::split);
    if let Some(items) = split {
        let empty = HashMap::new();
        let (before_services, before_slices) = if cache.valid {
            (&cache.services, &cache.slices)
        } else {
            (&empty, &empty)
        };
        let mut changes = Vec::new();
        let services = diff_items(
            &items.services,
            before_services,
            |s: &crate::routing::model::Service| {
                ObjKey::new(&s.metadata.namespace, &s.metadata.name)
            },
            Change::Service,
            &mut changes,
        );
        let slices = diff_items(
            &items.slices,
            before_slices,
            |s: &crate::routing::model::EndpointSlice| {
                ObjKey::new(&s.metadata.namespace, &s.metadata.name)
            },
            Change::Slice,
            &mut changes,
        );
        if let (Some(services), Some(slices)) = (services, slices) {
            let loaded = if cache.valid {
                Loaded::Changes(changes)
            } else {
                // The table was loaded whole last time: replace it whole.
                let mut inv = Inventory::default();
                for c in changes {
                    match c {
                        Change::Service(_, Some(s)) => inv.services.push(s),
                        Change::Slice(_, Some(s)) => inv.endpoint_slices.push(s),
                        _ => {}
                    }
                }
                Loaded::Whole(inv)
            };
            *cache = ItemCache {
                services,
                slices,
                valid: true,
            };
            return Ok(loaded);
        }
    }
    let inventory = parse_file(path, bytes)?;
    *cache = ItemCache {
        valid: false,
        ..ItemCache::default()
    };
    Ok(Loaded::Whole(inventory))
}

/// A table source being followed: the file watch starts before the first
/// read, so no change between the two is missed.
pub struct Follower {
    source: TableSource,
    watch: Option<FileWatch>,
    cache: Arc<Mutex<ItemCache>>,
}

impl Follower {
    /// Starts watching `source` and loads it once. Without a watch (the
    /// directory cannot be watched) reloads happen on SIGHUP only. A
    /// Kubernetes source loads nothing here (`None`): its watch feeds the
    /// table.
    pub fn start(source: TableSource) -> (Self, Result<Option<Loaded>, SourceError>) {
        let mut cache = ItemCache::default();
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
                    .and_then(|b| load_items(path, &b, &mut cache))
                    .map(Some);
                (watch, first)
            }
            TableSource::Inline(inv) => (None, Ok(Some(Loaded::Whole(inv.clone())))),
            TableSource::Kubernetes => (None, Ok(None)),
        };
        let cache = Arc::new(Mutex::new(cache));
        (
            Follower {
                source,
                watch,
                cache,
            },
            first,
        )
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
            if matches!(self.source, TableSource::Kubernetes) {
                continue;
            }
            let (source, store, cache) = (self.source.clone(), store.clone(), self.cache.clone());
            // Parsing and building the table take long at seed scale: not
            // on a worker that serves connections.
            let applied = tokio::task::spawn_blocking(move || {
                let mut cache = cache.lock();
                let loaded = match (&source, bytes) {
                    (TableSource::File(path), read) => read
                        .unwrap_or_else(|| read_bounded(path, MAX_TABLE_FILE))
                        .map_err(|e| SourceError::Read {
                            path: path.clone(),
                            source: e,
                        })
                        .and_then(|b| load_items(path, &b, &mut cache)),
                    (TableSource::Inline(inv), _) => Ok(Loaded::Whole(inv.clone())),
                    (TableSource::Kubernetes, _) => Ok(Loaded::Changes(Vec::new())),
                };
                drop(cache);
                // The file's text, its items and the last load's hashes
                // (tens of MB at seed scale) are free now: back to the OS
                // at once, before the table changes, so a burst of reloads
                // does not leave the process larger than its table
                // (jemalloc would wait 10 s).
                daemon::process::purge_freed_memory();
                match loaded {
                    Ok(l) => {
                        l.apply(&store);
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
        let (plan, warnings) =
            crate::routing::index::build(&inv, &crate::routing::plan::PlanOptions::default());
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

#[cfg(test)]
#[path = "source_tests.rs"]
mod item_tests;
