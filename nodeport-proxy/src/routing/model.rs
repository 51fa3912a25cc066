//! The objects the routing table is built from: the subset of Kubernetes
//! Services and EndpointSlices KKP's envoy-manager reads, in the API's own
//! shape and field names, so a file can hold `kubectl get -o yaml` excerpts and
//! a Kubernetes watcher can fill the same structs.
//!
//! Unknown fields are ignored inside objects (real objects carry many more),
//! but not at the top level of a file, where a typo would silently drop data.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

/// Everything a routing table is built from.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    #[serde(default)]
    pub services: Vec<Service>,
    #[serde(default)]
    pub endpoint_slices: Vec<EndpointSlice>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// Breaks ties between Services created in the same second.
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub creation_timestamp: Option<Timestamp>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Service {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceSpec,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "type")]
    pub service_type: ServiceType,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default)]
    pub name: String,
    pub port: u16,
    /// 0 or absent: no node port allocated.
    #[serde(default)]
    pub node_port: u16,
    #[serde(default)]
    pub protocol: Protocol,
}

/// The label that ties a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EndpointSlice {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub ports: Vec<EndpointPort>,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

impl EndpointSlice {
    pub fn service_name(&self) -> Option<&str> {
        self.metadata
            .labels
            .get(SERVICE_NAME_LABEL)
            .map(String::as_str)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EndpointPort {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub protocol: Protocol,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Endpoint {
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub conditions: EndpointConditions,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EndpointConditions {
    /// KKP counts an endpoint only when this is explicitly `true`.
    #[serde(default)]
    pub ready: Option<bool>,
}

/// A `metav1.Time`: RFC 3339 in UTC, kept as nanoseconds since the epoch so
/// "older" is a plain comparison.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct Timestamp(i128);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid RFC 3339 timestamp {0:?}")]
pub struct InvalidTimestamp(String);

impl Timestamp {
    pub fn from_unix_seconds(secs: i64) -> Self {
        Timestamp(i128::from(secs) * 1_000_000_000)
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
    pub fn parse(s: &str) -> Result<Self, InvalidTimestamp> {
        let bad = || InvalidTimestamp(s.to_string());
        let b = s.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return Err(bad());
        }
        if b[13] != b':' || b[16] != b':' {
            return Err(bad());
        }
        let num = |r: std::ops::Range<usize>| -> Result<i64, InvalidTimestamp> {
            let part = s.get(r).ok_or_else(bad)?;
            if !part.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&month)
            || !(1..=31).contains(&day)
            || hour > 23
            || min > 59
            || sec > 60
        {
            return Err(bad());
        }
        let mut rest = &s[19..];
        let mut nanos: i128 = 0;
        if let Some(frac) = rest.strip_prefix('.') {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 9 {
                return Err(bad());
            }
            let scale = 10i128.pow(9 - digits as u32);
            nanos = frac[..digits].parse::<i128>().map_err(|_| bad())? * scale;
            rest = &frac[digits..];
        }
        let offset_secs: i64 = match rest {
            "Z" | "z" => 0,
            o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
                let h: i64 = o[1..3].parse().map_err(|_| bad())?;
                let m: i64 = o[4..6].parse().map_err(|_| bad())?;
                let v = h * 3600 + m * 60;
                if o.starts_with('-') { -v } else { v }
            }
            _ => return Err(bad()),
        };
        let days = days_from_civil(year, month, day);
        let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_secs;
        Ok(Timestamp(i128::from(secs) * 1_000_000_000 + nanos))
    }
}

impl TryFrom<String> for Timestamp {
    type Error = InvalidTimestamp;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Timestamp::parse(&s)
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_order_chronologically() {
        let p = |s| Timestamp::parse(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p("1970-01-01T00:00:00Z"), Timestamp::from_unix_seconds(0));
        assert_eq!(
            p("2024-02-29T12:00:00Z"),
            Timestamp::from_unix_seconds(1_709_208_000)
        );
        assert!(p("2024-01-01T00:00:05Z") < p("2024-01-01T00:00:05.5Z"));
        assert_eq!(p("2024-01-01T02:00:00+02:00"), p("2024-01-01T00:00:00Z"));
        for bad in [
            "",
            "2024-01-01",
            "2024-13-01T00:00:00Z",
            "2024-01-01T00:00:00",
            "x024-01-01T00:00:00Z",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad}");
        }
    }
}
