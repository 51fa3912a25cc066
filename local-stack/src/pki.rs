//! A throw-away PKI: one CA, serving certificates for `localhost`,
//! `127.0.0.1`, `::1` plus any names, and client certificates, as PEM files
//! in a directory. For the local stack and the tests; never for production.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid name {0:?} for a certificate")]
    Name(String),
}

pub struct Pki {
    dir: PathBuf,
    ca_key: KeyPair,
    ca_params: CertificateParams,
}

/// Paths of one issued certificate and its key.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes a file only its owner may read (0600 from the start, so a key is
/// never readable by others, whatever the umask).
fn write(path: PathBuf, contents: String) -> Result<PathBuf, PkiError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| PkiError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

impl Pki {
    /// Creates a CA in `dir` (which must exist; keep it private: 0700).
    pub fn create(dir: &Path) -> Result<Pki, PkiError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "local-stack-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;
        write(dir.join("ca.crt"), ca.pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_key,
            ca_params,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Writes `<file>.crt` and `<file>.key` for subject `cn` with
    /// organizations `orgs` (Kubernetes reads them as groups).
    fn issue(
        &self,
        file: &str,
        cn: &str,
        orgs: &[&str],
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Identity, PkiError> {
        self.issue_valid(file, cn, orgs, sans, usage, None)
    }

    /// [`Pki::issue`], valid from January 1st of the first year to that of
    /// the second if given.
    fn issue_valid(
        &self,
        file: &str,
        cn: &str,
        orgs: &[&str],
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
        validity: Option<(i32, i32)>,
    ) -> Result<Identity, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        if let Some((from, to)) = validity {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => (*s)
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|_| PkiError::Name((*s).to_string())),
            })
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Identity {
            cert: write(self.dir.join(format!("{file}.crt")), cert.pem())?,
            key: write(self.dir.join(format!("{file}.key")), key.serialize_pem())?,
        })
    }

    /// A serving certificate for `localhost`, `127.0.0.1`, `::1` and `extra`.
    pub fn server(&self, name: &str, extra: &[&str]) -> Result<Identity, PkiError> {
        let mut sans = vec!["localhost", "127.0.0.1", "::1"];
        sans.extend_from_slice(extra);
        self.issue(name, name, &[], &sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// Like [`Pki::server`] (`server`) or [`Pki::client`], but valid only
    /// in 2000 (expired), or only from 2999 (`future`): for tests of what
    /// refuses such certificates.
    pub fn outdated(&self, name: &str, server: bool, future: bool) -> Result<Identity, PkiError> {
        let validity = Some(if future { (2999, 3000) } else { (2000, 2001) });
        let (sans, usage) = if server {
            (
                vec!["localhost", "127.0.0.1", "::1"],
                ExtendedKeyUsagePurpose::ServerAuth,
            )
        } else {
            (vec![], ExtendedKeyUsagePurpose::ClientAuth)
        };
        self.issue_valid(name, name, &[], &sans, usage, validity)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Result<Identity, PkiError> {
        self.issue(name, name, &[], &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate for user `cn` in groups `orgs`, written as `file`.
    pub fn user(&self, file: &str, cn: &str, orgs: &[&str]) -> Result<Identity, PkiError> {
        self.issue(file, cn, orgs, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}
