//! rustls configuration from PEM files and Go-spelled TLS policy flags
//! (`--tls-min-version=VersionTLS12`, `--cipher-suites=TLS_ECDHE_…`).

mod metrics;
pub mod reload;
pub mod validity;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedCipherSuite};

/// Which file of a TLS configuration an error is about; [`TlsError::naming`]
/// turns it into the flag that named the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Cert,
    Key,
    Ca,
}

/// The flags that name a binary's certificate, key and CA files, so that an
/// error can say which flag to fix (e.g. `--cluster-cert`).
#[derive(Debug, Clone, Copy)]
pub struct FileFlags {
    pub cert: &'static str,
    pub key: &'static str,
    pub ca: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read it: {source}")]
    Read {
        role: Role,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { role: Role, path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
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
        "--tls-min-version {0:?} is not a TLS version; supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
    )]
    Version(String),
    #[error("--cipher-suites: cipher suite {0} not supported or doesn't exist")]
    Cipher(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

impl TlsError {
    /// The error as one sentence naming the flag that gave each file, e.g.
    /// `--cluster-key /k.pem is not the private key of the certificate in
    /// --cluster-cert /c.pem`.
    pub fn naming(&self, flags: FileFlags) -> String {
        let flag = |role: Role| match role {
            Role::Cert => flags.cert,
            Role::Key => flags.key,
            Role::Ca => flags.ca,
        };
        let at = |role: Role, path: &Path| format!("--{} {}", flag(role), path.display());
        match self {
            TlsError::Read { role, path, source }
                if source.kind() == std::io::ErrorKind::IsADirectory =>
            {
                format!(
                    "{} is a directory; it must name a PEM file",
                    at(*role, path)
                )
            }
            TlsError::Read { role, path, source } => {
                format!(
                    "{}: cannot read it: {}",
                    at(*role, path),
                    go_compat::errors::io_reason(source)
                )
            }
            TlsError::NoCertificate { role, path } => format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                at(*role, path)
            ),
            TlsError::NoKey { path } => format!(
                "{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                at(Role::Key, path)
            ),
            TlsError::BadKey { path, reason } => {
                format!("{}: unusable private key: {reason}", at(Role::Key, path))
            }
            TlsError::KeyMismatch { cert, key } => format!(
                "{} is not the private key of the certificate in {}; give the key the certificate was issued for",
                at(Role::Key, key),
                at(Role::Cert, cert)
            ),
            TlsError::BadCertificate { path, reason } => {
                format!("{}: unreadable certificate: {reason}", at(Role::Cert, path))
            }
            TlsError::BadCa { path, reason } => {
                format!("{}: invalid CA certificate: {reason}", at(Role::Ca, path))
            }
            other => other.to_string(),
        }
    }
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

fn read(role: Role, path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::file_watch::read_bounded(path, crate::limits::MAX_PEM_FILE).map_err(|source| {
        TlsError::Read {
            role,
            path: path.to_path_buf(),
            source,
        }
    })
}

/// All certificates in a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    load_certs_as(Role::Cert, path)
}

fn load_certs_as(role: Role, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(role, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            role,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(Role::Key, path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .ok()
        .ok_or_else(|| TlsError::NoKey {
            path: path.to_path_buf(),
        })
}

/// A root store with every certificate of a CA bundle. A CERTIFICATE block
/// that is not a certificate refuses the whole bundle (as upstream after
/// v0.36.0, #902), naming which block.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let certs = load_certs_as(Role::Ca, path)?;
    let n = certs.len();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| TlsError::BadCa {
            path: path.to_path_buf(),
            reason: format!(
                "CERTIFICATE block {} of {n} is not an X.509 certificate ({})",
                i + 1,
                match e {
                    rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding) => {
                        "its DER does not decode".to_string()
                    }
                    other => other.to_string(),
                }
            ),
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
            let verifier = go_compat::x509v1::AcceptV1Leaves::new(
                verifier,
                &load_certs_as(Role::Ca, ca)?,
                algs,
            );
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
        None => builder.with_no_client_auth(),
    };
    let identity = certified_key(cert, key, &provider)?;
    if identity
        .cert
        .first()
        .and_then(go_compat::x509v1::v1)
        .is_some()
    {
        tracing::warn!(
            cert = %cert.display(),
            "this server certificate is X.509 v1: it has no subjectAltName, so clients that check the server's name (proxy-agent, kube-apiserver; upstream's too) will refuse it; reissue it as v3 with subjectAltName"
        );
    }
    let mut config = builder.with_cert_resolver(Arc::new(OneCert(identity)));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The certificate chain in `cert` with the key in `key`, checked to belong
/// together. Unlike rustls's own check this accepts X.509 v1 certificates,
/// as Go does (see [`go_compat::x509v1`]).
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
        role: Role::Cert,
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
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(load_roots(ca)?),
        provider.clone(),
    )
    .build()
    .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(go_compat::x509v1::ExplainV1Servers::new(
            verifier,
        )));
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_cert_resolver(Arc::new(OneCert(certified_key(cert, key, &provider)?))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// A TLS failure as one plain sentence. rustls renders many of its errors
/// with `Debug` (`invalid peer certificate: Other(OtherError(UnknownIssuer))`),
/// which is no help to whoever has to fix the certificate.
pub fn explain(e: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(c) => {
            let why = match c {
                C::UnknownIssuer => {
                    "it is not signed by a trusted CA (certificate signed by unknown authority)"
                        .to_string()
                }
                C::BadSignature => "it is not signed by a trusted CA (its signature does not verify with the key of the trusted CA of that name)".into(),
                C::BadEncoding => "it is not a well-formed X.509 certificate".into(),
                C::Expired => "it has expired".into(),
                C::NotValidYet => "it is not valid yet".into(),
                C::Revoked => "it has been revoked".into(),
                C::NotValidForName => "it is not valid for the name dialled".into(),
                C::InvalidPurpose => {
                    "its extended key usage does not allow this use".into()
                }
                C::UnhandledCriticalExtension => {
                    "it has a critical extension that is not understood".into()
                }
                C::Other(o) => words(&o.to_string()),
                other => other.to_string(),
            };
            format!("the peer's certificate was refused: {why}")
        }
        E::AlertReceived(a) => {
            let refused = matches!(
                a,
                A::BadCertificate
                    | A::CertificateUnknown
                    | A::UnknownCA
                    | A::CertificateRequired
                    | A::CertificateExpired
                    | A::CertificateRevoked
                    | A::UnsupportedCertificate
                    | A::AccessDenied
            );
            let alert = words(&format!("{a:?}"));
            if refused {
                format!("the peer refused our certificate (TLS alert: {alert})")
            } else {
                format!("the peer ended the handshake (TLS alert: {alert})")
            }
        }
        E::NoCertificatesPresented => "the peer presented no certificate".into(),
        E::InvalidMessage(m) => format!(
            "the peer does not speak TLS or sent a malformed message ({})",
            words(&format!("{m:?}"))
        ),
        E::PeerIncompatible(p) => format!(
            "the peer's TLS settings are incompatible with ours ({})",
            words(&format!("{p:?}"))
        ),
        E::PeerMisbehaved(p) => format!(
            "the peer broke the TLS protocol ({})",
            words(&format!("{p:?}"))
        ),
        E::NoApplicationProtocol => "the peer offers no ALPN protocol we speak".into(),
        E::General(s) => s.clone(),
        other => words(&format!("{other:?}")),
    }
}

/// The first identifier of a `Debug` rendering, in lower-case words:
/// `UnsupportedCertVersion` -> "unsupported cert version". Wrappers
/// (`Other(OtherError(...))`) are looked through; fields are dropped.
fn words(debug: &str) -> String {
    let ident = debug
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .find(|w| !w.is_empty() && !matches!(*w, "Other" | "OtherError"))
        .unwrap_or(debug);
    if !ident.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
        return debug.to_string();
    }
    // A capital starts a word unless it continues an acronym: `UnknownCA`
    // is "unknown ca", `HTTPSProxy` "https proxy".
    let chars: Vec<char> = ident.chars().collect();
    let mut out = String::new();
    for (i, ch) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).and_then(|p| chars.get(p));
        let next = chars.get(i + 1);
        if ch.is_ascii_uppercase()
            && prev.is_some_and(|p| {
                p.is_ascii_lowercase()
                    || (p.is_ascii_uppercase() && next.is_some_and(char::is_ascii_lowercase))
            })
        {
            out.push(' ');
        }
        out.push(ch.to_ascii_lowercase());
    }
    out
}

/// The rustls error somewhere in `e`'s chain of sources, looking inside
/// `io::Error`s (which is how tokio-rustls and hyper pass it on).
pub fn find_rustls_error<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        cur = err.source();
    }
    None
}

/// A client TLS stream that keeps the first TLS error a read returned. In
/// TLS 1.3 a server refuses a client certificate only after the client
/// finished its handshake, so the alert arrives on a later read, inside
/// whatever protocol runs on top (hyper reports just "connection closed").
pub struct NoteTlsError<IO> {
    io: IO,
    seen: Arc<std::sync::OnceLock<String>>,
}

impl<IO> NoteTlsError<IO> {
    /// Wraps `io`; `seen` receives [`explain`]'s sentence for the first TLS error.
    pub fn new(io: IO, seen: Arc<std::sync::OnceLock<String>>) -> Self {
        NoteTlsError { io, seen }
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for NoteTlsError<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if let std::task::Poll::Ready(Err(e)) = &r
            && let Some(t) = find_rustls_error(e)
        {
            let _ = self.seen.set(explain(t));
        }
        r
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for NoteTlsError<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The files one TLS configuration is built from.
#[derive(Debug, Clone, Default)]
pub struct Files {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
}

impl Files {
    pub(crate) fn each(&self) -> impl Iterator<Item = (Role, &PathBuf)> {
        [
            (Role::Cert, self.cert.as_ref()),
            (Role::Key, self.key.as_ref()),
            (Role::Ca, self.ca.as_ref()),
        ]
        .into_iter()
        .filter_map(|(r, p)| p.map(|p| (r, p)))
    }
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
    fn explains_tls_errors_in_words() {
        use rustls::{AlertDescription, CertificateError, Error, OtherError};
        let other = Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
            webpki::Error::UnsupportedCertVersion,
        ))));
        assert_eq!(
            explain(&other),
            "the peer's certificate was refused: unsupported cert version"
        );
        assert_eq!(
            explain(&Error::AlertReceived(AlertDescription::UnknownCA)),
            "the peer refused our certificate (TLS alert: unknown ca)"
        );
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let found = find_rustls_error(&io).map(explain).unwrap_or_default();
        assert!(found.contains("not signed by a trusted CA"), "{found}");
    }

    #[test]
    fn names_the_flags_of_the_files() {
        let flags = FileFlags {
            cert: "cluster-cert",
            key: "cluster-key",
            ca: "cluster-ca-cert",
        };
        let e = TlsError::KeyMismatch {
            cert: "/c.pem".into(),
            key: "/k.pem".into(),
        };
        assert!(e.naming(flags).starts_with(
            "--cluster-key /k.pem is not the private key of the certificate in --cluster-cert /c.pem"
        ));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let e = load_roots(dir.path()).err().map(|e| e.naming(flags));
        assert_eq!(
            e,
            Some(format!(
                "--cluster-ca-cert {} is a directory; it must name a PEM file",
                dir.path().display()
            ))
        );
    }

    /// Upstream after v0.36.0 (#902) refuses a CA bundle holding a
    /// CERTIFICATE block that is not a certificate, where v0.36.0 loaded
    /// the rest and went on; blocks of other types are ignored, and text
    /// that never forms a PEM block (cut short, bad base64) is skipped, as
    /// client-go's `cert.NewPool` does.
    #[test]
    fn a_ca_bundle_with_a_malformed_certificate_block_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut params =
            rcgen::CertificateParams::new(Vec::new()).unwrap_or_else(|e| panic!("{e}"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}"));
        // Bodies in base64: "not a DER-encoded certificate", "not a private key".
        let pem_block = |kind: &str, base64: &str| {
            format!("-----BEGIN {kind}-----\n{base64}\n-----END {kind}-----\n")
        };
        let bundle = |extra: &str| {
            let path = dir.path().join("ca.crt");
            std::fs::write(&path, format!("{}{extra}", ca.pem())).unwrap_or_else(|e| panic!("{e}"));
            path
        };
        let flags = FileFlags {
            cert: "agent-cert",
            key: "agent-key",
            ca: "ca-cert",
        };
        let malformed = bundle(&pem_block(
            "CERTIFICATE",
            "bm90IGEgREVSLWVuY29kZWQgY2VydGlmaWNhdGU=",
        ));
        let e = load_roots(&malformed).err().map(|e| e.naming(flags));
        let e = e.unwrap_or_else(|| panic!("a malformed CERTIFICATE block was loaded"));
        assert_eq!(
            e,
            format!(
                "--ca-cert {}: invalid CA certificate: CERTIFICATE block 2 of 2 is not an X.509 certificate (its DER does not decode)",
                malformed.display()
            )
        );
        for (what, extra) in [
            ("valid bundle", String::new()),
            (
                "a block of another type",
                pem_block("PRIVATE KEY", "bm90IGEgcHJpdmF0ZSBrZXk="),
            ),
            (
                "a block cut short",
                "-----BEGIN CERTIFICATE-----\nMIIBtruncated\n".to_string(),
            ),
            (
                "a block whose base64 is broken",
                "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_string(),
            ),
        ] {
            let roots = load_roots(&bundle(&extra)).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(roots.len(), 1, "{what}");
        }
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
