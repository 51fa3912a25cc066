//! rustls configuration from PEM files and Go-spelled TLS policy flags
//! (`--tls-min-version=VersionTLS12`, `--cipher-suites=TLS_ECDHE_…`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedCipherSuite};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key found")]
    NoKey { path: PathBuf },
    #[error("{path}: unusable private key: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("{key} is not the private key of the certificate in {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{path}: unreadable certificate: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{path}: invalid CA certificate: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error(
        "unsupported TLS version {0:?}, supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
    )]
    Version(String),
    #[error("cipher suite {0} not supported or doesn't exist")]
    Cipher(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

/// The TLS policy flags shared by every listener of a binary.
#[derive(Debug, Clone, Default)]
pub struct TlsPolicy {
    tls13_only: bool,
    /// Empty means the provider's defaults.
    suites: Vec<SupportedCipherSuite>,
}

/// Go cipher-suite names (as listed by Go's `tls.CipherSuites()`) and the rustls
/// suite each one is. `None`: a name Go accepts but rustls does not implement
/// (the CBC suites); those are skipped with a warning.
const GO_SUITES: &[(&str, Option<SupportedCipherSuite>)] = {
    use rustls::crypto::ring::cipher_suite as cs;
    &[
        ("TLS_AES_128_GCM_SHA256", Some(cs::TLS13_AES_128_GCM_SHA256)),
        ("TLS_AES_256_GCM_SHA384", Some(cs::TLS13_AES_256_GCM_SHA384)),
        (
            "TLS_CHACHA20_POLY1305_SHA256",
            Some(cs::TLS13_CHACHA20_POLY1305_SHA256),
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            Some(cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            Some(cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            Some(cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            Some(cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            Some(cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            Some(cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            Some(cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
            Some(cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
        ),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", None),
        ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", None),
        ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", None),
        ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", None),
    ]
};

impl TlsPolicy {
    /// Builds the policy from `--tls-min-version` and `--cipher-suites`.
    /// TLS 1.0 and 1.1 are accepted for compatibility but rustls never offers
    /// them, so they behave as 1.2.
    pub fn from_flags(min_version: &str, cipher_suites: &[String]) -> Result<Self, TlsError> {
        let tls13_only = match min_version {
            "" | "VersionTLS10" | "VersionTLS11" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            other => return Err(TlsError::Version(other.to_string())),
        };
        let mut suites = Vec::new();
        for name in cipher_suites {
            match GO_SUITES.iter().find(|(n, _)| n == name) {
                Some((_, Some(s))) => {
                    if !suites.contains(s) {
                        suites.push(*s)
                    }
                }
                Some((_, None)) => {
                    tracing::warn!(cipher = %name, "cipher suite not implemented by rustls; skipped")
                }
                None => return Err(TlsError::Cipher(name.clone())),
            }
        }
        if !suites.is_empty() {
            // Go never lets TLS 1.3 suites be configured; keep them all available.
            for s in rustls::crypto::ring::DEFAULT_CIPHER_SUITES {
                if s.tls13().is_some() && !suites.contains(s) {
                    suites.push(*s);
                }
            }
        }
        Ok(TlsPolicy { tls13_only, suites })
    }

    fn provider(&self) -> Arc<CryptoProvider> {
        let mut p = rustls::crypto::ring::default_provider();
        if !self.suites.is_empty() {
            p.cipher_suites = self.suites.clone();
        }
        Arc::new(p)
    }

    fn versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        if self.tls13_only {
            TLS13_ONLY
        } else {
            rustls::DEFAULT_VERSIONS
        }
    }
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// Bytes one read of a TLS link's socket may take.
pub const LINK_READ_BUFFER: usize = 64 << 10;

/// A read buffer under a long-lived TLS link that carries many tunnels (the
/// server–agent connection). rustls asks its transport for at most 4 KiB
/// more than it already holds, so a 16 KiB record takes up to four `recv`
/// calls. Serving them from one 64 KiB read cut the receive calls of the
/// server and agent in a 512 MiB gRPC download from 52 k to 21 k
/// (BENCHMARKS.md, P1). Writes pass straight through. 64 KiB per link is
/// nothing beside the link's HTTP/2 windows, but too much for per-tunnel
/// connections, which must not use this.
pub fn read_buffered<IO: tokio::io::AsyncRead>(io: IO) -> tokio::io::BufReader<IO> {
    tokio::io::BufReader::with_capacity(LINK_READ_BUFFER, io)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// All certificates in a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_path_buf(),
        })
}

/// A root store with every certificate of a CA bundle.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::BadCa {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// A server configuration; with `client_ca`, clients must present a
/// certificate signed by it (Go's `RequireAndVerifyClientCert`).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    policy: &TlsPolicy,
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let provider = policy.provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(policy.versions())?;
    let builder = match client_ca {
        Some(ca) => {
            let algs = provider.signature_verification_algorithms;
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(load_roots(ca)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
            // Go verifies X.509 v1 client certificates; webpki alone does not.
            let verifier = crate::x509v1::AcceptV1Leaves::new(verifier, &load_certs(ca)?, algs);
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
        None => builder.with_no_client_auth(),
    };
    let identity = certified_key(cert, key, &provider)?;
    let mut config = builder.with_cert_resolver(Arc::new(OneCert(identity)));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The certificate chain in `cert` with the key in `key`, checked to belong
/// together. Unlike rustls's own check this accepts X.509 v1 certificates,
/// as Go does (see [`crate::x509v1`]).
pub fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let signing = provider
        .key_provider
        .load_private_key(load_key(key)?)
        .map_err(|e| TlsError::BadKey {
            path: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    let leaf = chain.first().ok_or_else(|| TlsError::NoCertificate {
        path: cert.to_path_buf(),
    })?;
    let (_, parsed) =
        <x509_parser::prelude::X509Certificate<'_> as x509_parser::prelude::FromDer<'_, _>>::from_der(
            leaf.as_ref(),
        )
        .map_err(|e| TlsError::BadCertificate {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })?;
    if let Some(public) = signing.public_key()
        && public.as_ref() != parsed.public_key().raw
    {
        return Err(TlsError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        });
    }
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Presents one certificate, whatever the peer asks for.
#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl rustls::client::ResolvesClientCert for OneCert {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client configuration trusting `ca`, presenting `identity` (cert, key) if given.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[Vec<u8>],
) -> Result<ClientConfig, TlsError> {
    client_config_for(ca, identity, alpn, rustls::DEFAULT_VERSIONS)
}

/// [`client_config`] limited to some TLS versions.
pub fn client_config_for(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[Vec<u8>],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?
        .with_root_certificates(load_roots(ca)?);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_cert_resolver(Arc::new(OneCert(certified_key(cert, key, &provider)?))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_accepts_go_names() {
        let p = TlsPolicy::from_flags(
            "VersionTLS12",
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA".into(),
            ],
        );
        let p = p.unwrap_or_default();
        // The GCM suite plus every TLS 1.3 suite; the CBC one is skipped.
        assert!(p.suites.iter().any(|s| s.tls13().is_none()));
        assert_eq!(p.suites.iter().filter(|s| s.tls13().is_none()).count(), 1);
        assert!(TlsPolicy::from_flags("VersionTLS13", &[]).is_ok_and(|p| p.tls13_only));
    }

    #[test]
    fn policy_rejects_unknown_names() {
        assert!(matches!(
            TlsPolicy::from_flags("TLS1.2", &[]),
            Err(TlsError::Version(_))
        ));
        assert!(matches!(
            TlsPolicy::from_flags("", &["TLS_FANCY".into()]),
            Err(TlsError::Cipher(_))
        ));
    }

    #[test]
    fn loads_pem_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .and_then(|p| p.self_signed(&key))
            .unwrap_or_else(|e| panic!("{e}"));
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&k, key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        assert!(server_config(&c, &k, Some(&c), &TlsPolicy::default(), &[b"h2"]).is_ok());
        assert!(client_config(&c, Some((&c, &k)), &[]).is_ok());
        assert!(matches!(load_key(&c), Err(TlsError::NoKey { .. })));
        assert!(matches!(
            load_certs(&dir.path().join("missing")),
            Err(TlsError::Read { .. })
        ));
    }
}
