//! TLS material that follows its files: a configuration built from a
//! certificate, key and CA file is rebuilt when any of them changes, so
//! certificates rotated by kubelet, cert-manager or a Secret volume (an
//! atomic `..data` symlink swap) are used without a restart.
//!
//! New handshakes take [`Reloading::current`]; connections already
//! established keep the configuration they were made with. A rebuild that
//! fails (a half-written file, a key that does not match, a certificate
//! expired or not yet valid: [`crate::tls::validity`]) is logged with the
//! flag that named the file, counted as a failed reload and changes nothing:
//! the previous material stays in use until the files are fixed. Files
//! refused because their certificate is not valid yet are read again at the
//! next poll even if they did not change.
//!
//! Files are followed with [`crate::file_watch`] (their directories are
//! watched) and, as a backstop for changes no event announces (a symlink
//! whose target lives elsewhere and is rewritten in place), re-read every
//! [`POLL_INTERVAL`].

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::drain::Drain;
use crate::file_watch::{FileWatch, read_bounded};
use crate::limits::MAX_PEM_FILE;
pub use crate::tls::Files;
use crate::tls::{FileFlags, Role, TlsError};
use go_compat::gometrics::Registry;

/// How often the files are re-read even when no event said they changed.
pub const POLL_INTERVAL: Duration = Duration::from_secs(60);

/// The metric names a binary gives its TLS material (see its `metrics.rs`).
#[derive(Debug, Clone, Copy)]
pub struct MetricNames {
    /// Gauge `{tls, flag}`: the earliest `NotAfter` (Unix seconds) of the
    /// certificates in the file the flag names.
    pub expiry: &'static str,
    /// Counter `{tls, result}`: reloads after a change, `success` or `failure`.
    pub reloads: &'static str,
}

impl MetricNames {
    /// HELP text for both, registered once per registry.
    pub fn describe(&self, registry: &Registry) {
        registry.describe_gauge(
            self.expiry,
            "Expiry (NotAfter, Unix seconds) of the earliest-expiring certificate in the file named by `flag`, as currently loaded.",
        );
        registry.describe_counter(
            self.reloads,
            "Reloads of TLS material after its files changed, by result; on failure the previous material stays in use.",
        );
    }
}

type Build<T> = dyn Fn(&Files) -> Result<T, TlsError> + Send + Sync;

/// What start-up does with a certificate outside its validity period
/// (`--allow-expired-certificates`); reloads refuse one either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtStart {
    /// An error naming the flag (the default).
    #[default]
    Refuse,
    /// A warning naming the flag; the material is used.
    Warn,
}

/// Why files could not be taken.
enum Refused {
    Load(TlsError),
    Validity(crate::tls::validity::OutsideValidity),
}

impl Refused {
    fn text(&self, flags: FileFlags) -> String {
        match self {
            Refused::Load(e) => e.naming(flags),
            Refused::Validity(e) => e.to_string(),
        }
    }
}

struct Source<T> {
    /// Names the material in logs and metrics (`frontend`, `agent`, …).
    name: &'static str,
    flags: FileFlags,
    files: Files,
    build: Box<Build<T>>,
    tx: watch::Sender<Arc<T>>,
}

/// A TLS configuration (`rustls::ServerConfig` or `ClientConfig`) that is
/// either fixed or rebuilt from its files when they change.
pub struct Reloading<T> {
    rx: watch::Receiver<Arc<T>>,
    source: Option<Arc<Source<T>>>,
}

impl<T> Clone for Reloading<T> {
    fn clone(&self) -> Self {
        Reloading {
            rx: self.rx.clone(),
            source: self.source.clone(),
        }
    }
}

impl<T> From<Arc<T>> for Reloading<T> {
    fn from(v: Arc<T>) -> Self {
        Reloading {
            rx: watch::channel(v).1,
            source: None,
        }
    }
}

impl<T> From<T> for Reloading<T> {
    fn from(v: T) -> Self {
        Arc::new(v).into()
    }
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Builds the configuration from `files` now (an error names the flag
    /// of the file at fault), and keeps `build` to rebuild it on a change.
    /// A certificate outside its validity period is an error too, unless
    /// `at_start` says to warn.
    pub fn from_files(
        name: &'static str,
        flags: FileFlags,
        files: Files,
        at_start: AtStart,
        build: impl Fn(&Files) -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, String> {
        let first = build(&files).map_err(|e| e.naming(flags))?;
        if let Err(e) = crate::tls::validity::check_now(&files, flags) {
            match at_start {
                AtStart::Refuse => {
                    return Err(format!("{e} (--allow-expired-certificates starts anyway)"));
                }
                AtStart::Warn => {
                    tracing::warn!(tls = name, error = %e, "starting with a certificate outside its validity period (--allow-expired-certificates); peers will refuse it")
                }
            }
        }
        let (tx, rx) = watch::channel(Arc::new(first));
        Ok(Reloading {
            rx,
            source: Some(Arc::new(Source {
                name,
                flags,
                files,
                build: Box::new(build),
                tx,
            })),
        })
    }

    /// The configuration for a new handshake.
    pub fn current(&self) -> Arc<T> {
        self.rx.borrow().clone()
    }

    /// Changes whenever new material is in use (for tests).
    pub fn subscribe(&self) -> watch::Receiver<Arc<T>> {
        self.rx.clone()
    }

    /// Follows the files until `drain` starts, rebuilding on every change and
    /// keeping the expiry gauges current. The gauges are set and the files
    /// watched before this returns; the future does the rest. It ends at
    /// once for fixed material.
    pub fn follow(
        self,
        registry: Arc<Registry>,
        names: MetricNames,
        drain: Drain,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let setup = self.source.map(|src| {
            names.describe(&registry);
            record_expiry(&registry, names, &src);
            let mut watches: Vec<FileWatch> = Vec::new();
            for (role, path) in src.files.each() {
                match FileWatch::new(path, MAX_PEM_FILE) {
                    Ok(w) => watches.push(w),
                    Err(e) => tracing::warn!(
                        tls = src.name, flag = flag(src.flags, role), error = %e,
                        poll = %go_compat::duration::format(POLL_INTERVAL),
                        "cannot watch this TLS file for changes; it is re-read periodically instead"
                    ),
                }
            }
            let last = Some(digest(&src.files));
            (src, watches, last)
        });
        async move {
            let Some((src, mut watches, mut last)) = setup else {
                return;
            };
            let reloads =
                |result| registry.counter(names.reloads, &[("tls", src.name), ("result", result)]);
            let (ok, failed) = (reloads("success"), reloads("failure"));
            let mut poll = tokio::time::interval(POLL_INTERVAL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            poll.tick().await;
            loop {
                tokio::select! {
                    _ = any_change(&mut watches) => {}
                    _ = poll.tick() => {}
                    // New handshakes end with the drain; so does following.
                    _ = drain.draining() => return,
                }
                let files = src.files.clone();
                let Ok(now) = tokio::task::spawn_blocking(move || digest(&files)).await else {
                    continue;
                };
                if last == Some(now) {
                    continue;
                }
                last = Some(now);
                let s = src.clone();
                let built = tokio::task::spawn_blocking(move || {
                    let config = (s.build)(&s.files).map_err(Refused::Load)?;
                    crate::tls::validity::check_now(&s.files, s.flags)
                        .map_err(Refused::Validity)?;
                    Ok(config)
                });
                match built.await {
                    Ok(Ok(config)) => {
                        src.tx.send_replace(Arc::new(config));
                        ok.increment(1);
                        record_expiry(&registry, names, &src);
                        tracing::info!(
                            tls = src.name,
                            "TLS files changed: new handshakes use the new certificate, key and CA; established connections are kept"
                        );
                    }
                    Ok(Err(e)) => {
                        failed.increment(1);
                        if let Refused::Validity(v) = &e
                            && v.not_yet_valid()
                        {
                            // Valid later: read them again at the next poll.
                            last = None;
                        }
                        tracing::warn!(tls = src.name, error = %e.text(src.flags), "TLS files changed but cannot be loaded; the material loaded before stays in use");
                    }
                    Err(e) => {
                        tracing::warn!(tls = src.name, error = %e, "TLS reload did not finish")
                    }
                }
            }
        }
    }
}

fn flag(flags: FileFlags, role: Role) -> &'static str {
    match role {
        Role::Cert => flags.cert,
        Role::Key => flags.key,
        Role::Ca => flags.ca,
    }
}

/// Resolves when any watched file's content changed; never without watches.
async fn any_change(watches: &mut [FileWatch]) {
    if watches.is_empty() {
        return std::future::pending().await;
    }
    let changes = watches.iter_mut().map(|w| Box::pin(w.changed()));
    let (outcome, _, _) = futures::future::select_all(changes).await;
    if outcome.is_none() {
        // That watcher stopped; the poll still covers its file.
        std::future::pending::<()>().await;
    }
}

/// What the files hold now (or why they cannot be read), as one number.
fn digest(files: &Files) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for (_, path) in files.each() {
        match read_bounded(path, MAX_PEM_FILE) {
            Ok(bytes) => (0u8, bytes).hash(&mut h),
            Err(e) => (1u8, e.to_string()).hash(&mut h),
        }
    }
    h.finish()
}

fn record_expiry<T>(registry: &Registry, names: MetricNames, src: &Source<T>) {
    for (role, path) in src.files.each() {
        if role == Role::Key {
            continue;
        }
        if let Some(t) = earliest_expiry(path) {
            registry
                .gauge(
                    names.expiry,
                    &[("tls", src.name), ("flag", flag(src.flags, role))],
                )
                .set(t as f64);
        }
    }
}

/// The earliest `NotAfter` (Unix seconds) of the certificates in a PEM file.
pub fn earliest_expiry(path: &std::path::Path) -> Option<i64> {
    let pem = read_bounded(path, MAX_PEM_FILE).ok()?;
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .filter_map(|der| {
            use x509_parser::prelude::{FromDer, X509Certificate};
            X509Certificate::from_der(der.as_ref())
                .ok()
                .map(|(_, c)| c.validity().not_after.timestamp())
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    const FLAGS: FileFlags = FileFlags {
        cert: "cluster-cert",
        key: "cluster-key",
        ca: "cluster-ca-cert",
    };

    /// A self-signed certificate for localhost expiring at `not_after`.
    fn issue(dir: &Path, version: &str, not_after: i64) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        params.not_after =
            rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after.unsigned_abs());
        let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}"));
        let d = dir.join(version);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.join("tls.crt"), cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.join("tls.key"), key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        (d.join("tls.crt"), d.join("tls.key"))
    }

    /// Points `..data` at `version` the way kubelet updates a Secret
    /// volume: a new symlink renamed over the old one.
    fn swap(dir: &Path, version: &str) {
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp).unwrap_or_else(|e| panic!("{e}"));
        std::fs::rename(&tmp, dir.join("..data")).unwrap_or_else(|e| panic!("{e}"));
    }

    fn gauge(text: &str, flag: &str) -> Option<String> {
        // Labels sorted by name and values as Go formats floats, as
        // client_golang writes them.
        let prefix = format!("test_expiry{{flag=\"{flag}\",tls=\"agent\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    }

    /// A Secret-volume layout (`tls.crt -> ..data/tls.crt`, `..data -> v1`)
    /// swapped to v2 is picked up, the gauge follows it; a broken v3 and an
    /// expired v4 are refused, counted and the v2 material stays.
    #[tokio::test]
    async fn follows_a_secret_volume_swap_and_keeps_the_old_material_on_a_bad_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = dir.path();
        issue(d, "v1", 2_000_000_000);
        issue(d, "v2", 2_100_000_000);
        std::fs::create_dir_all(d.join("v3")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            d.join("v3/tls.crt"),
            "-----BEGIN CERTIFICATE-----\ntruncated",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(d.join("v2/tls.key"), d.join("v3/tls.key")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("v1", d.join("..data")).unwrap_or_else(|e| panic!("{e}"));
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), d.join(f))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let files = Files {
            cert: Some(d.join("tls.crt")),
            key: Some(d.join("tls.key")),
            ca: Some(d.join("tls.crt")),
        };
        let provider = rustls::crypto::ring::default_provider();
        let tls = Reloading::from_files("agent", FLAGS, files, AtStart::Refuse, move |f| {
            let (Some(c), Some(k)) = (&f.cert, &f.key) else {
                return Err(TlsError::Verifier("no files".into()));
            };
            crate::tls::certified_key(c, k, &provider)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let serial = |k: &Arc<Arc<rustls::sign::CertifiedKey>>| k.cert[0].as_ref().to_vec();
        let v1 = serial(&tls.current());
        let registry = Arc::new(Registry::new(&[]));
        let names = MetricNames {
            expiry: "test_expiry",
            reloads: "test_reloads_total",
        };
        let drain = Drain::new();
        let mut changes = tls.subscribe();
        changes.borrow_and_update();
        let task = tokio::spawn(tls.clone().follow(registry.clone(), names, drain.clone()));
        let text = registry.render();
        assert_eq!(
            gauge(&text, "cluster-cert").as_deref(),
            Some("2e+09"),
            "{text}"
        );
        assert_eq!(gauge(&text, "cluster-ca-cert").as_deref(), Some("2e+09"));

        swap(d, "v2");
        let changed = tokio::time::timeout(Duration::from_secs(20), changes.changed());
        assert!(changed.await.is_ok(), "the v2 swap was never picked up");
        let v2 = serial(&tls.current());
        assert_ne!(v1, v2);
        let want_v2 = std::fs::read(d.join("v2/tls.crt")).unwrap_or_default();
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let der = CertificateDer::pem_slice_iter(&want_v2)
            .filter_map(Result::ok)
            .next()
            .map(|c| c.as_ref().to_vec());
        assert_eq!(Some(v2.clone()), der, "the material in use is not v2's");
        let text = registry.render();
        assert_eq!(
            gauge(&text, "cluster-cert").as_deref(),
            Some("2.1e+09"),
            "{text}"
        );

        swap(d, "v3");
        let failed = tokio::time::timeout(Duration::from_secs(20), async {
            while !registry
                .render()
                .contains("test_reloads_total{result=\"failure\",tls=\"agent\"} 1")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert!(failed.await.is_ok(), "{}", registry.render());
        assert_eq!(
            serial(&tls.current()),
            v2,
            "a broken file replaced good material"
        );
        assert_eq!(
            gauge(&registry.render(), "cluster-cert").as_deref(),
            Some("2.1e+09")
        );

        // An expired pair that loads fine is refused all the same.
        issue(d, "v4", 1_000_000_000);
        swap(d, "v4");
        let failed = tokio::time::timeout(Duration::from_secs(20), async {
            while !registry
                .render()
                .contains("test_reloads_total{result=\"failure\",tls=\"agent\"} 2")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert!(failed.await.is_ok(), "{}", registry.render());
        assert_eq!(
            serial(&tls.current()),
            v2,
            "an expired certificate replaced good material"
        );
        drain.start();
        let _ = drain.shutdown(Duration::ZERO).await;
        assert!(
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_ok()
        );
    }
}
