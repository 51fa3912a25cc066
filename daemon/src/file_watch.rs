//! Following one configuration file. Its directory is watched, because
//! editors' rename-into-place and Kubernetes ConfigMap updates (a `..data`
//! symlink swapped) replace the file rather than write it; events on other
//! files there are ignored; a burst of events is read once; and a read is
//! reported only when its outcome (the content, or the error reading it)
//! differs from the last one reported. A broken file is therefore reported
//! once per change, however busy its directory is.

use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use notify::Watcher;
use tokio::sync::mpsc;

/// Events arriving within this of the first are read as one change.
const SETTLE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
#[error("watching {path}: {source}")]
pub struct WatchError {
    pub path: PathBuf,
    pub source: notify::Error,
}

/// Reads at most `max_len` bytes of `path`; a longer file is an error that
/// names the bound.
pub fn read_bounded(path: &Path, max_len: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut out = Vec::new();
    file.take(max_len + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than the limit of {max_len} bytes"),
        ));
    }
    Ok(out)
}

/// One file being followed.
pub struct FileWatch {
    path: PathBuf,
    max_len: u64,
    events: mpsc::Receiver<()>,
    _watcher: notify::RecommendedWatcher,
    /// Digest of the outcome last reported.
    last: Option<u64>,
    /// Events seen on the directory, relevant or not (for tests).
    observed: Arc<AtomicU64>,
    reads: u64,
}

impl FileWatch {
    /// Starts watching `path`'s directory. Reads are bounded by `max_len`.
    pub fn new(path: &Path, max_len: u64) -> Result<Self, WatchError> {
        let err = |source| WatchError {
            path: path.to_path_buf(),
            source,
        };
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let name = path.file_name().map(OsString::from).unwrap_or_default();
        let (tx, events) = mpsc::channel::<()>(1);
        let observed = Arc::new(AtomicU64::new(0));
        let seen = observed.clone();
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            // An error (say, a queue overflow) may hide a change: re-read.
            let relevant = ev.as_ref().map_or(true, |ev| relevant(ev, &name));
            if relevant {
                // A full channel already means "re-read"; nothing is lost.
                let _ = tx.try_send(());
            }
            seen.fetch_add(1, Ordering::Relaxed);
        })
        .map_err(err)?;
        watcher
            .watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(err)?;
        Ok(FileWatch {
            path: path.to_path_buf(),
            max_len,
            events,
            _watcher: watcher,
            last: None,
            observed,
            reads: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `outcome` (a read done elsewhere, such as the load at start)
    /// as reported, so the same outcome is not reported again.
    pub fn seen(&mut self, outcome: &io::Result<Vec<u8>>) {
        self.last = Some(digest(outcome));
    }

    /// Reads the file now (on a blocking thread) and records the outcome as
    /// reported, whatever it is: for a reload someone asked for.
    pub async fn read_now(&mut self) -> io::Result<Vec<u8>> {
        let (outcome, d) = self.read().await;
        self.last = Some(d);
        outcome
    }

    /// Waits until the file's content, or the error reading it, differs
    /// from what was last reported, and returns it. `None` once the watcher
    /// has stopped.
    pub async fn changed(&mut self) -> Option<io::Result<Vec<u8>>> {
        loop {
            self.events.recv().await?;
            // Editors write in bursts; read once they settle.
            tokio::time::sleep(SETTLE).await;
            while self.events.try_recv().is_ok() {}
            let (outcome, d) = self.read().await;
            if self.last != Some(d) {
                self.last = Some(d);
                return Some(outcome);
            }
        }
    }

    /// Events seen on the directory so far, relevant or not.
    pub fn observed(&self) -> u64 {
        self.observed.load(Ordering::Relaxed)
    }

    /// Times the file was read so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Reads the file and digests the outcome, both on a blocking thread:
    /// hashing a seed's table file (megabytes) takes milliseconds that a
    /// runtime worker would not be serving connections in.
    async fn read(&mut self) -> (io::Result<Vec<u8>>, u64) {
        self.reads += 1;
        let (path, max) = (self.path.clone(), self.max_len);
        tokio::task::spawn_blocking(move || {
            let outcome = read_bounded(&path, max);
            let d = digest(&outcome);
            (outcome, d)
        })
        .await
        .unwrap_or_else(|e| {
            let outcome = Err(io::Error::other(e));
            let d = digest(&outcome);
            (outcome, d)
        })
    }
}

/// Whether an event in the directory may have changed the file: one that
/// names it, or a ConfigMap's `..data` swap, and not a mere access.
fn relevant(ev: &notify::Event, name: &OsString) -> bool {
    if matches!(ev.kind, notify::EventKind::Access(_)) {
        return false;
    }
    if ev.paths.is_empty() || ev.need_rescan() {
        return true;
    }
    ev.paths.iter().any(|p| match p.file_name() {
        Some(n) => n == name.as_os_str() || n.to_string_lossy().starts_with(".."),
        // The directory itself (removed, moved).
        None => true,
    })
}

fn digest(outcome: &io::Result<Vec<u8>>) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    match outcome {
        Ok(bytes) => (0u8, bytes).hash(&mut h),
        Err(e) => (1u8, e.kind().to_string(), e.to_string()).hash(&mut h),
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, DataChange, EventKind, ModifyKind};

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        e.paths = paths.iter().map(PathBuf::from).collect();
        e
    }

    #[test]
    fn only_events_that_can_change_the_file_count() {
        let name = OsString::from("table.yaml");
        let write = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        assert!(relevant(&ev(write, &["/etc/np/table.yaml"]), &name));
        assert!(relevant(
            &ev(EventKind::Create(CreateKind::File), &["/etc/np/..data"]),
            &name
        ));
        assert!(!relevant(&ev(write, &["/etc/np/proxy.log"]), &name));
        assert!(!relevant(
            &ev(EventKind::Access(AccessKind::Read), &["/etc/np/table.yaml"]),
            &name
        ));
        // Renamed into place: both names in one event.
        assert!(relevant(
            &ev(
                EventKind::Modify(ModifyKind::Name(notify::event::RenameMode::Both)),
                &["/etc/np/.table.yaml.swp", "/etc/np/table.yaml"]
            ),
            &name
        ));
    }

    /// Busy neighbours are not reads; the same bytes written again are not
    /// a change; a broken file and its repair are one change each.
    #[tokio::test]
    async fn a_change_is_reported_once_and_neighbours_are_ignored() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("table.yaml");
        std::fs::write(&path, "a: 1\n").unwrap_or_else(|e| panic!("{e}"));
        let mut w = FileWatch::new(&path, 1024).unwrap_or_else(|e| panic!("{e}"));
        let first = w.read_now().await;
        assert_eq!(first.as_deref().ok(), Some(&b"a: 1\n"[..]));
        // A log file next to it, written many times.
        let log = dir.path().join("proxy.log");
        let before = w.observed();
        for i in 0..20 {
            std::fs::write(&log, format!("line {i}\n")).unwrap_or_else(|e| panic!("{e}"));
        }
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            while w.observed() < before + 20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert!(seen.await.is_ok(), "the neighbour's events never came");
        assert!(
            w.events.try_recv().is_err(),
            "a neighbour's write asked for a re-read"
        );
        // The file rewritten with the same bytes, then broken.
        std::fs::write(&path, "a: 1\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&path, "{broken").unwrap_or_else(|e| panic!("{e}"));
        let changed = w.changed().await;
        assert_eq!(
            changed.and_then(|r| r.ok()).as_deref(),
            Some(&b"{broken"[..])
        );
        let reads = w.reads();
        // Too large: reported once, as an error naming the limit.
        std::fs::write(&path, vec![b'x'; 2000]).unwrap_or_else(|e| panic!("{e}"));
        let changed = w.changed().await;
        let err = changed.and_then(|r| r.err()).map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("larger than the limit of 1024 bytes"));
        assert!(w.reads() > reads);
    }
}
