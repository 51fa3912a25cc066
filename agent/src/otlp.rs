//! The agent's span of one dial (`--otlp-traces-endpoint`, off by default):
//! from the server's DIAL_REQ to the destination connection's end, with the
//! destination's address, the dial's duration and the close reason. When
//! our server traces the dial, its DIAL_REQ carries the server span's
//! `traceparent` (a field upstream's servers never set) and the agent's
//! span is its child, in the same trace; otherwise (upstream's server, or
//! ours not tracing) the span starts a trace of its own. Either way it
//! names the dial by `konnectivity.dial_id`, the attribute proxy-server's
//! span has too. [`daemon::otlp`] sends it.

use std::sync::Arc;
use std::time::SystemTime;

use daemon::otlp::proto::common::v1::any_value::Value::{IntValue, StringValue};
use daemon::otlp::proto::trace::v1::{Span, Status, span, status};
use daemon::otlp::{Exporter, attr, unix_nanos};
use link::debug_connections::CloseReason;
use link::traceparent::TraceParent;

use crate::limits::MAX_TRACEPARENT;

/// The server's span of a dial, from its DIAL_REQ's `traceparent`: `None`
/// when there is none, or one longer than [`MAX_TRACEPARENT`] or malformed.
pub fn parent_of(traceparent: &str) -> Option<TraceParent> {
    if traceparent.is_empty() || traceparent.len() > MAX_TRACEPARENT {
        return None;
    }
    TraceParent::parse(traceparent.as_bytes())
}

pub struct DialSpan {
    exporter: Arc<Exporter>,
    parent: Option<TraceParent>,
    start: SystemTime,
    dialed: Option<SystemTime>,
    dial_id: i64,
    server_id: String,
    target: String,
    peer: Option<String>,
}

impl DialSpan {
    /// The span of dial `dial_id`, a child of the server's span `parent`
    /// when the DIAL_REQ named one.
    pub fn new(
        exporter: Arc<Exporter>,
        parent: Option<TraceParent>,
        dial_id: i64,
        server_id: &str,
        target: &str,
    ) -> DialSpan {
        DialSpan {
            exporter,
            parent,
            start: SystemTime::now(),
            dialed: None,
            dial_id,
            server_id: server_id.to_string(),
            target: target
                .chars()
                .take(link::debug_connections::MAX_FIELD)
                .collect(),
            peer: None,
        }
    }

    /// The destination answered, at `peer`.
    pub fn dialed(&mut self, peer: Option<std::net::SocketAddr>) {
        self.dialed = Some(SystemTime::now());
        self.peer = peer.map(|p| p.to_string());
    }

    /// Ends the span with why, and hands it to the exporter.
    pub fn finish(self, cause: CloseReason, reason: &str) {
        let span = self.span(cause, reason, SystemTime::now());
        self.exporter.send(span);
    }

    fn span(&self, cause: CloseReason, reason: &str, end: SystemTime) -> Span {
        let mut attributes = vec![
            attr(
                "konnectivity.dial_id",
                StringValue(self.dial_id.to_string()),
            ),
            attr(
                "konnectivity.server_id",
                StringValue(self.server_id.clone()),
            ),
            attr("server.address", StringValue(self.target.clone())),
            attr(
                "konnectivity.close_cause",
                StringValue(cause.label().into()),
            ),
            attr(
                "konnectivity.close_reason",
                StringValue(
                    reason
                        .chars()
                        .take(link::debug_connections::MAX_FIELD)
                        .collect(),
                ),
            ),
        ];
        if let Some(p) = &self.peer {
            attributes.push(attr("network.peer.address", StringValue(p.clone())));
        }
        if let Some(d) = self.dialed.and_then(|d| d.duration_since(self.start).ok()) {
            attributes.push(attr(
                "konnectivity.dial_duration_ns",
                IntValue(d.as_nanos() as i64),
            ));
        }
        let failed = cause.is_failure();
        Span {
            trace_id: self
                .parent
                .map(|p| p.trace_id)
                .unwrap_or_else(|| rand::random::<u128>().max(1).to_be_bytes())
                .to_vec(),
            span_id: rand::random::<u64>().max(1).to_be_bytes().to_vec(),
            parent_span_id: self
                .parent
                .map(|p| p.parent_id.to_vec())
                .unwrap_or_default(),
            name: "konnectivity.agent.dial".into(),
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: unix_nanos(self.start),
            end_time_unix_nano: unix_nanos(end),
            attributes,
            status: Some(Status {
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

    const SERVER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_span_is_the_child_of_the_servers() {
        let e = Arc::new(Exporter::new(
            daemon::otlp::Endpoint::parse("http://127.0.0.1:9").unwrap_or_else(|e| panic!("{e}")),
            "proxy-agent",
        ));
        let s = DialSpan::new(e.clone(), parent_of(SERVER), 7, "server-a", "10.0.0.1:443").span(
            CloseReason::ClientClosed,
            "closed",
            SystemTime::now(),
        );
        assert_eq!(
            s.trace_id,
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        assert_eq!(
            s.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_ne!(s.span_id, s.parent_span_id);
        // Without one (upstream's server): a trace of its own.
        let s = DialSpan::new(e, parent_of(""), 7, "server-a", "10.0.0.1:443").span(
            CloseReason::ClientClosed,
            "closed",
            SystemTime::now(),
        );
        assert_eq!(s.trace_id.len(), 16);
        assert!(s.parent_span_id.is_empty());
    }

    #[test]
    fn a_traceparent_past_the_bound_is_ignored() {
        // A later version may carry more after the version-00 fields.
        let long = format!("01-{}", &SERVER[3..]) + "-";
        assert!(parent_of(&long).is_some());
        let too_long = long.clone() + &"x".repeat(MAX_TRACEPARENT - long.len() + 1);
        assert_eq!(too_long.len(), MAX_TRACEPARENT + 1);
        assert!(TraceParent::parse(too_long.as_bytes()).is_some());
        assert_eq!(parent_of(&too_long), None);
        assert_eq!(parent_of("00-garbage"), None);
    }
}
