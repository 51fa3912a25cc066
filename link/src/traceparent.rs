//! The W3C Trace Context `traceparent`: which trace a dial belongs to and the
//! span that made it. proxy-server reads it from a frontend (an HTTP CONNECT
//! header, or gRPC metadata on the `Proxy` stream); when it traces the dial
//! it sends its own span's to the agent in the DIAL_REQ (a field upstream's
//! agents ignore), so the agent's span joins the same trace. It names the
//! tunnel in `/debug/connections` on both, so that one `kubectl exec` can be
//! found on the server and on the agent.
//!
//! Parsed as the recommendation says a receiver must: version `00` is
//! exactly `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, with neither id all
//! zeros; a later version (not `ff`) is read as far as the version-00
//! fields, and what follows must start with `-`. Anything else is ignored,
//! as if no header had been sent. Only the first 55 bytes are ever looked
//! at past the length check.

/// The length of a version-00 value.
const LEN: usize = 55;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = hex_digit(pair[0])? << 4 | hex_digit(pair[1])?;
    }
    Some(out)
}

impl TraceParent {
    /// The header's value, or `None` for one a receiver must ignore.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = value.trim_ascii();
        if value.len() < LEN || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let [version] = hex::<1>(&value[..2])?;
        match version {
            0xff => return None,
            0 if value.len() != LEN => return None,
            0 => {}
            _ if value.len() > LEN && value[LEN] != b'-' => return None,
            _ => {}
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let parent_id = hex::<8>(&value[36..52])?;
        let [flags] = hex::<1>(&value[53..LEN])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn parent_id_hex(&self) -> String {
        self.parent_id.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The version-00 header value, for a callee.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.parent_id_hex(),
            self.flags
        )
    }

    /// Lists it on the tunnel's `/debug/connections` entry.
    pub fn record(&self, debug: &crate::debug_connections::Tracked) {
        debug.set("trace_id", self.trace_id_hex());
        debug.set("parent_span_id", self.parent_id_hex());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_the_recommendations_example() {
        let t = TraceParent::parse(GOOD.as_bytes()).unwrap_or_else(|| panic!("{GOOD}"));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id_hex(), "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        // Surrounding blanks (optional whitespace of an HTTP field).
        assert_eq!(TraceParent::parse(format!(" {GOOD}\t").as_bytes()), Some(t));
        // What a callee is given reads back the same.
        assert_eq!(t.header(), GOOD);
    }

    #[test]
    fn ignores_what_a_receiver_must_ignore() {
        for bad in [
            "",
            "00",
            // Uppercase, a version of ff, ids of zeros.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version 00 with more after it; wrong separators; short ids.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_far_as_version_00_goes() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let t = TraceParent::parse(later.as_bytes()).unwrap_or_else(|| panic!("{later}"));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let glued = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(TraceParent::parse(glued.as_bytes()), None);
        let short = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceParent::parse(short.as_bytes()).is_some());
    }
}
