//! `/debug/connections` for every binary: the connections (or tunnels,
//! streams) a process has open now, and the last few that closed with why.
//! A handler registers its connection once ([`Connections::open`]), fills in
//! what it learns (target, upstream, state; any extra field), counts bytes
//! through the returned [`Tracked`] (a relay [`Tally`]), and records the close
//! reason; dropping the handle moves the record to the closed ring and tells
//! the process's close hook ([`Connections::on_close`]), which counts closes
//! by [`CloseReason`]: the counters and the ring are written in one place, so
//! they never disagree.
//!
//! Bounded: the closed ring keeps [`MAX_CLOSED`] records, a listing shows at
//! most [`MAX_LISTED`] live ones (oldest first; the total is always given),
//! and every string a peer influences is cut to [`MAX_FIELD`] bytes. It is
//! meant for an admin port bound to loopback.

use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

pub use crate::close_reason::CloseReason;
use serde_json::{Map, Value, json};

use crate::relay::Tally;

/// Closed connections remembered.
pub const MAX_CLOSED: usize = 256;
/// Live connections listed at most per request (`?limit=` lowers it).
pub const MAX_LISTED: usize = 1000;
/// Longest text kept per field (an SNI host, an authority, a reason).
pub const MAX_FIELD: usize = 256;
/// Extra fields per connection.
const MAX_EXTRA: usize = 8;

/// One process's table. Cheap to clone.
#[derive(Clone, Default)]
pub struct Connections {
    inner: Arc<Table>,
}

#[derive(Default)]
struct Table {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Record>>>,
    closed: Mutex<VecDeque<Closed>>,
    on_close: OnceLock<CloseHook>,
}

/// Told of every close: the connection's kind, why, and how long it lived.
pub type CloseHook = Box<dyn Fn(&'static str, CloseReason, Duration) + Send + Sync>;

/// What is known of one connection.
struct Record {
    id: u64,
    kind: &'static str,
    started: Instant,
    started_unix: f64,
    from_client: AtomicU64,
    from_upstream: AtomicU64,
    text: Mutex<Text>,
}

#[derive(Default)]
struct Text {
    state: &'static str,
    source: Option<SocketAddr>,
    target: Option<String>,
    upstream: Option<String>,
    reason: Option<String>,
    cause: Option<CloseReason>,
    extra: Vec<(&'static str, String)>,
}

struct Closed {
    record: Arc<Record>,
    duration: Duration,
    closed_at: Instant,
}

fn cut(s: impl Display) -> String {
    let mut s = s.to_string();
    if s.len() > MAX_FIELD {
        let mut end = MAX_FIELD;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

impl Connections {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a connection of `kind` (a listener or role name) from
    /// `source`; it is listed until the handle is dropped.
    pub fn open(&self, kind: &'static str, source: Option<SocketAddr>) -> Tracked {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let record = Arc::new(Record {
            id,
            kind,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
            from_client: AtomicU64::new(0),
            from_upstream: AtomicU64::new(0),
            text: Mutex::new(Text {
                state: "open",
                source,
                ..Text::default()
            }),
        });
        self.inner.live.lock().insert(id, record.clone());
        Tracked {
            record,
            table: self.inner.clone(),
        }
    }

    /// Sets the process's close hook (the first call wins): each binary's
    /// metrics count closes by kind and reason with it. It runs under the
    /// closed ring's lock, so it must not use this table.
    pub fn on_close(
        &self,
        hook: impl Fn(&'static str, CloseReason, Duration) + Send + Sync + 'static,
    ) {
        let _ = self.inner.on_close.set(Box::new(hook));
    }

    pub fn live_count(&self) -> usize {
        self.inner.live.lock().len()
    }

    /// The JSON document `/debug/connections` serves; `limit` caps the live
    /// entries listed (at most [`MAX_LISTED`]).
    pub fn render(&self, limit: Option<usize>) -> String {
        let limit = limit.unwrap_or(MAX_LISTED).min(MAX_LISTED);
        let now = Instant::now();
        let mut live: Vec<Arc<Record>> = self.inner.live.lock().values().cloned().collect();
        let total = live.len();
        live.sort_unstable_by_key(|r| r.id);
        live.truncate(limit);
        let live: Vec<Value> = live
            .iter()
            .map(|r| {
                let mut v = r.to_json();
                v.insert(
                    "age_seconds".into(),
                    json!(now.duration_since(r.started).as_secs_f64()),
                );
                Value::Object(v)
            })
            .collect();
        let closed: Vec<Value> = self
            .inner
            .closed
            .lock()
            .iter()
            .rev()
            .map(|c| {
                let mut v = c.record.to_json();
                v.insert("duration_seconds".into(), json!(c.duration.as_secs_f64()));
                v.insert(
                    "closed_seconds_ago".into(),
                    json!(now.duration_since(c.closed_at).as_secs_f64()),
                );
                Value::Object(v)
            })
            .collect();
        let doc = json!({
            "live_total": total,
            "live_listed": live.len(),
            "live": live,
            "closed_kept": MAX_CLOSED,
            "closed": closed,
        });
        let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The `/debug/connections` reply for a request with `query`.
    pub fn reply(&self, query: Option<&str>) -> daemon::endpoints::Reply {
        daemon::endpoints::Reply {
            content_type: "application/json",
            ..daemon::endpoints::Reply::text(
                http::StatusCode::OK,
                self.render(Self::limit_from_query(query)),
            )
        }
    }

    /// [`Connections::reply`], but only to a client on a loopback address
    /// ([`daemon::endpoints::Head::from_loopback`]: one in the same network
    /// namespace; `kubectl port-forward` qualifies), whatever the admin port
    /// is bound to (every interface, so that Prometheus can scrape it, or
    /// `::` with IPv4 clients arriving as `::ffff:127.0.0.1`). Others get
    /// 403.
    pub fn reply_local(&self, head: &daemon::endpoints::Head<'_>) -> daemon::endpoints::Reply {
        if head.from_loopback() {
            return self.reply(head.query);
        }
        daemon::endpoints::Reply::loopback_only("/debug/connections")
    }

    /// `limit` from a query string such as `limit=50`.
    pub fn limit_from_query(query: Option<&str>) -> Option<usize> {
        query?
            .split('&')
            .find_map(|kv| kv.strip_prefix("limit="))
            .and_then(|v| v.parse().ok())
    }
}

impl Record {
    fn to_json(&self) -> Map<String, Value> {
        let t = self.text.lock();
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("kind".into(), json!(self.kind));
        m.insert("source".into(), json!(t.source.map(|s| s.to_string())));
        m.insert("target".into(), json!(t.target));
        m.insert("upstream".into(), json!(t.upstream));
        m.insert("state".into(), json!(t.state));
        m.insert(
            "bytes_from_client".into(),
            json!(self.from_client.load(Ordering::Relaxed)),
        );
        m.insert(
            "bytes_from_upstream".into(),
            json!(self.from_upstream.load(Ordering::Relaxed)),
        );
        m.insert("started_unix".into(), json!(self.started_unix));
        if let Some(r) = &t.reason {
            m.insert("close_reason".into(), json!(r));
        }
        if let Some(c) = t.cause {
            m.insert("close_cause".into(), json!(c.label()));
        }
        for (k, v) in &t.extra {
            m.insert((*k).into(), json!(v));
        }
        m
    }
}

/// A registered connection; dropping it records the close.
pub struct Tracked {
    record: Arc<Record>,
    table: Arc<Table>,
}

impl Tracked {
    pub fn id(&self) -> u64 {
        self.record.id
    }

    /// The client as a PROXY protocol header named it.
    pub fn set_source(&self, source: SocketAddr) {
        self.record.text.lock().source = Some(source);
    }

    /// What the client asked for: an SNI host, a CONNECT authority, a dial
    /// destination.
    pub fn set_target(&self, target: impl Display) {
        self.record.text.lock().target = Some(cut(target));
    }

    /// Where it was sent.
    pub fn set_upstream(&self, upstream: impl Display) {
        self.record.text.lock().upstream = Some(cut(upstream));
    }

    /// A short word: `handshake`, `connecting`, `established`, ….
    pub fn set_state(&self, state: &'static str) {
        self.record.text.lock().state = state;
    }

    /// Why it ended, in words (the last call wins); without one the close
    /// reads `ended`. Counted as the cause [`Tracked::set_cause`] or
    /// [`Tracked::set_close`] gave, else as [`CloseReason::Other`].
    pub fn set_close_reason(&self, reason: impl Display) {
        self.record.text.lock().reason = Some(cut(reason));
    }

    /// Why it ended, as counted (the last call wins).
    pub fn set_cause(&self, cause: CloseReason) {
        self.record.text.lock().cause = Some(cause);
    }

    /// Why it ended: the counted cause and the words beside it.
    pub fn set_close(&self, cause: CloseReason, detail: impl Display) {
        let mut t = self.record.text.lock();
        t.cause = Some(cause);
        t.reason = Some(cut(detail));
    }

    /// Another field, such as an agent or stream id.
    pub fn set(&self, key: &'static str, value: impl Display) {
        let mut t = self.record.text.lock();
        let value = cut(value);
        if let Some(e) = t.extra.iter_mut().find(|(k, _)| *k == key) {
            e.1 = value;
        } else if t.extra.len() < MAX_EXTRA {
            t.extra.push((key, value));
        }
    }
}

impl Tally for Tracked {
    fn client_bytes(&self, n: u64) {
        self.record.from_client.fetch_add(n, Ordering::Relaxed);
    }

    fn upstream_bytes(&self, n: u64) {
        self.record.from_upstream.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.table.live.lock().remove(&self.record.id);
        let cause = {
            let mut t = self.record.text.lock();
            t.state = "closed";
            if t.reason.is_none() {
                t.reason = Some("ended".into());
            }
            *t.cause.get_or_insert(CloseReason::Other)
        };
        let now = Instant::now();
        let duration = now.duration_since(self.record.started);
        // Counted under the ring's lock: whoever sees the close in one sees
        // it in the other.
        let mut closed = self.table.closed.lock();
        if let Some(hook) = self.table.on_close.get() {
            hook(self.record.kind, cause, duration);
        }
        if closed.len() == MAX_CLOSED {
            closed.pop_front();
        }
        closed.push_back(Closed {
            record: self.record.clone(),
            duration,
            closed_at: now,
        });
    }
}

/// Two tallies counted together (a relay takes one).
pub struct Both<'a>(pub &'a dyn Tally, pub &'a dyn Tally);

impl Tally for Both<'_> {
    fn client_bytes(&self, n: u64) {
        self.0.client_bytes(n);
        self.1.client_bytes(n);
    }

    fn upstream_bytes(&self, n: u64) {
        self.0.upstream_bytes(n);
        self.1.upstream_bytes(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
    }

    #[test]
    fn live_then_closed_with_reason_and_bytes() {
        let c = Connections::new();
        let a = c.open("sni", Some(SocketAddr::from(([127, 0, 0, 1], 5000))));
        a.set_target("api.example.com");
        a.set_upstream("10.0.0.1:6443");
        a.set_state("established");
        a.set("cluster", "ns/api-secure");
        a.client_bytes(10);
        a.upstream_bytes(20);
        let b = c.open("tunnel", None);
        let doc = parse(&c.render(None));
        assert_eq!(doc["live_total"], 2);
        let first = &doc["live"][0];
        assert_eq!(first["source"], "127.0.0.1:5000");
        assert_eq!(first["target"], "api.example.com");
        assert_eq!(first["upstream"], "10.0.0.1:6443");
        assert_eq!(first["state"], "established");
        assert_eq!(first["cluster"], "ns/api-secure");
        assert_eq!(first["bytes_from_client"], 10);
        assert_eq!(first["bytes_from_upstream"], 20);
        assert!(first["age_seconds"].as_f64().is_some());
        a.set_close_reason("idle_timeout");
        drop(a);
        drop(b);
        let doc = parse(&c.render(None));
        assert_eq!(doc["live_total"], 0);
        // Newest first.
        assert_eq!(doc["closed"][0]["kind"], "tunnel");
        assert_eq!(doc["closed"][0]["close_reason"], "ended");
        assert_eq!(doc["closed"][1]["close_reason"], "idle_timeout");
        assert_eq!(doc["closed"][1]["state"], "closed");
        assert_eq!(doc["closed"][1]["bytes_from_upstream"], 20);
    }

    #[test]
    fn every_close_reaches_the_hook_with_its_cause() {
        let c = Connections::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.on_close(move |kind, cause, _| s.lock().push((kind, cause)));
        let a = c.open("grpc", None);
        a.set_close(CloseReason::DialRefused, "dial refused: no agent available");
        drop(a);
        let b = c.open("http-connect", None);
        b.set_cause(CloseReason::ClientClosed);
        b.set_close_reason("closed by the frontend");
        drop(b);
        drop(c.open("grpc", None));
        assert_eq!(
            *seen.lock(),
            [
                ("grpc", CloseReason::DialRefused),
                ("http-connect", CloseReason::ClientClosed),
                ("grpc", CloseReason::Other),
            ]
        );
        let doc = parse(&c.render(None));
        assert_eq!(doc["closed"][2]["close_cause"], "dial_refused");
        assert_eq!(
            doc["closed"][2]["close_reason"],
            "dial refused: no agent available"
        );
        assert_eq!(doc["closed"][1]["close_cause"], "client_closed");
        assert_eq!(doc["closed"][0]["close_cause"], "other");
        assert_eq!(doc["closed"][0]["close_reason"], "ended");
    }

    #[test]
    fn bounded_listing_ring_and_fields() {
        let c = Connections::new();
        let held: Vec<Tracked> = (0..20).map(|_| c.open("np", None)).collect();
        let doc = parse(&c.render(Connections::limit_from_query(Some("x=1&limit=5"))));
        assert_eq!(doc["live_total"], 20);
        assert_eq!(doc["live"].as_array().map(Vec::len), Some(5));
        assert_eq!(doc["live"][0]["id"], 1, "oldest first");
        held[0].set_target("x".repeat(10_000));
        let doc = parse(&c.render(Some(1)));
        assert_eq!(
            doc["live"][0]["target"].as_str().map(str::len),
            Some(MAX_FIELD)
        );
        for i in 0..20 {
            held[0].set(
                ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"][i % 10],
                i,
            );
        }
        drop(held);
        for _ in 0..MAX_CLOSED {
            drop(c.open("np", None));
        }
        let doc = parse(&c.render(None));
        assert_eq!(doc["closed"].as_array().map(Vec::len), Some(MAX_CLOSED));
        assert_eq!(c.live_count(), 0);
        assert!(c.inner.closed.lock().len() <= MAX_CLOSED);
    }

    #[test]
    fn served_only_to_clients_on_a_loopback_address() {
        let c = Connections::new();
        let _held = c.open("np", None);
        let head = |peer: &str| {
            let method = http::Method::GET;
            let h = daemon::endpoints::Head {
                method: &method,
                path: "/debug/connections",
                query: None,
                local: "[::]:8095".parse().ok(),
                peer: peer.parse().ok(),
            };
            c.reply_local(&h).status
        };
        assert_eq!(head("127.0.0.1:40000"), http::StatusCode::OK);
        assert_eq!(head("127.0.0.2:40000"), http::StatusCode::OK);
        assert_eq!(head("[::1]:40000"), http::StatusCode::OK);
        // An IPv4 client of a listener on `::`.
        assert_eq!(head("[::ffff:127.0.0.1]:40000"), http::StatusCode::OK);
        // Clients elsewhere (the admin port bound to every interface for
        // scrapes), IPv4-mapped or not.
        assert_eq!(head("10.244.0.7:40000"), http::StatusCode::FORBIDDEN);
        assert_eq!(
            head("[::ffff:10.244.0.7]:40000"),
            http::StatusCode::FORBIDDEN
        );
        assert_eq!(head("[fd00::7]:40000"), http::StatusCode::FORBIDDEN);
        assert_eq!(head("[::ffff:7f00:1]:40000"), http::StatusCode::OK);
    }
}
