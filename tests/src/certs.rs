//! A throw-away PKI per test: one CA, server certificates for `localhost` /
//! `127.0.0.1` / `::1`, and client certificates, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

pub struct Pki {
    dir: tempfile::TempDir,
    ca_key: KeyPair,
    ca_params: CertificateParams,
}

/// Paths of one issued certificate and its key.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "test-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        Pki {
            dir,
            ca_key,
            ca_params,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn issue(&self, name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Identity {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*s).try_into().unwrap()),
            })
            .collect();
        params.extended_key_usages = vec![usage];
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let id = Identity {
            cert: self.dir.path().join(format!("{name}.crt")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        std::fs::write(&id.cert, cert.pem()).unwrap();
        std::fs::write(&id.key, key.serialize_pem()).unwrap();
        id
    }

    /// A serving certificate valid for `localhost`, `127.0.0.1`, `::1` and `extra`.
    pub fn server(&self, name: &str, extra: &[&str]) -> Identity {
        let mut sans = vec!["localhost", "127.0.0.1", "::1"];
        sans.extend_from_slice(extra);
        self.issue(name, &sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Identity {
        self.issue(name, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
