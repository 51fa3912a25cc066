//! The packet and error counts of Konnectivity streams, as upstream's server
//! and agent both expose them (`<prefix>_stream_packets_total` by segment and
//! packet type, `<prefix>_stream_errors_total` by segment, gRPC code and
//! packet type), with upstream's HELP texts: one place for the two binaries.
//!
//! The packet types come from the caller (the wire types are not this
//! crate's): their labels, and which raw type counts where (`None`: not
//! counted, e.g. our own WINDOW_UPDATE, so the family's series stay
//! upstream's).

use std::sync::Arc;

use go_compat::gometrics::{CounterGrid, Registry};

/// The two family names of one binary (see [`crate::stream_metric_names`]).
#[derive(Debug, Clone, Copy)]
pub struct StreamNames {
    pub packets: &'static str,
    pub errors: &'static str,
}

/// `stream_metric_names!("konnectivity_network_proxy_agent")` names
/// `<prefix>_stream_packets_total` and `<prefix>_stream_errors_total`.
#[macro_export]
macro_rules! stream_metric_names {
    ($prefix:literal) => {
        $crate::stream_metrics::StreamNames {
            packets: concat!($prefix, "_stream_packets_total"),
            errors: concat!($prefix, "_stream_errors_total"),
        }
    };
}

/// Which column of the packet grid a raw packet type counts in.
pub type Classify = fn(i32) -> Option<usize>;

pub struct StreamStats {
    registry: Arc<Registry>,
    names: StreamNames,
    packets: CounterGrid,
    classify: Classify,
}

impl StreamStats {
    /// Describes both families on `registry`; `segments` are the grid's
    /// rows (index = the caller's segment), `packet_types` its columns.
    pub fn new(
        registry: &Arc<Registry>,
        names: StreamNames,
        segments: &[&str],
        packet_types: &[&str],
        classify: Classify,
    ) -> Self {
        registry.describe_counter(
            names.packets,
            "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
        );
        registry.describe_counter(
            names.errors,
            "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)",
        );
        StreamStats {
            registry: registry.clone(),
            names,
            packets: CounterGrid::new(
                registry,
                names.packets,
                ("segment", segments),
                ("packet_type", packet_types),
            ),
            classify,
        }
    }

    /// Counts one packet of raw type `packet_type` on row `segment`.
    pub fn packet(&self, segment: usize, packet_type: i32) {
        if let Some(t) = (self.classify)(packet_type)
            && let Some(c) = self.packets.get(segment, t)
        {
            c.increment(1);
        }
    }

    /// Counts one stream error; the series appears on the first.
    pub fn error(&self, segment: &str, code: &str, packet_type: &str) {
        self.registry
            .counter(
                self.names.errors,
                &[
                    ("segment", segment),
                    ("code", code),
                    ("packet_type", packet_type),
                ],
            )
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(t: i32) -> Option<usize> {
        (0..2).contains(&t).then_some(t as usize)
    }

    #[test]
    fn counts_classified_packets_and_names_errors() {
        let r = Arc::new(Registry::new(&[]));
        let s = StreamStats::new(
            &r,
            stream_metric_names!("p"),
            &["from_a", "to_a"],
            &["DIAL_REQ", "DATA"],
            classify,
        );
        s.packet(1, 1);
        s.packet(1, 1);
        s.packet(0, 7); // not classified: not counted
        s.packet(5, 0); // no such segment
        s.error("from_a", "Unavailable", "DATA");
        let text = r.render();
        assert!(
            text.contains("p_stream_packets_total{packet_type=\"DATA\",segment=\"to_a\"} 2\n"),
            "{text}"
        );
        assert!(!text.contains("packet_type=\"DIAL_REQ\""), "{text}");
        assert!(text.contains("p_stream_errors_total{code=\"Unavailable\",packet_type=\"DATA\",segment=\"from_a\"} 1\n"), "{text}");
        assert!(
            text.contains("# HELP p_stream_errors_total Count of gRPC stream errors"),
            "{text}"
        );
    }
}
