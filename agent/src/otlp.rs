//! The agent's span of one dial (`--otlp-traces-endpoint`, off by default):
//! from the server's DIAL_REQ to the destination connection's end, with the
//! destination's address, the dial's duration and the close reason. The
//! DIAL_REQ carries no trace context (the wire stays upstream's), so the
//! span starts a trace of its own and names the dial by
//! `konnectivity.dial_id`, the attribute proxy-server's span has too: a
//! trace backend joins the two on it. [`daemon::otlp`] sends it.

use std::sync::Arc;
use std::time::SystemTime;

use daemon::otlp::proto::common::v1::any_value::Value::{IntValue, StringValue};
use daemon::otlp::proto::trace::v1::{Span, Status, span, status};
use daemon::otlp::{Exporter, attr, unix_nanos};
use link::debug_connections::CloseReason;

pub struct DialSpan {
    exporter: Arc<Exporter>,
    start: SystemTime,
    dialed: Option<SystemTime>,
    dial_id: i64,
    server_id: String,
    target: String,
    peer: Option<String>,
}

impl DialSpan {
    pub fn new(exporter: Arc<Exporter>, dial_id: i64, server_id: &str, target: &str) -> DialSpan {
        DialSpan {
            exporter,
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
            trace_id: rand::random::<u128>().max(1).to_be_bytes().to_vec(),
            span_id: rand::random::<u64>().max(1).to_be_bytes().to_vec(),
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
