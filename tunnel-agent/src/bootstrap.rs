//! The Envoy v3 bootstrap KKP renders into the `envoy-agent` ConfigMap
//! (`--config-path /etc/envoy/envoy.yaml`), read strictly: static resources
//! only, and only the fields KKP's template writes, each understood. Any
//! other field is an error naming it (serde's `deny_unknown_fields`), as Envoy
//! itself rejects unknown fields, so nothing that would change behaviour is
//! silently ignored.
//!
//! What it means for the agent:
//! * each listener with a `tcp_proxy` filter and `tunneling_config.hostname`
//!   is a tunnel listener: its connections become CONNECT streams with that
//!   authority;
//! * the cluster those filters name is the seed: its one endpoint (resolved
//!   again on every connect for `LOGICAL_DNS`), its `connect_timeout`, and its
//!   HTTP/2 `connection_keepalive` (PING interval and timeout). It must be
//!   HTTP/2: Envoy would fall back to HTTP/1.1 CONNECT, which the seed side
//!   here does not need and the agent does not speak;
//! * a listener with an HTTP connection manager whose routes go to the admin
//!   address is the stats listener: those path prefixes (KKP: `/stats`) are
//!   answered there (`/stats`, `/stats/prometheus`) without an admin port.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use daemon::authority::ConnectAuthority;
use serde::Deserialize;

use crate::limits::{MAX_CONFIG_BYTES, MAX_FLOW_DEPTH, MAX_LISTENERS};

const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const HTTP_OPTIONS_KEY: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_OPTIONS: &str =
    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("brackets or braces nested deeper than {MAX_FLOW_DEPTH}")]
    TooDeep,
    #[error("{0}")]
    Syntax(String),
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> BootstrapError {
    BootstrapError::Invalid {
        path: path.into(),
        message: message.into(),
    }
}

/// A listener whose connections are tunneled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelListener {
    pub name: String,
    pub addr: SocketAddr,
    pub authority: ConnectAuthority,
}

/// The listener serving stats (KKP: `service_stats` on 0.0.0.0:8002).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsListener {
    pub name: String,
    pub addr: SocketAddr,
    /// Path prefixes routed to the admin interface (KKP: `/stats`).
    pub prefixes: Vec<String>,
}

/// The seed's tunneling endpoint (KKP: `proxy_cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedCluster {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub connect_timeout: Duration,
    /// HTTP/2 PING interval and timeout, when configured.
    pub keepalive: Option<(Duration, Duration)>,
}

/// What the bootstrap asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub admin: Option<SocketAddr>,
    pub stats: Option<StatsListener>,
    pub tunnels: Vec<TunnelListener>,
    pub seed: SeedCluster,
}

// The file's shape. Every struct denies unknown fields.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    admin: Option<Admin>,
    static_resources: StaticResources,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Admin {
    /// Where Envoy logs admin requests; no admin interface is served here.
    #[serde(default)]
    #[allow(dead_code)]
    access_log_path: Option<String>,
    address: Address,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticResources {
    #[serde(default)]
    listeners: Vec<Listener>,
    #[serde(default)]
    clusters: Vec<Cluster>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Address {
    socket_address: SocketAddress,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SocketAddress {
    #[serde(default)]
    protocol: Option<String>,
    address: String,
    port_value: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Listener {
    name: String,
    address: Address,
    filter_chains: Vec<FilterChain>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterChain {
    filters: Vec<Filter>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Filter {
    /// Envoy picks the filter by `typed_config`'s type, not by this name.
    #[allow(dead_code)]
    name: String,
    typed_config: FilterConfig,
}

/// A network filter's `typed_config`: the fields of both filters understood
/// (tcp_proxy, HTTP connection manager), read into typed fields at once and
/// checked against its `@type` afterwards ([`FilterConfig::only`]). Read as
/// a generic YAML value first, as it once was, aliases expanded into a tree
/// of up to a hundred times the file's events per alias level within
/// serde_yaml_ng's repetition limit: an 8 KiB file took 0.8 s and a
/// 64 KiB one could take gigabytes. Typed fields refuse an alias of the
/// wrong shape at once, and unknown fields are skipped unread (aliases
/// unexpanded) and named in the error.
#[derive(Default)]
struct FilterConfig {
    kind: Option<String>,
    /// Names the stats; ours keep KKP's (`tcp_stats`, `service_stats`).
    #[allow(dead_code)]
    stat_prefix: Option<String>,
    cluster: Option<String>,
    tunneling_config: Option<TunnelingConfig>,
    route_config: Option<RouteConfig>,
    http_filters: Option<Vec<HttpFilter>>,
    /// The fields present, in order, unknown ones included.
    fields: Vec<String>,
}

const TCP_PROXY_FIELDS: &[&str] = &["@type", "stat_prefix", "cluster", "tunneling_config"];
const HCM_FIELDS: &[&str] = &["@type", "stat_prefix", "route_config", "http_filters"];

impl FilterConfig {
    /// The first field present that is not one of `fields` (those of the
    /// filter its `@type` names), as serde's `deny_unknown_fields` would
    /// name it, and the first of them missing.
    fn only(&self, fields: &[&str]) -> Result<(), String> {
        if let Some(f) = self.fields.iter().find(|f| !fields.contains(&f.as_str())) {
            return Err(format!(
                "unknown field `{f}`, expected one of {}",
                fields
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        match fields.iter().find(|f| !self.fields.iter().any(|g| g == *f)) {
            Some(f) => Err(format!("missing field `{f}`")),
            None => Ok(()),
        }
    }
}

impl<'de> Deserialize<'de> for FilterConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{Error, IgnoredAny, MapAccess, Visitor};

        fn put<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
            m: &mut A,
            slot: &mut Option<T>,
            name: &'static str,
        ) -> Result<(), A::Error> {
            if slot.is_some() {
                return Err(A::Error::duplicate_field(name));
            }
            *slot = Some(m.next_value()?);
            Ok(())
        }

        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FilterConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a filter's typed_config mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<FilterConfig, A::Error> {
                let mut c = FilterConfig::default();
                while let Some(key) = m.next_key::<String>()? {
                    match key.as_str() {
                        "@type" => put(&mut m, &mut c.kind, "@type")?,
                        "stat_prefix" => put(&mut m, &mut c.stat_prefix, "stat_prefix")?,
                        "cluster" => put(&mut m, &mut c.cluster, "cluster")?,
                        "tunneling_config" => {
                            put(&mut m, &mut c.tunneling_config, "tunneling_config")?
                        }
                        "route_config" => put(&mut m, &mut c.route_config, "route_config")?,
                        "http_filters" => put(&mut m, &mut c.http_filters, "http_filters")?,
                        _ => {
                            if c.fields.contains(&key) {
                                return Err(A::Error::custom(format!("duplicate field `{key}`")));
                            }
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                    c.fields.push(key);
                }
                Ok(c)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TunnelingConfig {
    hostname: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteConfig {
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    virtual_hosts: Vec<VirtualHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VirtualHost {
    #[allow(dead_code)]
    name: String,
    domains: Vec<String>,
    routes: Vec<Route>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Route {
    #[serde(rename = "match")]
    matcher: RouteMatch,
    route: RouteAction,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteMatch {
    prefix: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteAction {
    cluster: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFilter {
    #[allow(dead_code)]
    name: String,
    typed_config: TypedOnly,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedOnly {
    #[serde(rename = "@type")]
    kind: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cluster {
    name: String,
    connect_timeout: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    typed_extension_protocol_options:
        Option<std::collections::BTreeMap<String, HttpProtocolOptions>>,
    load_assignment: LoadAssignment,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpProtocolOptions {
    #[serde(rename = "@type")]
    kind: String,
    explicit_http_config: ExplicitHttpConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplicitHttpConfig {
    http2_protocol_options: Http2Options,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Http2Options {
    #[serde(default)]
    connection_keepalive: Option<Keepalive>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Keepalive {
    interval: String,
    timeout: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadAssignment {
    #[allow(dead_code)]
    cluster_name: String,
    endpoints: Vec<LocalityEndpoints>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalityEndpoints {
    lb_endpoints: Vec<LbEndpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LbEndpoint {
    endpoint: Endpoint,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Endpoint {
    address: Address,
}

/// A protobuf JSON duration: decimal seconds with an `s` suffix (`5s`, `0.1s`).
fn duration(path: &str, s: &str) -> Result<Duration, BootstrapError> {
    let bad = || invalid(path, format!("{s:?} is not a duration like \"5s\""));
    let secs = s.strip_suffix('s').ok_or_else(bad)?;
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let v: f64 = secs.parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(v).map_err(|_| bad())
}

fn port(path: &str, v: u32) -> Result<u16, BootstrapError> {
    u16::try_from(v).map_err(|_| invalid(path, format!("port_value {v} is not a port")))
}

fn tcp(path: &str, a: &SocketAddress) -> Result<(), BootstrapError> {
    match a.protocol.as_deref() {
        None | Some("TCP") => Ok(()),
        Some(p) => Err(invalid(
            path,
            format!("protocol {p}: only TCP is supported"),
        )),
    }
}

/// A listener's bind address: an IP, as Envoy requires.
fn bind_addr(path: &str, a: &Address) -> Result<SocketAddr, BootstrapError> {
    let sa = &a.socket_address;
    tcp(path, sa)?;
    let ip: IpAddr = sa.address.parse().map_err(|_| {
        invalid(
            path,
            format!("address {:?} is not an IP address", sa.address),
        )
    })?;
    Ok(SocketAddr::new(ip, port(path, sa.port_value)?))
}

enum Role {
    Tunnel {
        cluster: String,
        authority: ConnectAuthority,
    },
    Stats {
        routes: Vec<(String, String)>,
    },
}

fn listener_role(path: &str, l: &Listener) -> Result<Role, BootstrapError> {
    let [chain] = l.filter_chains.as_slice() else {
        return Err(invalid(path, "exactly one filter chain is supported"));
    };
    let [filter] = chain.filters.as_slice() else {
        return Err(invalid(path, "exactly one filter is supported"));
    };
    let path = format!("{path}.filter_chains[0].filters[0].typed_config");
    let c = &filter.typed_config;
    let kind = c
        .kind
        .as_deref()
        .ok_or_else(|| invalid(&path, "no \"@type\""))?;
    // `only` saw the required fields; these name one should it ever not.
    let missing = |f: &str| invalid(&path, format!("missing field `{f}`"));
    match kind {
        TCP_PROXY => {
            c.only(TCP_PROXY_FIELDS).map_err(|e| invalid(&path, e))?;
            let cluster = c.cluster.as_ref().ok_or_else(|| missing("cluster"))?;
            let tunneling =
                (c.tunneling_config.as_ref()).ok_or_else(|| missing("tunneling_config"))?;
            let authority = ConnectAuthority::parse(&tunneling.hostname)
                .map_err(|e| invalid(format!("{path}.tunneling_config.hostname"), e.to_string()))?;
            Ok(Role::Tunnel {
                cluster: cluster.clone(),
                authority,
            })
        }
        HCM => {
            c.only(HCM_FIELDS).map_err(|e| invalid(&path, e))?;
            let route_config = (c.route_config.as_ref()).ok_or_else(|| missing("route_config"))?;
            let http_filters = (c.http_filters.as_ref()).ok_or_else(|| missing("http_filters"))?;
            match http_filters.as_slice() {
                [f] if f.typed_config.kind == ROUTER => {}
                _ => {
                    return Err(invalid(
                        format!("{path}.http_filters"),
                        "only the router filter is supported",
                    ));
                }
            }
            let mut routes = Vec::new();
            for (i, vh) in route_config.virtual_hosts.iter().enumerate() {
                if vh.domains.iter().all(|d| d != "*") {
                    return Err(invalid(
                        format!("{path}.route_config.virtual_hosts[{i}].domains"),
                        "only the domain \"*\" is supported",
                    ));
                }
                routes.extend(
                    vh.routes
                        .iter()
                        .map(|r| (r.matcher.prefix.clone(), r.route.cluster.clone())),
                );
            }
            Ok(Role::Stats { routes })
        }
        other => Err(invalid(
            format!("{path}.@type"),
            format!(
                "{other}: only tcp_proxy (tunneling) and the stats HTTP connection manager are supported"
            ),
        )),
    }
}

/// The one endpoint of a cluster.
fn endpoint<'a>(path: &str, c: &'a Cluster) -> Result<&'a SocketAddress, BootstrapError> {
    let all: Vec<&SocketAddress> = c
        .load_assignment
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| &e.endpoint.address.socket_address)
        .collect();
    match all.as_slice() {
        [one] => {
            tcp(path, one)?;
            Ok(one)
        }
        _ => Err(invalid(
            format!("{path}.load_assignment"),
            "exactly one endpoint is supported",
        )),
    }
}

fn seed_cluster(path: &str, c: &Cluster) -> Result<SeedCluster, BootstrapError> {
    if !matches!(c.kind.as_str(), "LOGICAL_DNS" | "STRICT_DNS" | "STATIC") {
        return Err(invalid(
            format!("{path}.type"),
            format!("{}: LOGICAL_DNS, STRICT_DNS or STATIC expected", c.kind),
        ));
    }
    let connect_timeout = duration(&format!("{path}.connect_timeout"), &c.connect_timeout)?;
    let options = c
        .typed_extension_protocol_options
        .as_ref()
        .and_then(|m| m.get(HTTP_OPTIONS_KEY))
        .ok_or_else(|| {
            invalid(
                path,
                "tunneling needs typed_extension_protocol_options with explicit_http_config.http2_protocol_options (HTTP/1.1 CONNECT is not supported)",
            )
        })?;
    if let Some(other) = c
        .typed_extension_protocol_options
        .iter()
        .flat_map(|m| m.keys())
        .find(|k| *k != HTTP_OPTIONS_KEY)
    {
        return Err(invalid(
            format!("{path}.typed_extension_protocol_options"),
            format!("unknown field `{other}`"),
        ));
    }
    if options.kind != HTTP_OPTIONS {
        return Err(invalid(
            format!("{path}.typed_extension_protocol_options"),
            format!("\"@type\" {} is not {HTTP_OPTIONS}", options.kind),
        ));
    }
    let keepalive = match &options
        .explicit_http_config
        .http2_protocol_options
        .connection_keepalive
    {
        None => None,
        Some(k) => {
            let p = format!(
                "{path}.typed_extension_protocol_options.explicit_http_config.http2_protocol_options.connection_keepalive"
            );
            let interval = duration(&format!("{p}.interval"), &k.interval)?;
            let timeout = duration(&format!("{p}.timeout"), &k.timeout)?;
            if interval.is_zero() || timeout.is_zero() {
                return Err(invalid(p, "interval and timeout must be positive"));
            }
            Some((interval, timeout))
        }
    };
    let ep = endpoint(path, c)?;
    if ep.address.is_empty() {
        return Err(invalid(path, "the endpoint has no address"));
    }
    Ok(SeedCluster {
        name: c.name.clone(),
        host: ep.address.clone(),
        port: port(path, ep.port_value)?,
        connect_timeout,
        keepalive,
    })
}

/// The deepest nesting of `[` and `{`, counted before the YAML scanner (whose
/// time grows faster than linearly with it) sees the file. Brackets inside
/// scalars count too: that only over-counts, and no bootstrap nests deep.
fn flow_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in bytes {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Parses and checks a bootstrap; `bytes` is the whole file.
pub fn parse(bytes: &[u8]) -> Result<Bootstrap, BootstrapError> {
    parse_any(bytes)?.ok_or_else(|| invalid("static_resources.listeners", "no tunneling listener"))
}

/// KKP's nodeport-proxy pods run Envoy with a bootstrap that fetches
/// everything from envoy-manager over xDS; named in the error when that file
/// is given, since it means only half of that pod was swapped.
const XDS_HINT: &str = "this is the xDS bootstrap of KKP's nodeport-proxy pod, which needs KKP's envoy-manager; with nodeport-proxy's KKP image as the envoy-manager image, /etc/envoy/envoy.yaml declares nothing and this container only waits (docs/kkp.md)";

/// Like [`parse`], but a bootstrap that declares no listener and no cluster
/// at all is `None`: nothing to serve (the `envoy` container of KKP's
/// nodeport-proxy pod, whose traffic nodeport-proxy serves from the
/// envoy-manager container).
pub fn parse_any(bytes: &[u8]) -> Result<Option<Bootstrap>, BootstrapError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(BootstrapError::TooLarge);
    }
    if flow_depth(bytes) > MAX_FLOW_DEPTH {
        return Err(BootstrapError::TooDeep);
    }
    // YAML 1.2 scalars (`yes` is no boolean), a repeated key left to the
    // field's visitor (named in its error), the error on one line.
    let options = serde_saphyr::options! {
        strict_booleans: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        with_snippet: false,
    };
    let file: File = serde_saphyr::from_slice_with_options(bytes, options).map_err(|e| {
        let e = e.to_string();
        if e.contains("unknown field `dynamic_resources`") {
            BootstrapError::Syntax(format!("{e} ({XDS_HINT})"))
        } else {
            BootstrapError::Syntax(e)
        }
    })?;
    let admin = match &file.admin {
        Some(a) => Some(bind_addr("admin.address", &a.address)?),
        None => None,
    };
    let resources = &file.static_resources;
    if resources.listeners.is_empty() && resources.clusters.is_empty() {
        return Ok(None);
    }
    if resources.listeners.len() > MAX_LISTENERS {
        return Err(invalid(
            "static_resources.listeners",
            format!("more than {MAX_LISTENERS} listeners"),
        ));
    }
    let mut stats = None;
    let mut tunnels = Vec::new();
    let mut seed_name: Option<String> = None;
    for (i, l) in resources.listeners.iter().enumerate() {
        let path = format!("static_resources.listeners[{i}] ({})", l.name);
        let addr = bind_addr(&format!("{path}.address"), &l.address)?;
        match listener_role(&path, l)? {
            Role::Tunnel { cluster, authority } => {
                match &seed_name {
                    Some(s) if *s != cluster => {
                        return Err(invalid(
                            path,
                            format!(
                                "uses cluster {cluster}, but an earlier listener uses {s}: every listener must tunnel through one cluster"
                            ),
                        ));
                    }
                    _ => seed_name = Some(cluster),
                }
                tunnels.push(TunnelListener {
                    name: l.name.clone(),
                    addr,
                    authority,
                });
            }
            Role::Stats { routes } => {
                if stats.is_some() {
                    return Err(invalid(path, "a second stats listener"));
                }
                let mut prefixes = Vec::new();
                for (prefix, cluster) in routes {
                    let c = resources
                        .clusters
                        .iter()
                        .find(|c| c.name == cluster)
                        .ok_or_else(|| {
                            invalid(&path, format!("route to unknown cluster {cluster}"))
                        })?;
                    let cpath = format!("static_resources.clusters ({cluster})");
                    let ep = endpoint(&cpath, c)?;
                    let target: Option<SocketAddr> =
                        ep.address.parse::<IpAddr>().ok().and_then(|ip| {
                            u16::try_from(ep.port_value)
                                .ok()
                                .map(|p| SocketAddr::new(ip, p))
                        });
                    if admin.is_none() || target != admin {
                        return Err(invalid(
                            cpath,
                            "only routes to the admin address are served (stats)",
                        ));
                    }
                    prefixes.push(prefix);
                }
                stats = Some(StatsListener {
                    name: l.name.clone(),
                    addr,
                    prefixes,
                });
            }
        }
    }
    let seed_name =
        seed_name.ok_or_else(|| invalid("static_resources.listeners", "no tunneling listener"))?;
    let seed = resources
        .clusters
        .iter()
        .find(|c| c.name == seed_name)
        .ok_or_else(|| {
            invalid(
                "static_resources.clusters",
                format!("no cluster {seed_name}"),
            )
        })?;
    let seed = seed_cluster(&format!("static_resources.clusters ({seed_name})"), seed)?;
    // Clusters nothing uses must still be ones this file can describe.
    for c in &resources.clusters {
        let path = format!("static_resources.clusters ({})", c.name);
        if c.name != seed.name {
            if !matches!(c.kind.as_str(), "LOGICAL_DNS" | "STRICT_DNS" | "STATIC") {
                return Err(invalid(
                    format!("{path}.type"),
                    format!("{}: LOGICAL_DNS, STRICT_DNS or STATIC expected", c.kind),
                ));
            }
            duration(&format!("{path}.connect_timeout"), &c.connect_timeout)?;
            endpoint(&path, c)?;
        }
    }
    Ok(Some(Bootstrap {
        admin,
        stats,
        tunnels,
        seed,
    }))
}

/// The file's bytes, at most [`MAX_CONFIG_BYTES`] of them.
pub fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    daemon::file_watch::read_bounded(path, MAX_CONFIG_BYTES as u64)
        .map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Reads and parses the file at `path`.
pub fn load(path: &std::path::Path) -> Result<Bootstrap, String> {
    parse(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
