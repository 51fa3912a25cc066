//! Certificates of X.509 version 1, handled as Go handles them.
//!
//! Client certificates (this file's first half):
//! `openssl x509 -req` without an extensions file makes v1 certificates, and
//! older clusters still carry agent and kube-apiserver client certificates
//! made that way; Go's crypto/x509 verifies them, rustls-webpki refuses them
//! (`UnsupportedCertVersion`). This verifier wraps webpki's: whatever it
//! accepts is accepted as before; a v1 leaf it refused is accepted when it
//! is signed directly by one of the configured CA certificates and valid now
//! (a v1 certificate has no extensions, so there are no usages or
//! constraints to check, as in Go). Certificates are parsed by x509-parser
//! and every signature is checked by webpki's algorithms (ring): nothing
//! cryptographic is written here.
//!
//! Server certificates ([`ExplainV1Servers`]): Go's clients refuse every v1
//! server certificate, because a v1 certificate has no subjectAltName and Go
//! matches the dialled name only against that (upstream's agent logs
//! "x509: certificate relies on legacy Common Name field, use SANs
//! instead"). We refuse them too, with a sentence that says so and what to
//! reissue, instead of webpki's bare `UnsupportedCertVersion`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use x509_parser::prelude::{FromDer, X509Certificate, X509Version};

/// A CA certificate's subject and public key.
#[derive(Debug)]
struct Issuer {
    subject: Vec<u8>,
    spki: Vec<u8>,
}

#[derive(Debug)]
pub struct AcceptV1Leaves {
    inner: Arc<dyn ClientCertVerifier>,
    issuers: Vec<Issuer>,
    algs: WebPkiSupportedAlgorithms,
}

impl AcceptV1Leaves {
    /// Wraps `inner`, trusting v1 leaves issued by one of `cas`.
    pub fn new(
        inner: Arc<dyn ClientCertVerifier>,
        cas: &[CertificateDer<'_>],
        algs: WebPkiSupportedAlgorithms,
    ) -> Self {
        let issuers = cas
            .iter()
            .filter_map(|c| X509Certificate::from_der(c.as_ref()).ok())
            .map(|(_, c)| Issuer {
                subject: c.subject().as_raw().to_vec(),
                spki: c.public_key().raw.to_vec(),
            })
            .collect();
        AcceptV1Leaves {
            inner,
            issuers,
            algs,
        }
    }

    fn verify_v1(&self, leaf: &X509Certificate<'_>, now: UnixTime) -> Result<(), Error> {
        valid_at(leaf, now)?;
        let tbs = leaf.tbs_certificate.as_ref();
        let signature = leaf.signature_value.data.as_ref();
        let signed = self
            .issuers
            .iter()
            .filter(|i| i.subject == leaf.issuer().as_raw())
            .any(|i| verify_any(&i.spki, self.algs.all, tbs, signature));
        if signed {
            Ok(())
        } else {
            Err(Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }
}

/// The certificate, if it is an X.509 v1 certificate.
pub fn v1<'a>(cert: &'a CertificateDer<'_>) -> Option<X509Certificate<'a>> {
    let (_, c) = X509Certificate::from_der(cert.as_ref()).ok()?;
    (c.version() == X509Version::V1).then_some(c)
}

/// `Ok` when `now` is within the certificate's validity period.
fn valid_at(cert: &X509Certificate<'_>, now: UnixTime) -> Result<(), Error> {
    let secs = |t: i64| UnixTime::since_unix_epoch(std::time::Duration::from_secs(t.max(0) as u64));
    let now_s = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = cert.validity();
    if now_s < validity.not_before.timestamp() {
        return Err(Error::InvalidCertificate(
            rustls::CertificateError::NotValidYetContext {
                time: now,
                not_before: secs(validity.not_before.timestamp()),
            },
        ));
    }
    if now_s > validity.not_after.timestamp() {
        return Err(Error::InvalidCertificate(
            rustls::CertificateError::ExpiredContext {
                time: now,
                not_after: secs(validity.not_after.timestamp()),
            },
        ));
    }
    Ok(())
}

/// Why a v1 server certificate is refused: one sentence with the remedy.
#[derive(Debug)]
pub struct V1ServerCertificate {
    name: String,
}

impl std::fmt::Display for V1ServerCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it is an X.509 v1 certificate, which has no subjectAltName and so is valid for no name, not {:?} (Go clients refuse it too: \"x509: certificate relies on legacy Common Name field, use SANs instead\"); reissue it as v3 with subjectAltName naming {:?}",
            self.name, self.name
        )
    }
}

impl std::error::Error for V1ServerCertificate {}

/// A server-certificate verifier that refuses v1 certificates as Go does,
/// saying why (see the module docs); everything else is `inner`'s decision.
#[derive(Debug)]
pub struct ExplainV1Servers {
    inner: Arc<dyn ServerCertVerifier>,
}

impl ExplainV1Servers {
    pub fn new(inner: Arc<dyn ServerCertVerifier>) -> Self {
        ExplainV1Servers { inner }
    }
}

impl ServerCertVerifier for ExplainV1Servers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let err = match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(leaf) = v1(end_entity) else {
            return Err(err);
        };
        // Go checks the validity period before the name.
        valid_at(&leaf, now)?;
        Err(Error::InvalidCertificate(rustls::CertificateError::Other(
            rustls::OtherError(Arc::new(V1ServerCertificate {
                name: server_name.to_str().into_owned(),
            })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

/// Whether `signature` over `message` verifies with the key `spki` under one
/// of `algs` (TLS 1.2 and certificate signatures do not pin one algorithm).
fn verify_any(
    spki: &[u8],
    algs: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm],
    message: &[u8],
    signature: &[u8],
) -> bool {
    let spki = SubjectPublicKeyInfoDer::from(spki);
    let Ok(key) = webpki::RawPublicKeyEntity::try_from(&spki) else {
        return false;
    };
    algs.iter()
        .any(|alg| key.verify_signature(*alg, message, signature).is_ok())
}

impl ClientCertVerifier for AcceptV1Leaves {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(v) => Ok(v),
            Err(e) => match v1(end_entity) {
                Some(leaf) => self
                    .verify_v1(&leaf, now)
                    .map(|()| ClientCertVerified::assertion()),
                None => Err(e),
            },
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let Some(leaf) = v1(cert) else {
            return self.inner.verify_tls12_signature(message, cert, dss);
        };
        let algs = self
            .algs
            .mapping
            .iter()
            .find(|(s, _)| *s == dss.scheme)
            .map(|(_, a)| *a)
            .unwrap_or(&[]);
        if verify_any(leaf.public_key().raw, algs, message, dss.signature()) {
            Ok(HandshakeSignatureValid::assertion())
        } else {
            Err(Error::InvalidCertificate(
                rustls::CertificateError::BadSignature,
            ))
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let Some(leaf) = v1(cert) else {
            return self.inner.verify_tls13_signature(message, cert, dss);
        };
        // TLS 1.3 allows no PKCS#1 v1.5 or SHA-1 signatures in the handshake.
        use SignatureScheme as S;
        let tls13 = matches!(
            dss.scheme,
            S::RSA_PSS_SHA256
                | S::RSA_PSS_SHA384
                | S::RSA_PSS_SHA512
                | S::ECDSA_NISTP256_SHA256
                | S::ECDSA_NISTP384_SHA384
                | S::ECDSA_NISTP521_SHA512
                | S::ED25519
                | S::ED448
        );
        if !tls13 {
            return Err(rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into());
        }
        // TLS 1.3 pins one algorithm per scheme: the first of its mapping.
        let alg = self
            .algs
            .mapping
            .iter()
            .find(|(s, _)| *s == dss.scheme)
            .and_then(|(_, a)| a.first().copied());
        match alg {
            Some(alg) if verify_any(leaf.public_key().raw, &[alg], message, dss.signature()) => {
                Ok(HandshakeSignatureValid::assertion())
            }
            _ => Err(Error::InvalidCertificate(
                rustls::CertificateError::BadSignature,
            )),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
