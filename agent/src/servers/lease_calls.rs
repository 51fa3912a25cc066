//! Counts and times the agent's lease list and watch calls to the apiserver
//! as upstream's agent does (`lease_lists_total`, `lease_list_latency_seconds`).
//!
//! kube-rs's watcher makes these calls itself, so they are observed here, as
//! a layer of the lease client's HTTP stack: a request for the lease
//! collection is a list, or a watch when it says `watch=true`. Upstream
//! counts watch outcomes into `lease_lists_total` too (its
//! `lease_watches_total` is registered but never moves); so do we. The
//! `reason` of a refused call is the `reason` of the apiserver's Status body,
//! which is read only for error responses (they are small). A call that got
//! no HTTP response is counted with code `0`, as the server's lease metrics
//! do.

use crate::limits::MAX_STATUS_BODY;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Either, Full, Limited};

use crate::metrics::Metrics;

#[derive(Clone)]
pub struct ObserveLeaseCalls {
    pub metrics: Arc<Metrics>,
}

impl<S> tower::Layer<S> for ObserveLeaseCalls {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, ReqB, B> tower::Service<Request<ReqB>> for Observed<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Either<B, Full<Bytes>>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let call = Call::of(&req);
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let Some(call) = call else {
                return result.map(|r| r.map(Either::Left));
            };
            let rsp = match result {
                Ok(rsp) => rsp,
                Err(e) => {
                    call.record(&metrics, 0, "", start);
                    return Err(e);
                }
            };
            let code = rsp.status().as_u16();
            if rsp.status().is_success() {
                call.record(&metrics, code, "", start);
                return Ok(rsp.map(Either::Left));
            }
            let (parts, body) = rsp.into_parts();
            let bytes = Limited::new(body, MAX_STATUS_BODY)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            call.record(&metrics, code, &status_reason(&bytes), start);
            Ok(Response::from_parts(parts, Either::Right(Full::new(bytes))))
        })
    }
}

#[derive(Clone, Copy)]
enum Call {
    List,
    Watch,
}

impl Call {
    /// A GET of the lease collection (not of one named lease).
    fn of<B>(req: &Request<B>) -> Option<Call> {
        if req.method() != http::Method::GET || !req.uri().path().ends_with("/leases") {
            return None;
        }
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        Some(if watch { Call::Watch } else { Call::List })
    }

    fn record(self, metrics: &Metrics, code: u16, reason: &str, start: Instant) {
        metrics.lease_call(code, reason);
        if let Call::List = self {
            metrics.lease_list_latency(code, start.elapsed());
        }
    }
}

/// The `reason` of a Kubernetes Status body, or "" (Go's StatusReasonUnknown).
fn status_reason(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default)]
        reason: String,
    }
    serde_json::from_slice::<Status>(body)
        .map(|s| s.reason)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn lists_and_watches_of_the_lease_collection_only() {
        let base = "https://k/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
        assert!(matches!(
            Call::of(&req(&format!("{base}?labelSelector=a%3Db"))),
            Some(Call::List)
        ));
        assert!(matches!(
            Call::of(&req(&format!(
                "{base}?labelSelector=a&watch=true&timeoutSeconds=290"
            ))),
            Some(Call::Watch)
        ));
        assert!(Call::of(&req(&format!("{base}/konnectivity-proxy-server-a"))).is_none());
        assert!(Call::of(&req("https://k/api/v1/namespaces/default/pods")).is_none());
    }

    #[test]
    fn reason_comes_from_the_status_body() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}"#;
        assert_eq!(status_reason(body), "Forbidden");
        assert_eq!(status_reason(b"<html>bad gateway</html>"), "");
    }
}
