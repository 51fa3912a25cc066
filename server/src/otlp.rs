//! One span per dial (`--otlp-traces-endpoint`, off by default), from the
//! frontend's DIAL_REQ to the tunnel's end, with the agent that served it,
//! when the agent answered and when its first byte came back, and the close
//! reason; a frontend's W3C `traceparent` makes it a child of the caller's
//! span. [`daemon::otlp`] sends it.
//!
//! With the flag off a tunnel carries no trace and the data path checks one
//! `Option` per packet.

use std::sync::OnceLock;
use std::time::SystemTime;

use daemon::otlp::proto::common::v1::any_value;
use daemon::otlp::proto::trace::v1::{Span, span, status};
use daemon::otlp::{attr, unix_nanos};
use link::debug_connections::CloseReason;
use parking_lot::Mutex;

pub use daemon::otlp::{Endpoint, Exporter};

use crate::traceparent::TraceParent;

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

    /// The `traceparent` the agent is given: this span as its parent
    /// (sampled, since it is recorded).
    pub fn traceparent(&self) -> String {
        TraceParent {
            trace_id: self.trace_id,
            parent_id: self.span_id,
            flags: 1,
        }
        .header()
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
        let failed = cause.is_failure();
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            parent_span_id: self.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: "konnectivity.dial".into(),
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: unix_nanos(self.start),
            end_time_unix_nano: unix_nanos(end),
            attributes,
            status: Some(daemon::otlp::proto::trace::v1::Status {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // The agent is handed this span as its parent.
        assert_eq!(
            t.traceparent(),
            format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", hex(&s.span_id))
        );
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
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }
}
