//! Optional OpenTelemetry traces (`--otlp-traces-endpoint`, off by default):
//! one span per dial, from the frontend's DIAL_REQ to the tunnel's end, with
//! the agent that served it, when the agent answered and when its first byte
//! came back, and the close reason. A frontend's W3C `traceparent` makes it
//! a child of the caller's span. Spans go to an OTLP/HTTP receiver
//! (`application/x-protobuf`, `POST <endpoint>/v1/traces`) in batches from
//! one task; a full queue drops spans rather than slow a tunnel.
//!
//! With the flag off a tunnel carries no trace and the data path checks one
//! `Option` per packet.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use link::debug_connections::CloseReason;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span, status};
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc;

use crate::traceparent::TraceParent;

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
}

impl Exporter {
    pub fn new(endpoint: Endpoint) -> Exporter {
        let (tx, rx) = mpsc::channel(QUEUE);
        Exporter {
            tx,
            rx: Mutex::new(Some(rx)),
            endpoint,
        }
    }

    /// Starts the export task (once).
    pub fn spawn(&self) {
        if let Some(rx) = self.rx.lock().take() {
            tokio::spawn(export_loop(rx, self.endpoint.clone()));
        }
    }

    fn send(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            tracing::debug!("OTLP span queue full; span dropped");
        }
    }
}

fn now_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// One dial's span, filled in as the tunnel goes.
#[derive(Debug)]
pub struct DialTrace {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    start: SystemTime,
    answered: OnceLock<SystemTime>,
    first_byte: OnceLock<SystemTime>,
    text: Mutex<TraceText>,
}

#[derive(Debug, Default)]
struct TraceText {
    frontend: &'static str,
    target: String,
    agent: String,
    dial_id: i64,
    cause: Option<(CloseReason, String)>,
}

impl DialTrace {
    /// A span of `frontend`'s tunnel, a child of `parent` when the frontend
    /// sent one.
    pub fn new(frontend: &'static str, parent: Option<TraceParent>) -> DialTrace {
        let trace_id = parent
            .map(|p| p.trace_id)
            .unwrap_or_else(|| rand::random::<u128>().max(1).to_be_bytes());
        DialTrace {
            trace_id,
            span_id: rand::random::<u64>().max(1).to_be_bytes(),
            parent: parent.map(|p| p.parent_id),
            start: SystemTime::now(),
            answered: OnceLock::new(),
            first_byte: OnceLock::new(),
            text: Mutex::new(TraceText {
                frontend,
                ..Default::default()
            }),
        }
    }

    /// The DIAL_REQ went to `agent`.
    pub fn dialing(&self, agent: &str, target: &str, dial_id: i64) {
        let mut t = self.text.lock();
        t.agent = agent.to_string();
        t.target = target
            .chars()
            .take(link::debug_connections::MAX_FIELD)
            .collect();
        t.dial_id = dial_id;
    }

    /// The agent answered the dial.
    pub fn answered(&self) {
        let _ = self.answered.set(SystemTime::now());
    }

    /// The agent's first DATA for the frontend.
    pub fn first_byte(&self) {
        if self.first_byte.get().is_none() {
            let _ = self.first_byte.set(SystemTime::now());
        }
    }

    /// Why it ended (the first reason wins, as in `/debug/connections`).
    pub fn closing(&self, cause: CloseReason, text: &str) {
        let mut t = self.text.lock();
        if t.cause.is_none() {
            t.cause = Some((
                cause,
                text.chars()
                    .take(link::debug_connections::MAX_FIELD)
                    .collect(),
            ));
        }
    }

    /// The finished span, handed to `exporter`.
    pub fn finish(&self, exporter: &Exporter) {
        exporter.send(self.span(SystemTime::now()));
    }

    fn span(&self, end: SystemTime) -> Span {
        use any_value::Value::{IntValue, StringValue};
        let t = self.text.lock();
        let (cause, why) = t
            .cause
            .clone()
            .unwrap_or((CloseReason::Other, String::new()));
        let since = |at: &OnceLock<SystemTime>| {
            at.get()
                .and_then(|a| a.duration_since(self.start).ok())
                .map(|d| d.as_nanos() as i64)
        };
        let mut attributes = vec![
            attr("konnectivity.frontend", StringValue(t.frontend.into())),
            attr("konnectivity.agent_id", StringValue(t.agent.clone())),
            attr("konnectivity.dial_id", StringValue(t.dial_id.to_string())),
            attr("server.address", StringValue(t.target.clone())),
            attr(
                "konnectivity.close_cause",
                StringValue(cause.label().into()),
            ),
            attr("konnectivity.close_reason", StringValue(why)),
        ];
        if let Some(n) = since(&self.answered) {
            attributes.push(attr("konnectivity.dial_duration_ns", IntValue(n)));
        }
        if let Some(n) = since(&self.first_byte) {
            attributes.push(attr("konnectivity.first_byte_ns", IntValue(n)));
        }
        let failed = !matches!(
            cause,
            CloseReason::Closed
                | CloseReason::ClientClosed
                | CloseReason::UpstreamClosed
                | CloseReason::Other
        );
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            parent_span_id: self.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: "konnectivity.dial".into(),
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: now_nanos(self.start),
            end_time_unix_nano: now_nanos(end),
            attributes,
            status: Some(opentelemetry_proto::tonic::trace::v1::Status {
                code: if failed {
                    status::StatusCode::Error
                } else {
                    status::StatusCode::Unset
                } as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

fn request(spans: Vec<Span>) -> Vec<u8> {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![attr(
                    "service.name",
                    any_value::Value::StringValue("proxy-server".into()),
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

async fn export_loop(mut rx: mpsc::Receiver<Span>, endpoint: Endpoint) {
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
        match tokio::time::timeout(EXPORT_TIMEOUT, post(&endpoint, request(batch))).await {
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
    fn a_span_joins_the_callers_trace() {
        let parent = TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let t = DialTrace::new("grpc", parent);
        t.dialing("agent-a", "10.0.0.1:443", 7);
        t.answered();
        t.first_byte();
        t.closing(
            CloseReason::UpstreamLost,
            "closed: connection to the proxy agent was lost",
        );
        t.closing(CloseReason::ClientClosed, "later, ignored");
        let s = t.span(SystemTime::now());
        assert_eq!(hex(&s.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&s.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(s.span_id.len(), 8);
        let get = |k: &str| {
            s.attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            get("konnectivity.close_cause"),
            Some(any_value::Value::StringValue("upstream_lost".into()))
        );
        assert_eq!(
            get("konnectivity.agent_id"),
            Some(any_value::Value::StringValue("agent-a".into()))
        );
        assert!(get("konnectivity.first_byte_ns").is_some());
        assert_eq!(
            s.status.map(|s| s.code),
            Some(status::StatusCode::Error as i32)
        );
        // Without a caller's trace: a new one, no parent.
        let s = DialTrace::new("http-connect", None).span(SystemTime::now());
        assert_eq!(s.trace_id.len(), 16);
        assert!(s.parent_span_id.is_empty());
        // It encodes.
        assert!(!request(vec![s]).is_empty());
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }
}
