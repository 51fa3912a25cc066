//! Sending OpenTelemetry spans (`--otlp-traces-endpoint` of proxy-server and
//! proxy-agent, off by default) to an OTLP/HTTP receiver
//! (`application/x-protobuf`, `POST <endpoint>/v1/traces`), in batches from
//! one task; a full queue drops spans rather than slow a tunnel. The spans
//! themselves are the binaries' (what a dial is, is theirs to say); the
//! messages are the protocol's generated types (`opentelemetry-proto`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use opentelemetry_proto::tonic as proto;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc;

/// Spans waiting for export; more are dropped (and counted in the log).
const QUEUE: usize = 4096;
/// Spans per request.
const BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const LINGER: Duration = Duration::from_millis(500);
/// One export request's deadline.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go: an `http://host:port` OTLP/HTTP receiver.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub authority: String,
    pub path: String,
}

impl Endpoint {
    /// `--otlp-traces-endpoint`: `http://host:port` (the path `/v1/traces`
    /// is added unless one is given).
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        let uri: http::Uri = s
            .parse()
            .map_err(|e| format!("--otlp-traces-endpoint {s:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--otlp-traces-endpoint {s:?}: only http:// receivers are supported (an OpenTelemetry collector on the node or in the pod)"
            ));
        }
        let Some(authority) = uri.authority().filter(|a| a.port_u16().is_some()) else {
            return Err(format!("--otlp-traces-endpoint {s:?}: give host:port"));
        };
        let path = match uri.path() {
            "" | "/" => "/v1/traces".to_string(),
            p => p.to_string(),
        };
        Ok(Endpoint {
            authority: authority.to_string(),
            path,
        })
    }
}

/// Hands finished spans to the export task.
#[derive(Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Span>,
    rx: Mutex<Option<mpsc::Receiver<Span>>>,
    endpoint: Endpoint,
    /// `service.name` of the spans' resource.
    service: &'static str,
}

impl Exporter {
    pub fn new(endpoint: Endpoint, service: &'static str) -> Exporter {
        let (tx, rx) = mpsc::channel(QUEUE);
        Exporter {
            tx,
            rx: Mutex::new(Some(rx)),
            endpoint,
            service,
        }
    }

    /// Starts the export task (once).
    pub fn spawn(&self) {
        if let Some(rx) = self.rx.lock().take() {
            tokio::spawn(export_loop(rx, self.endpoint.clone(), self.service));
        }
    }

    /// Queues a finished span.
    pub fn send(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            tracing::debug!("OTLP span queue full; span dropped");
        }
    }
}

/// `t` as OTLP's Unix nanoseconds.
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// One attribute.
pub fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn request(spans: Vec<Span>, service: &'static str) -> Vec<u8> {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![attr(
                    "service.name",
                    any_value::Value::StringValue(service.into()),
                )],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "konnectivity".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    req.encode_to_vec()
}

async fn export_loop(mut rx: mpsc::Receiver<Span>, endpoint: Endpoint, service: &'static str) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len();
        match tokio::time::timeout(EXPORT_TIMEOUT, post(&endpoint, request(batch, service))).await {
            Ok(Ok(())) => failing = false,
            Ok(Err(e)) if !failing => {
                failing = true;
                tracing::warn!(endpoint = %endpoint.authority, error = %e, spans = n, "OTLP export failed; spans dropped (logged once until it works again)");
            }
            Err(_) if !failing => {
                failing = true;
                tracing::warn!(endpoint = %endpoint.authority, spans = n, "OTLP export timed out; spans dropped (logged once until it works again)");
            }
            _ => {}
        }
    }
}

async fn post(endpoint: &Endpoint, body: Vec<u8>) -> Result<(), String> {
    let tcp = tokio::net::TcpStream::connect(&endpoint.authority)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Full<bytes::Bytes>,
    >(hyper_util::rt::TokioIo::new(tcp))
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::post(&endpoint.path)
        .header(http::header::HOST, &endpoint.authority)
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let rsp = send.send_request(req).await.map_err(|e| e.to_string())?;
    if !rsp.status().is_success() {
        return Err(format!("the receiver answered {}", rsp.status()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("http://127.0.0.1:4318").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (e.authority.as_str(), e.path.as_str()),
            ("127.0.0.1:4318", "/v1/traces")
        );
        let e = Endpoint::parse("http://collector:4318/custom").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.path, "/custom");
        assert!(Endpoint::parse("https://collector:4318").is_err());
        assert!(Endpoint::parse("http://collector").is_err());
    }

    #[test]
    fn a_request_names_the_service() {
        let body = request(vec![Span::default()], "proxy-agent");
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap_or_default();
        let attrs = &req.resource_spans[0]
            .resource
            .as_ref()
            .map(|r| r.attributes.clone())
            .unwrap_or_default();
        assert_eq!(attrs[0].key, "service.name");
        assert_eq!(req.resource_spans[0].scope_spans[0].spans.len(), 1);
    }
}
