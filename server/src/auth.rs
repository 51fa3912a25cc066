//! Agent authentication by ServiceAccount token, as upstream's
//! `--agent-namespace`/`--agent-service-account`/`--authentication-audience`:
//! the agent sends `authorization: Bearer <token>`, the server asks the
//! apiserver (TokenReview, with the audience) who it is, and accepts only
//! `system:serviceaccount:<namespace>:<service-account>`.
//!
//! Unlike upstream, reviews are cached per token (keyed by its SHA-256): an
//! accepted token until the expiry written in it (at most [`MAX_ACCEPT_TTL`]),
//! a rejected one for [`REJECT_TTL`]. Concurrent reconnects with one token
//! share one review. A reconnect storm of N agents therefore costs N reviews,
//! not N per retry (kubernetes #102784). Reviews are also rate-limited like
//! client-go (`--kubeconfig-qps`/`--kubeconfig-burst`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use konnectivity_proto::header;
use parking_lot::Mutex;
use tonic::Status;

/// Longest an accepted review is trusted, whatever the token's expiry.
pub const MAX_ACCEPT_TTL: Duration = Duration::from_secs(3600);
/// How long a rejected token stays rejected without asking again.
pub const REJECT_TTL: Duration = Duration::from_secs(10);
/// Cache entries kept at most; expired ones are pruned first.
const MAX_ENTRIES: usize = 10_000;
/// Deadline for one TokenReview call.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The token-authentication flags.
#[derive(Debug, Clone)]
pub struct TokenAuthConfig {
    pub namespace: String,
    pub service_account: String,
    pub audience: String,
    /// Empty: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// client-go semantics: 0 means 5 requests/s with a burst of 10.
    pub qps: f64,
    pub burst: u32,
}

/// What the apiserver said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    pub authenticated: bool,
    pub username: String,
    pub error: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("kubernetes client configuration: {0}")]
    Config(String),
}

/// Asks the apiserver about a token; a trait so the cache can be tested
/// without one.
pub trait Reviewer: Send + Sync {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<Review, String>>;
}

/// TokenReview through kube-rs.
pub struct KubeReviewer {
    client: kube::Client,
}

impl Reviewer for KubeReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<Review, String>> {
        Box::pin(async move {
            let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
            let request = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: Some(vec![audience.to_string()]),
                },
                ..Default::default()
            };
            let params = kube::api::PostParams::default();
            let call = api.create(&params, &request);
            let r = tokio::time::timeout(REVIEW_TIMEOUT, call)
                .await
                .map_err(|_| format!("TokenReview timed out after {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            let status = r.status.unwrap_or_default();
            Ok(Review {
                authenticated: status.authenticated.unwrap_or(false),
                username: status.user.and_then(|u| u.username).unwrap_or_default(),
                error: status.error.unwrap_or_default(),
            })
        })
    }
}

/// Builds a kube client from a kubeconfig path, or the in-cluster
/// configuration when there is none.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, AuthError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| AuthError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| AuthError::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::incluster().map_err(|e| AuthError::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| AuthError::Config(e.to_string()))
}

type Key = [u8; 32];

#[derive(Clone)]
enum Outcome {
    Accepted,
    Rejected(String),
}

#[derive(Default)]
struct Slot {
    /// Cached outcome and until when it holds.
    done: Option<(Outcome, Instant)>,
}

/// A token bucket with client-go's defaults.
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Self {
        let qps = if qps > 0.0 { qps } else { 5.0 };
        let burst = if burst > 0 { f64::from(burst) } else { 10.0 };
        Bucket {
            qps,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token; returns how long to wait before using it.
    fn take(&mut self) -> Duration {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.qps).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

pub struct TokenAuthenticator {
    reviewer: Arc<dyn Reviewer>,
    namespace: String,
    service_account: String,
    audience: String,
    slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Slot>>>>,
    bucket: Mutex<Bucket>,
    reviews: std::sync::atomic::AtomicU64,
}

impl TokenAuthenticator {
    pub async fn from_config(cfg: &TokenAuthConfig) -> Result<Self, AuthError> {
        let client = kube_client(cfg.kubeconfig.as_deref()).await?;
        Ok(Self::new(cfg, Arc::new(KubeReviewer { client })))
    }

    pub fn new(cfg: &TokenAuthConfig, reviewer: Arc<dyn Reviewer>) -> Self {
        TokenAuthenticator {
            reviewer,
            namespace: cfg.namespace.clone(),
            service_account: cfg.service_account.clone(),
            audience: cfg.audience.clone(),
            slots: Mutex::new(HashMap::new()),
            bucket: Mutex::new(Bucket::new(cfg.qps, cfg.burst)),
            reviews: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// TokenReviews sent so far.
    pub fn reviews_sent(&self) -> u64 {
        self.reviews.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checks the `authorization` metadata of an agent stream. Errors read as
    /// upstream's, as gRPC `Unknown`.
    pub async fn authenticate(&self, md: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let values: Vec<_> = md.get_all(header::AUTHORIZATION).iter().collect();
        let value = match values.as_slice() {
            [] => {
                return Err(Status::unknown(
                    "Authentication context was not found in metadata",
                ));
            }
            [one] => one
                .to_str()
                .map_err(|_| Status::unknown("authorization metadata is not valid text"))?,
            many => {
                return Err(Status::unknown(format!(
                    "too many ({}) tokens are received",
                    many.len()
                )));
            }
        };
        let Some(token) = value.strip_prefix("Bearer ") else {
            return Err(Status::unknown(
                "received token does not have \"Bearer \" prefix",
            ));
        };
        match self.check(token).await {
            Ok(()) => Ok(()),
            Err(reason) => Err(Status::unknown(format!(
                "Failed to validate authentication token, err:{reason}"
            ))),
        }
    }

    /// Validates one token, from the cache when possible.
    pub async fn check(&self, token: &str) -> Result<(), String> {
        let key = digest(token);
        let slot = {
            let mut slots = self.slots.lock();
            if slots.len() >= MAX_ENTRIES && !slots.contains_key(&key) {
                prune(&mut slots);
            }
            slots.entry(key).or_default().clone()
        };
        // One review per token at a time; waiters then read its result.
        let mut slot = slot.lock().await;
        if let Some((outcome, until)) = &slot.done
            && Instant::now() < *until
        {
            return match outcome {
                Outcome::Accepted => Ok(()),
                Outcome::Rejected(r) => Err(r.clone()),
            };
        }
        let wait = self.bucket.lock().take();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        self.reviews
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let review = self
            .reviewer
            .review(token, &self.audience)
            .await
            // Not cached: the apiserver may be back on the next attempt.
            .map_err(|e| format!("Failed to authenticate request. err:{e}"))?;
        let now = Instant::now();
        match self.judge(&review) {
            Ok(username) => {
                let ttl = token_lifetime(token, SystemTime::now())
                    .map_or(MAX_ACCEPT_TTL, |t| t.min(MAX_ACCEPT_TTL));
                tracing::debug!(%username, cached_for = ?ttl, "agent token accepted");
                slot.done = Some((Outcome::Accepted, now + ttl));
                Ok(())
            }
            Err(reason) => {
                slot.done = Some((Outcome::Rejected(reason.clone()), now + REJECT_TTL));
                Err(reason)
            }
        }
    }

    /// Upstream's rules on a review's result; returns the username.
    fn judge(&self, r: &Review) -> Result<String, String> {
        if !r.error.is_empty() {
            return Err(format!("lookup failed: {}", r.error));
        }
        if !r.authenticated {
            return Err("lookup failed: service account jwt not valid".into());
        }
        let parts: Vec<&str> = r.username.split(':').collect();
        let [system, kind, ns, sa] = parts.as_slice() else {
            return Err("lookup failed: unexpected username format".into());
        };
        if *system != "system" || *kind != "serviceaccount" {
            return Err("lookup failed: username returned is not a service account".into());
        }
        if *ns != self.namespace {
            return Err(format!(
                "lookup failed: incoming request from {ns:?} namespace. Expected {:?}",
                self.namespace
            ));
        }
        if *sa != self.service_account {
            return Err(format!(
                "lookup failed: incoming request from {sa:?} service account. Expected {:?}",
                self.service_account
            ));
        }
        Ok(r.username.clone())
    }
}

fn digest(token: &str) -> Key {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

/// Drops entries whose outcome has expired and that nobody is using; if
/// that is not enough, drops everything not in use.
fn prune(slots: &mut HashMap<Key, Arc<tokio::sync::Mutex<Slot>>>) {
    let now = Instant::now();
    let stale = |s: &Arc<tokio::sync::Mutex<Slot>>| {
        Arc::strong_count(s) == 1
            && s.try_lock()
                .map(|g| g.done.as_ref().is_none_or(|(_, until)| *until <= now))
                .unwrap_or(false)
    };
    slots.retain(|_, s| !stale(s));
    if slots.len() >= MAX_ENTRIES {
        slots.retain(|_, s| Arc::strong_count(s) > 1);
    }
}

/// Time left until the `exp` claim of a JWT, read without verifying it (the
/// apiserver has just verified it). `None` when there is no readable `exp`
/// (legacy tokens never expire).
pub fn token_lifetime(token: &str, now: SystemTime) -> Option<Duration> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    Some(Duration::from_secs_f64((exp - now).max(0.0)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        calls: AtomicUsize,
        answer: Review,
        delay: Duration,
    }

    impl Reviewer for Fake {
        fn review<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Review, String>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                Ok(self.answer.clone())
            })
        }
    }

    fn cfg() -> TokenAuthConfig {
        TokenAuthConfig {
            namespace: "kube-system".into(),
            service_account: "konnectivity-agent".into(),
            audience: "system:konnectivity-server".into(),
            kubeconfig: None,
            qps: 0.0,
            burst: 0,
        }
    }

    fn fake(username: &str, authenticated: bool) -> Arc<Fake> {
        Arc::new(Fake {
            calls: AtomicUsize::new(0),
            answer: Review {
                authenticated,
                username: username.into(),
                error: String::new(),
            },
            delay: Duration::from_millis(20),
        })
    }

    fn jwt(exp: u64) -> String {
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            b.encode(r#"{"alg":"none"}"#),
            b.encode(format!(r#"{{"exp":{exp}}}"#))
        )
    }

    #[tokio::test]
    async fn concurrent_checks_of_one_token_share_one_review() {
        let f = fake("system:serviceaccount:kube-system:konnectivity-agent", true);
        let auth = Arc::new(TokenAuthenticator::new(&cfg(), f.clone()));
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let token = jwt(exp);
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let (a, t) = (auth.clone(), token.clone());
                tokio::spawn(async move { a.check(&t).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(f.calls.load(Ordering::SeqCst), 1);
        auth.check(&jwt(exp + 1)).await.unwrap();
        assert_eq!(f.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn wrong_account_and_namespace_are_rejected_and_remembered() {
        for (user, want) in [
            ("system:serviceaccount:kube-system:other", "service account"),
            (
                "system:serviceaccount:default:konnectivity-agent",
                "namespace",
            ),
            (
                "system:other:kube-system:konnectivity-agent",
                "not a service account",
            ),
            ("admin", "unexpected username format"),
        ] {
            let f = fake(user, true);
            let auth = TokenAuthenticator::new(&cfg(), f.clone());
            let e = auth.check("t").await.unwrap_err();
            assert!(e.contains(want), "{user}: {e}");
            assert!(auth.check("t").await.is_err());
            assert_eq!(f.calls.load(Ordering::SeqCst), 1);
        }
        let f = fake("", false);
        let auth = TokenAuthenticator::new(&cfg(), f);
        assert_eq!(
            auth.check("t").await.unwrap_err(),
            "lookup failed: service account jwt not valid"
        );
    }

    #[tokio::test]
    async fn metadata_errors_match_upstream() {
        let auth = TokenAuthenticator::new(&cfg(), fake("x", false));
        let mut md = tonic::metadata::MetadataMap::new();
        let e = auth.authenticate(&md).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unknown);
        assert_eq!(
            e.message(),
            "Authentication context was not found in metadata"
        );
        md.insert("authorization", "Basic abc".parse().unwrap());
        let e = auth.authenticate(&md).await.unwrap_err();
        assert!(
            e.message().contains("\"Bearer \" prefix"),
            "{}",
            e.message()
        );
        md.append("authorization", "Bearer x".parse().unwrap());
        let e = auth.authenticate(&md).await.unwrap_err();
        assert_eq!(e.message(), "too many (2) tokens are received");
    }

    #[test]
    fn lifetime_comes_from_exp() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            token_lifetime(&jwt(1_060), now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(token_lifetime(&jwt(900), now), Some(Duration::ZERO));
        assert_eq!(token_lifetime("opaque", now), None);
    }

    #[test]
    fn bucket_has_client_go_defaults() {
        let mut b = Bucket::new(0.0, 0);
        for _ in 0..10 {
            assert_eq!(b.take(), Duration::ZERO);
        }
        assert!(b.take() > Duration::from_millis(150));
    }
}
