//! Certificates outside their validity period, found before they are used.
//!
//! rustls (like Go's `tls.LoadX509KeyPair`) loads an expired certificate
//! without a word; every peer then refuses the handshake ("certificate
//! expired") until someone fixes the file. So a certificate file whose
//! certificates are not all valid now, or a CA file none of whose
//! certificates is, is refused like any other bad file: on a hot reload the
//! material loaded before stays in use (see [`crate::tls::reload`]), at
//! start-up it is an error unless the binary's
//! `--allow-expired-certificates` says otherwise.
//!
//! A certificate file's intermediates count as much as its leaf (a peer
//! refuses an expired intermediate too); a CA bundle may carry a retired CA
//! beside the current one, so one valid CA is enough there.

use std::path::Path;

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::tls::{FileFlags, Files, Role};

/// Why a file's certificates cannot be used now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutsideValidity {
    #[error("--{flag} {path}: its certificate {subject:?} expired at {at}; renew it")]
    Expired {
        flag: &'static str,
        path: String,
        subject: String,
        at: String,
    },
    #[error(
        "--{flag} {path}: its certificate {subject:?} is not valid before {at} (is this host's clock right?)"
    )]
    NotYetValid {
        flag: &'static str,
        path: String,
        subject: String,
        at: String,
    },
}

impl OutsideValidity {
    /// Time may cure it: the same files are worth reading again later.
    pub fn not_yet_valid(&self) -> bool {
        matches!(self, OutsideValidity::NotYetValid { .. })
    }
}

/// Checks the certificate and CA files of `files` against `now` (Unix
/// seconds); the error names the flag of the file at fault. Files that
/// cannot be read or parsed are left to the loader, which reports them.
pub fn check(files: &Files, flags: FileFlags, now: i64) -> Result<(), OutsideValidity> {
    if let Some(path) = &files.cert {
        check_file(path, Role::Cert, flags.cert, now)?;
    }
    if let Some(path) = &files.ca {
        check_file(path, Role::Ca, flags.ca, now)?;
    }
    Ok(())
}

/// [`check`] at the current time.
pub fn check_now(files: &Files, flags: FileFlags) -> Result<(), OutsideValidity> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    check(files, flags, now)
}

fn check_file(
    path: &Path,
    role: Role,
    flag: &'static str,
    now: i64,
) -> Result<(), OutsideValidity> {
    let Ok(ders) = crate::tls::load_certs(path) else {
        return Ok(());
    };
    let mut first_problem = None;
    let mut any_valid = false;
    for der in &ders {
        let Ok((_, cert)) = X509Certificate::from_der(der.as_ref()) else {
            continue;
        };
        let v = cert.validity();
        let problem = if v.not_after.timestamp() < now {
            Some(OutsideValidity::Expired {
                flag,
                path: path.display().to_string(),
                subject: cert.subject().to_string(),
                at: v.not_after.to_string(),
            })
        } else if v.not_before.timestamp() > now {
            Some(OutsideValidity::NotYetValid {
                flag,
                path: path.display().to_string(),
                subject: cert.subject().to_string(),
                at: v.not_before.to_string(),
            })
        } else {
            None
        };
        match problem {
            None => any_valid = true,
            Some(p) if first_problem.is_none() => first_problem = Some(p),
            Some(_) => {}
        }
    }
    match (role, first_problem) {
        (_, None) => Ok(()),
        (Role::Ca, Some(_)) if any_valid => Ok(()),
        (_, Some(p)) => Err(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const FLAGS: FileFlags = FileFlags {
        cert: "cluster-cert",
        key: "cluster-key",
        ca: "cluster-ca-cert",
    };

    /// A PEM certificate valid from `from` to `to` (Unix seconds).
    fn pem(from: u64, to: u64) -> String {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        params.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(from);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(to);
        params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("{e}"))
            .pem()
    }

    #[test]
    fn every_certificate_of_a_certificate_file_one_of_a_ca_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
            Some(p)
        };
        let now: u64 = 2_000_000_000;
        let at = now as i64;
        let valid = pem(now - 1000, now + 1000);
        let expired = pem(now - 2000, now - 1000);
        let future = pem(now + 1000, now + 2000);
        let files = |cert: Option<std::path::PathBuf>, ca| Files {
            cert,
            key: None,
            ca,
        };
        let ok = files(
            write("ok.pem", valid.clone()),
            write("ca.pem", valid.clone()),
        );
        assert_eq!(check(&ok, FLAGS, at), Ok(()));

        let old = files(write("old.pem", expired.clone()), None);
        let Err(e) = check(&old, FLAGS, at) else {
            panic!("old: accepted")
        };
        assert!(!e.not_yet_valid());
        let text = e.to_string();
        assert!(text.starts_with("--cluster-cert "), "{text}");
        assert!(text.contains("expired at"), "{text}");

        let early = files(write("early.pem", future.clone()), None);
        let Err(e) = check(&early, FLAGS, at) else {
            panic!("early: accepted")
        };
        assert!(e.not_yet_valid(), "{e}");
        assert!(e.to_string().contains("is not valid before"), "{e}");

        // An expired intermediate behind a valid leaf.
        let chain = files(write("chain.pem", format!("{valid}{expired}")), None);
        assert!(check(&chain, FLAGS, at).is_err());

        // A CA bundle with a retired CA beside the current one is fine; one
        // with nothing valid is not.
        let bundle = files(None, write("bundle.pem", format!("{expired}{valid}")));
        assert_eq!(check(&bundle, FLAGS, at), Ok(()));
        let stale = files(None, write("stale.pem", format!("{expired}{future}")));
        let Err(e) = check(&stale, FLAGS, at) else {
            panic!("stale: accepted")
        };
        assert!(e.to_string().starts_with("--cluster-ca-cert "), "{e}");

        // What the loader reports itself is left to it.
        let broken = files(write("broken.pem", "garbage".into()), None);
        assert_eq!(check(&broken, FLAGS, at), Ok(()));
    }
}
