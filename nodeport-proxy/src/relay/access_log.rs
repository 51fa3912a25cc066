//! The access log (`-access-log`, off by default): one line per connection
//! (per CONNECT stream on HTTP/2) when it ends, as KKP's Envoy wrote for its
//! SNI and tunneling listeners: start, duration, bytes each way, listener,
//! SNI host or authority, upstream, response code and flags, close reason.
//!
//! `-access-log-format=json` (the default; KKP's pods are parsed by
//! fluent-bit as JSON) names each field after the Envoy command operator it
//! carries (`start_time`, `bytes_received`, `upstream_host`, …);
//! `-access-log-format=envoy` writes Envoy's default text format, with the
//! listener, the SNI host and the close reason appended.
//!
//! Lines go through a bounded queue to a writer thread, so a slow or blocked
//! log never stalls a connection; lines that find the queue full are dropped
//! and counted (`nodeport_proxy_access_log_dropped_total`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Instant, SystemTime};

use link::relay::{RelayBytes, RelayEnd};
use metrics::Counter;

use crate::limits::ACCESS_LOG_QUEUE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Envoy,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Format::Json),
            "envoy" => Ok(Format::Envoy),
            other => Err(format!("{other:?}: json or envoy expected")),
        }
    }
}

/// Where the log goes and how it looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// `/dev/stdout` (or `-`) for standard output, else a file appended to.
    pub path: String,
    pub format: Format,
}

pub struct AccessLog {
    queue: SyncSender<String>,
    format: Format,
    dropped: Counter,
}

impl AccessLog {
    /// Opens the destination and starts the writer thread.
    pub fn open(config: &AccessLogConfig, dropped: Counter) -> std::io::Result<Arc<Self>> {
        let mut out: Box<dyn Write + Send> = match config.path.as_str() {
            "-" | "/dev/stdout" => Box::new(std::io::stdout()),
            "/dev/stderr" => Box::new(std::io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let (queue, lines) = sync_channel::<String>(ACCESS_LOG_QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                while let Ok(line) = lines.recv() {
                    let mut ok = out.write_all(line.as_bytes()).is_ok();
                    // Write what is queued already, then flush once.
                    while ok && let Ok(line) = lines.try_recv() {
                        ok = out.write_all(line.as_bytes()).is_ok();
                    }
                    if !ok || out.flush().is_err() {
                        // Nowhere to write: stop; further lines count as dropped.
                        return;
                    }
                }
            })?;
        Ok(Arc::new(AccessLog {
            queue,
            format: config.format,
            dropped,
        }))
    }

    fn write(&self, line: String) {
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.increment(1);
            }
        }
    }
}

/// One connection's (or stream's) line, written when this is dropped; a
/// no-op when the log is off.
pub struct Access(Option<Box<Record>>);

struct Record {
    log: Arc<AccessLog>,
    start: SystemTime,
    started: Instant,
    /// The listener's address.
    listener: Option<SocketAddr>,
    downstream: Option<SocketAddr>,
    /// `HTTP/1.1` or `HTTP/2` for tunnels; `None` for TCP (NodePort, SNI).
    protocol: Option<&'static str>,
    sni: Option<String>,
    authority: Option<String>,
    code: u16,
    flags: &'static str,
    upstream: Option<SocketAddr>,
    cluster: Option<String>,
    bytes: RelayBytes,
    reason: &'static str,
    needs_answer: bool,
}

impl Access {
    /// Starts a record for a connection accepted on `listener` from
    /// `downstream` (`None`: the log is off).
    pub fn start(
        log: Option<&Arc<AccessLog>>,
        listener: Option<SocketAddr>,
        downstream: Option<SocketAddr>,
    ) -> Access {
        Access(log.map(|log| Record::new(log.clone(), listener, downstream, None)))
    }

    /// Another record for a stream of the same connection.
    pub fn stream(&self, protocol: &'static str) -> Access {
        Access(
            self.0
                .as_ref()
                .map(|r| Record::new(r.log.clone(), r.listener, r.downstream, Some(protocol))),
        )
    }

    /// Written only once a response code is set: a tunneling connection
    /// that never sent a request leaves no line, as with Envoy's HTTP
    /// connection manager.
    pub fn skip_unless_answered(&mut self) {
        if let Some(r) = &mut self.0 {
            r.needs_answer = true;
        }
    }

    pub fn protocol(&mut self, p: &'static str) {
        if let Some(r) = &mut self.0 {
            r.protocol = Some(p);
        }
    }

    pub fn sni(&mut self, host: &str) {
        if let Some(r) = &mut self.0 {
            r.sni = Some(host.to_string());
        }
    }

    pub fn authority(&mut self, a: &str) {
        if let Some(r) = &mut self.0 {
            r.authority = Some(a.to_string());
        }
    }

    pub fn cluster(&mut self, c: &str) {
        if let Some(r) = &mut self.0 {
            r.cluster = Some(c.to_string());
        }
    }

    pub fn upstream(&mut self, a: SocketAddr) {
        if let Some(r) = &mut self.0 {
            r.upstream = Some(a);
        }
    }

    /// The response code (tunnels) and Envoy's response flags.
    pub fn answer(&mut self, code: u16, flags: &'static str, reason: &'static str) {
        if let Some(r) = &mut self.0 {
            r.code = code;
            r.flags = flags;
            r.reason = reason;
        }
    }

    /// How the relay ended and what it moved (early bytes included).
    pub fn ended(&mut self, end: &RelayEnd, bytes: RelayBytes) {
        if let Some(r) = &mut self.0 {
            r.bytes = bytes;
            r.reason = end.reason();
            r.flags = match end {
                RelayEnd::Idle => "SI",
                RelayEnd::ClientError(_) => "DC",
                RelayEnd::UpstreamError(_) => "UC",
                RelayEnd::Closed | RelayEnd::Stopped => "-",
            };
        }
    }
}

impl Drop for Access {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            if r.needs_answer && r.code == 0 {
                return;
            }
            let line = r.line();
            r.log.write(line);
        }
    }
}

fn dash(s: Option<impl ToString>) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
}

impl Record {
    fn new(
        log: Arc<AccessLog>,
        listener: Option<SocketAddr>,
        downstream: Option<SocketAddr>,
        protocol: Option<&'static str>,
    ) -> Box<Record> {
        Box::new(Record {
            log,
            start: SystemTime::now(),
            started: Instant::now(),
            listener,
            downstream,
            protocol,
            sni: None,
            authority: None,
            code: 0,
            flags: "-",
            upstream: None,
            cluster: None,
            bytes: RelayBytes::default(),
            reason: "-",
            needs_answer: false,
        })
    }

    fn line(&self) -> String {
        let start = rfc3339_millis(self.start);
        let duration = self.started.elapsed().as_millis() as u64;
        let method = if self.protocol.is_some() && self.code != 0 {
            "CONNECT"
        } else {
            "-"
        };
        match self.log.format {
            Format::Json => {
                let mut v = serde_json::json!({
                    "start_time": start,
                    "method": method,
                    "protocol": self.protocol.unwrap_or("-"),
                    "response_code": self.code,
                    "response_flags": self.flags,
                    "bytes_received": self.bytes.from_client,
                    "bytes_sent": self.bytes.from_upstream,
                    "duration": duration,
                    "authority": dash(self.authority.as_ref()),
                    "requested_server_name": dash(self.sni.as_ref()),
                    "upstream_host": dash(self.upstream),
                    "upstream_cluster": dash(self.cluster.as_ref()),
                    "downstream_local_address": dash(self.listener),
                    "downstream_remote_address": dash(self.downstream),
                    "connection_termination_details": self.reason,
                })
                .to_string();
                v.push('\n');
                v
            }
            // Envoy's default format, then listener, SNI host, close reason.
            Format::Envoy => format!(
                "[{start}] \"{method} - {}\" {} {} {} {} {duration} - \"-\" \"-\" \"-\" \"{}\" \"{}\" {} {} {}\n",
                self.protocol.unwrap_or("-"),
                self.code,
                self.flags,
                self.bytes.from_client,
                self.bytes.from_upstream,
                dash(self.authority.as_ref()),
                dash(self.upstream),
                dash(self.listener),
                dash(self.sni.as_ref()),
                self.reason,
            ),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, Envoy's `%START_TIME%` default.
fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H.
/// Hinnant's algorithm; the inverse of `model::days_from_civil`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::model::Timestamp;

    fn record(format: Format) -> Record {
        let (queue, _) = sync_channel(1);
        Record {
            log: Arc::new(AccessLog {
                queue,
                format,
                dropped: Counter::noop(),
            }),
            start: SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_709_208_000_250),
            started: Instant::now(),
            listener: "0.0.0.0:8088".parse().ok(),
            downstream: "10.1.2.3:50000".parse().ok(),
            protocol: Some("HTTP/2"),
            sni: None,
            authority: Some("apiserver-external.cluster-a.svc.cluster.local:443".into()),
            code: 200,
            flags: "-",
            upstream: "10.0.0.7:6443".parse().ok(),
            cluster: Some("cluster-a/apiserver-external-secure".into()),
            bytes: RelayBytes {
                from_client: 517,
                from_upstream: 4096,
            },
            reason: "closed",
            needs_answer: false,
        }
    }

    #[test]
    fn envoy_format_is_envoys_default_plus_listener_sni_and_reason() {
        let line = record(Format::Envoy).line();
        // The duration (field 8) depends on the clock.
        let mut fields: Vec<&str> = line.split(' ').collect();
        fields[8] = "DUR";
        let line = fields.join(" ");
        assert_eq!(
            line,
            "[2024-02-29T12:00:00.250Z] \"CONNECT - HTTP/2\" 200 - 517 4096 DUR - \"-\" \"-\" \"-\" \"apiserver-external.cluster-a.svc.cluster.local:443\" \"10.0.0.7:6443\" 0.0.0.0:8088 - closed\n"
        );
        let mut tcp = record(Format::Envoy);
        (tcp.protocol, tcp.code, tcp.authority, tcp.sni) =
            (None, 0, None, Some("a.seed.example.com".into()));
        let line = tcp.line();
        assert!(line.contains("] \"- - -\" 0 - 517 4096 "), "{line}");
        assert!(
            line.ends_with(" \"-\" \"10.0.0.7:6443\" 0.0.0.0:8088 a.seed.example.com closed\n"),
            "{line}"
        );
    }

    #[test]
    fn json_fields_are_named_after_envoys_operators() {
        let line = record(Format::Json).line();
        assert!(line.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        for (k, want) in [
            ("start_time", serde_json::json!("2024-02-29T12:00:00.250Z")),
            ("method", serde_json::json!("CONNECT")),
            ("protocol", serde_json::json!("HTTP/2")),
            ("response_code", serde_json::json!(200)),
            ("response_flags", serde_json::json!("-")),
            ("bytes_received", serde_json::json!(517)),
            ("bytes_sent", serde_json::json!(4096)),
            ("upstream_host", serde_json::json!("10.0.0.7:6443")),
            (
                "upstream_cluster",
                serde_json::json!("cluster-a/apiserver-external-secure"),
            ),
            (
                "downstream_local_address",
                serde_json::json!("0.0.0.0:8088"),
            ),
            (
                "downstream_remote_address",
                serde_json::json!("10.1.2.3:50000"),
            ),
            ("requested_server_name", serde_json::json!("-")),
            (
                "connection_termination_details",
                serde_json::json!("closed"),
            ),
        ] {
            assert_eq!(v[k], want, "{k}: {line}");
        }
        assert!(v["duration"].is_u64());
    }

    #[test]
    fn start_time_as_envoy_writes_it() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400, "2000-02-29T00:00:00.000Z"),
            (1_709_208_000, "2024-02-29T12:00:00.000Z"),
            (4_102_444_799, "2099-12-31T23:59:59.000Z"),
        ] {
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            let s = rfc3339_millis(t);
            assert_eq!(s, want);
            assert_eq!(
                Timestamp::parse(&s).ok(),
                Some(Timestamp::from_unix_seconds(secs as i64))
            );
        }
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_500);
        assert_eq!(rfc3339_millis(t), "1970-01-01T00:00:01.500Z");
    }
}
