use super::*;

/// Rendered by KKP's own template (testdata/render), loopback addresses.
const KKP: &str = include_str!("../testdata/kkp-envoy-agent.yaml");
const KKP_OPENVPN: &str = include_str!("../testdata/kkp-envoy-agent-openvpn.yaml");

fn ok(text: &str) -> Bootstrap {
    parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

fn err(text: &str) -> String {
    match parse(text.as_bytes()) {
        Ok(b) => panic!("accepted: {b:?}"),
        Err(e) => e.to_string(),
    }
}

/// `KKP` with `anchor` (which must be there) replaced by `replacement`.
fn kkp_with(anchor: &str, replacement: &str) -> String {
    assert!(KKP.contains(anchor), "fixture lacks {anchor:?}");
    KKP.replacen(anchor, replacement, 1)
}

const TCP: &str = "          stat_prefix: tcp_stats\n";
const KEEPALIVE: &str = "                interval: 30s\n                timeout: 5s\n";
const H2: &str = "            http2_protocol_options:\n";
const CLUSTER: &str = "      connect_timeout: 5s\n";
const ADMIN: &str = "admin:\n";
const LISTENER: &str = "        port_value: 6443\n";

#[test]
fn kkp_rendered_config_is_understood() {
    let b = ok(KKP);
    assert_eq!(
        b.admin,
        Some("127.0.0.1:9902".parse().unwrap_or_else(|e| panic!("{e}")))
    );
    let stats = b.stats.unwrap_or_else(|| panic!("no stats listener"));
    assert_eq!(stats.name, "service_stats");
    assert_eq!(stats.addr.to_string(), "0.0.0.0:8002");
    assert_eq!(stats.prefixes, ["/stats"]);
    assert_eq!(b.tunnels.len(), 1);
    assert_eq!(b.tunnels[0].name, "listener_0");
    assert_eq!(b.tunnels[0].addr.to_string(), "127.0.0.1:6443");
    assert_eq!(
        b.tunnels[0].authority.to_string(),
        "apiserver-external.cluster-abc.svc.cluster.local:443"
    );
    assert_eq!(
        b.seed,
        SeedCluster {
            name: "proxy_cluster".into(),
            host: "localhost".into(),
            port: 8088,
            connect_timeout: Duration::from_secs(5),
            keepalive: Some((Duration::from_secs(30), Duration::from_secs(5))),
            max_concurrent_streams: None,
            max_requests_per_connection: None,
            idle_timeout: None,
        }
    );
    // KKP's template sets nothing the agent ignores: nothing is reported
    // but the deprecated admin field Envoy warns about too.
    assert_eq!(b.notes, kkp_notes());
    let b = ok(KKP_OPENVPN);
    assert_eq!(b.tunnels.len(), 2);
    assert_eq!(b.tunnels[1].addr.to_string(), "127.0.0.1:1194");
    assert_eq!(
        b.tunnels[1].authority.to_string(),
        "openvpn-server.cluster-abc.svc.cluster.local:1194"
    );
    assert_eq!(b.notes, kkp_notes());
    // Another stored version of KKP's template PINGs every 5 s with a 2 s
    // timeout.
    let b = ok(&kkp_with(
        KEEPALIVE,
        "                interval: 5s\n                timeout: 2s\n",
    ));
    assert_eq!(
        b.seed.keepalive,
        Some((Duration::from_secs(5), Duration::from_secs(2)))
    );
    assert_eq!(b.notes, kkp_notes());
}

/// What KKP's template gets reported: `admin.access_log_path`, which Envoy
/// deprecates (and warns about) in favour of `admin.access_log`.
fn kkp_notes() -> Notes {
    Notes {
        deprecated: vec!["admin.access_log_path".into()],
        ..Notes::default()
    }
}

/// A field Envoy's own schema does not have is refused, as Envoy refuses
/// it, naming the field, its place and the message it is not in.
#[test]
fn a_field_envoy_does_not_know_is_refused_naming_it() {
    let cases = [
        (
            ADMIN,
            "admin:\n  profile_pathx: /tmp/x\n",
            "admin.profile_pathx",
        ),
        (
            "static_resources:\n",
            "overload_managerx: {}\nstatic_resources:\n",
            "overload_managerx",
        ),
        (
            TCP,
            "          stat_prefix: tcp_stats\n          max_connect_attemps: 5\n",
            "TcpProxy has no such field",
        ),
        (
            "            hostname: apiserver",
            "            use_posst: true\n            hostname: apiserver",
            "use_posst",
        ),
        (
            CLUSTER,
            "      connect_timeout: 5s\n      dns_lookup_famly: V6_ONLY\n",
            "static_resources.clusters[0].dns_lookup_famly",
        ),
        (
            KEEPALIVE,
            "                interval: 30s\n                timeout: 5s\n                jitter: {value: 50}\n",
            "KeepaliveSettings has no such field",
        ),
        (
            LISTENER,
            "        port_value: 6443\n        ipv4compat: true\n",
            "ipv4compat",
        ),
    ];
    for (anchor, replacement, want) in cases {
        let e = err(&kkp_with(anchor, replacement));
        assert!(
            e.contains(want) && e.contains("unknown field"),
            "{want}: {e}"
        );
    }
}

/// A value Envoy's parser or its validation refuses is refused too.
#[test]
fn a_value_envoy_would_refuse_is_refused() {
    let cases = [
        // Wrong types (protobuf's JSON mapping).
        (
            "port_value: 6443",
            "port_value: [6443]",
            "expected an unsigned 32-bit integer",
        ),
        (
            "port_value: 6443",
            "port_value: -1",
            "expected an unsigned 32-bit integer",
        ),
        (
            "connect_timeout: 5s",
            "connect_timeout: 5",
            "expected a duration",
        ),
        (
            "type: LOGICAL_DNS",
            "type: LOGICAL_DNZ",
            "is not a value of envoy.config.cluster.v3.Cluster.DiscoveryType",
        ),
        (
            "cluster: \"proxy_cluster\"",
            "cluster: {name: x}",
            "expected a string",
        ),
        ("domains: [\"*\"]", "domains: \"*\"", "expected a list"),
        // PGV rules of Envoy's API.
        (
            "stat_prefix: tcp_stats",
            "stat_prefix: \"\"",
            "needs at least 1 character",
        ),
        (
            KEEPALIVE,
            "                interval: 30s\n",
            "connection_keepalive.timeout: is required",
        ),
        (
            H2,
            "            http2_protocol_options:\n              max_concurrent_streams: 0\n",
            "max_concurrent_streams: must be at least 1",
        ),
        // Two alternatives of one oneof.
        (
            "          cluster: \"proxy_cluster\"\n",
            "          cluster: \"proxy_cluster\"\n          weighted_clusters: {clusters: [{name: a, weight: 1}]}\n",
            "alternatives",
        ),
        // Set twice, by its proto and its JSON name.
        (
            CLUSTER,
            "      connect_timeout: 5s\n      connectTimeout: 5s\n",
            "set twice",
        ),
    ];
    for (anchor, replacement, want) in cases {
        let e = err(&kkp_with(anchor, replacement));
        assert!(e.contains(want), "{replacement:?}: want {want:?} in {e}");
    }
    // The JSON names Envoy accepts are accepted.
    let b = ok(&kkp_with("connect_timeout: 5s", "connectTimeout: 7s"));
    assert_eq!(b.seed.connect_timeout, Duration::from_secs(7));
}

/// Fields Envoy knows that the agent does not act on are accepted, listed
/// (each once, where it is; nothing inside it again) and never refuse the
/// file: what a newer KKP adds to its template cannot stop the agent.
#[test]
fn fields_envoy_knows_are_ignored_and_reported() {
    let text = kkp_with(ADMIN, "admin:\n  profile_path: /tmp/x\n");
    let text = text.replacen(
        "static_resources:\n",
        "overload_manager: {refresh_interval: 1s, resource_monitors: [{name: envoy.resource_monitors.fixed_heap, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig, max_heap_size_bytes: 1000000}}]}\nstatic_resources:\n",
        1,
    );
    let text = text.replacen(
        TCP,
        "          stat_prefix: tcp_stats\n          max_connect_attempts: 5\n          access_log: [{name: envoy.access_loggers.stdout, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog}}]\n",
        1,
    );
    let text = text.replacen(
        CLUSTER,
        "      connect_timeout: 5s\n      dns_lookup_family: V4_ONLY\n      circuit_breakers: {thresholds: [{max_connections: 2048}]}\n",
        1,
    );
    let text = text.replacen(
        KEEPALIVE,
        "                interval: 30s\n                timeout: 5s\n                interval_jitter: {value: 15}\n",
        1,
    );
    let text = text.replacen(
        "          stat_prefix: service_stats\n",
        "          stat_prefix: service_stats\n          codec_type: AUTO\n",
        1,
    );
    let b = ok(&text);
    assert_eq!(
        b.notes.ignored,
        [
            "admin.profile_path",
            "overload_manager",
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.codec_type",
            "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.max_connect_attempts",
            "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.access_log",
            "static_resources.clusters[0].dns_lookup_family",
            "static_resources.clusters[0].circuit_breakers",
            "static_resources.clusters[0].typed_extension_protocol_options[envoy.extensions.upstreams.http.v3.HttpProtocolOptions].explicit_http_config.http2_protocol_options.connection_keepalive.interval_jitter",
        ]
    );
    assert_eq!(b.seed, ok(KKP).seed);
    assert_eq!(b.tunnels, ok(KKP).tunnels);
}

/// Fields that Envoy's API gained after Envoy 1.32 (absent from
/// go-control-plane's envoy module v1.32.4, present in later ones): a KKP
/// that renders them with a newer Envoy still runs this agent, each
/// reported; the one among them whose meaning the agent cannot honour
/// refuses the file, naming it.
#[test]
fn fields_of_newer_envoy_versions_are_accepted_or_refused_by_name() {
    let text = kkp_with(
        ADMIN,
        // Admin.allow_paths (v1.37.0).
        "admin:\n  allow_paths: [{prefix: /stats}]\n",
    )
    .replacen(
        "static_resources:\n",
        // Bootstrap.enable_worker_cpu_affinity (v1.40.0).
        "enable_worker_cpu_affinity: false\nstatic_resources:\n",
        1,
    )
    .replacen(
        TCP,
        // TcpProxy.upstream_connect_mode, max_early_data_bytes (v1.37.0).
        "          stat_prefix: tcp_stats\n          upstream_connect_mode: IMMEDIATE\n          max_early_data_bytes: 0\n",
        1,
    )
    .replacen(
        H2,
        // Http2ProtocolOptions.max_header_field_size_kb, disallow_obs_text
        // (v1.38.0), stream_reset_burst (v1.40.0).
        "            http2_protocol_options:\n              max_header_field_size_kb: 64\n              disallow_obs_text: true\n              stream_reset_burst: 100\n",
        1,
    );
    let b = ok(&text);
    let short: Vec<&str> = b
        .notes
        .ignored
        .iter()
        .map(|p| p.rsplit('.').next().unwrap_or(p))
        .collect();
    assert_eq!(
        short,
        [
            "allow_paths",
            "enable_worker_cpu_affinity",
            "upstream_connect_mode",
            "max_early_data_bytes",
            "max_header_field_size_kb",
            "disallow_obs_text",
            "stream_reset_burst",
        ]
    );
    assert_eq!(b.seed, ok(KKP).seed);
    // SocketAddress.network_namespace_filepath (v1.35.0): bind in another
    // network namespace, which the agent would not do.
    let e = err(&kkp_with(
        LISTENER,
        "        port_value: 6443\n        network_namespace_filepath: /run/netns/x\n",
    ));
    assert!(
        e.contains("network_namespace_filepath") && e.contains("cannot be honoured"),
        "{e}"
    );
    // A value Envoy's validation refuses in a new field is refused too:
    // max_early_data_bytes is at most 1 MiB (PGV lte 1048576).
    let e = err(&kkp_with(
        TCP,
        "          stat_prefix: tcp_stats\n          max_early_data_bytes: 2000000\n",
    ));
    assert!(e.contains("max_early_data_bytes"), "{e}");
}

/// Fields whose meaning the agent cannot honour safely refuse the file,
/// each naming the field, where it is, and why (docs/nodeport-proxy.md).
#[test]
fn fields_the_agent_cannot_honour_refuse_the_file() {
    let cases = [
        (
            CLUSTER,
            "      connect_timeout: 5s\n      transport_socket: {name: envoy.transport_sockets.tls, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext}}\n",
            "static_resources.clusters[0].transport_socket",
        ),
        (
            "    filter_chains:\n    - filters:\n      - name: tcp\n",
            "    filter_chains:\n    - filter_chain_match: {destination_port: 1}\n      filters:\n      - name: tcp\n",
            "filter_chain_match",
        ),
        (
            "            hostname: apiserver",
            "            use_post: true\n            hostname: apiserver",
            "use_post",
        ),
        (
            "            hostname: apiserver",
            "            headers_to_add: [{header: {key: x-token, value: secret}}]\n            hostname: apiserver",
            "headers_to_add",
        ),
        (
            "    address:\n      socket_address:\n        protocol: TCP\n        address: 127.0.0.1\n        port_value: 6443\n",
            "    address:\n      socket_address:\n        protocol: TCP\n        address: 127.0.0.1\n        port_value: 6443\n    listener_filters: [{name: envoy.filters.listener.tls_inspector, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}]\n",
            "listener_filters",
        ),
        (
            "          explicit_http_config:\n            http2_protocol_options:\n              connection_keepalive:\n                interval: 30s\n                timeout: 5s\n",
            "          explicit_http_config:\n            http_protocol_options: {}\n",
            "http_protocol_options",
        ),
        (
            "                  prefix: \"/stats\"\n",
            "                  path: \"/stats/prometheus\"\n",
            "match.path",
        ),
    ];
    for (anchor, replacement, want) in cases {
        let e = err(&kkp_with(anchor, replacement));
        assert!(
            e.contains(want) && e.contains("cannot be honoured safely"),
            "{want}: {e}"
        );
    }
    // Inside a field the agent ignores, nothing is refused: a custom
    // resolver named in the ignored DNS resolvers' addresses changes
    // nothing here (on a listener's address it would refuse the file).
    let b = ok(&kkp_with(
        CLUSTER,
        "      connect_timeout: 5s\n      dns_resolvers: [{socket_address: {address: 127.0.0.53, port_value: 53, resolver_name: custom}}]\n",
    ));
    assert_eq!(
        b.notes.ignored,
        ["static_resources.clusters[0].dns_resolvers"]
    );
    assert_eq!(
        b.notes.deprecated,
        [
            "admin.access_log_path",
            "static_resources.clusters[0].dns_resolvers"
        ]
    );
    let e = err(&kkp_with(
        LISTENER,
        "        port_value: 6443\n        resolver_name: custom\n",
    ));
    assert!(
        e.contains("resolver_name") && e.contains("cannot be honoured"),
        "{e}"
    );
    // KKP's nodeport-proxy xDS bootstrap: refused, saying what it is.
    let xds = include_str!("../testdata/kkp-nodeport-proxy-envoy.yaml");
    let e = parse(xds.as_bytes())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("dynamic_resources") && e.contains("docs/kkp.md"),
        "{e}"
    );
}

/// Envoy's `--allow-unknown-static-fields`: unknown fields are listed and
/// counted by message instead of refusing the file.
#[test]
fn unknown_fields_may_be_allowed_as_envoy_allows_them() {
    let text = kkp_with(ADMIN, "admin:\n  profile_pathx: /tmp/x\n  another: 1\n").replacen(
        CLUSTER,
        "      connect_timeout: 5s\n      bogus: true\n",
        1,
    );
    let b = parse_with(
        text.as_bytes(),
        Options {
            allow_unknown_fields: true,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.notes.unknown,
        [
            "admin.profile_pathx",
            "admin.another",
            "static_resources.clusters[0].bogus"
        ]
    );
    assert_eq!(b.notes.unknown_messages, 2);
    assert!(err(&text).contains("profile_pathx"));
}

/// The seed pool's settings from the bootstrap, as Envoy names them.
#[test]
fn pool_and_idle_settings_act() {
    let text = kkp_with(
        H2,
        "            http2_protocol_options:\n              max_concurrent_streams: 100\n",
    )
    .replacen(
        "          explicit_http_config:\n",
        "          common_http_protocol_options: {idle_timeout: 600s, max_requests_per_connection: 5000}\n          explicit_http_config:\n",
        1,
    )
    .replacen(TCP, "          stat_prefix: tcp_stats\n          idle_timeout: 0s\n", 1);
    let b = ok(&text);
    assert_eq!(b.seed.max_concurrent_streams, Some(100));
    assert_eq!(b.seed.max_requests_per_connection, Some(5000));
    assert_eq!(b.seed.idle_timeout, Some(Duration::from_secs(600)));
    assert_eq!(b.idle_timeout, Some(Duration::ZERO));
    assert_eq!(b.notes, kkp_notes());
    let (c, _) = crate::cli::FlagSettings::default()
        .resolve(Some(&b))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.max_streams_per_connection, 100);
    assert_eq!(c.max_requests_per_connection, 5000);
    assert_eq!(c.pool_idle_timeout, Duration::from_secs(600));
    assert_eq!(c.idle_timeout, Duration::ZERO);
    // Listeners that disagree on their idle timeout cannot share one.
    let two = KKP_OPENVPN.replacen(
        TCP,
        "          stat_prefix: tcp_stats\n          idle_timeout: 10s\n",
        1,
    );
    assert!(err_with(&two).contains("idle_timeout"));
}

fn err_with(text: &str) -> String {
    parse(text.as_bytes())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| panic!("accepted"))
}

#[test]
fn unsupported_shapes_are_refused_with_the_place() {
    let cases = [
        // HTTP/1.1 CONNECT (no HTTP/2 options).
        (
            "      typed_extension_protocol_options:\n",
            "      typed_extension_protocol_optionz:\n",
            "typed_extension_protocol_optionz",
        ),
        ("type: LOGICAL_DNS", "type: EDS", "EDS"),
        (
            "protocol: TCP\n        address: 127.0.0.1\n        port_value: 6443",
            "protocol: UDP\n        address: 127.0.0.1\n        port_value: 6443",
            "only TCP",
        ),
        ("port_value: 6443", "port_value: 70000", "at most 65535"),
        (
            "address: 127.0.0.1\n        port_value: 6443",
            "address: localhost\n        port_value: 6443",
            "not an IP",
        ),
        ("connect_timeout: 5s", "connect_timeout: 5", "duration"),
        ("interval: 30s", "interval: 0s", "at least 1ms"),
        (
            "hostname: apiserver-external.cluster-abc.svc.cluster.local:443",
            "hostname: no-port",
            "hostname",
        ),
        (
            "cluster: \"proxy_cluster\"",
            "cluster: \"elsewhere\"",
            "no cluster elsewhere",
        ),
        ("cluster: service_stats", "cluster: proxy_cluster", "admin"),
        (
            "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "envoy.extensions.filters.network.redis_proxy.v3.RedisProxy",
            "RedisProxy",
        ),
        ("domains: [\"*\"]", "domains: [\"example.com\"]", "domains"),
    ];
    for (anchor, replacement, want) in cases {
        let e = err(&kkp_with(anchor, replacement));
        assert!(e.contains(want), "{want}: {e}");
    }
    // Two tunneling clusters, garbage, an oversize file.
    let second = KKP_OPENVPN.replacen(
        "cluster: \"proxy_cluster\"\n          tunneling_config:\n            hostname: openvpn",
        "cluster: \"service_stats\"\n          tunneling_config:\n            hostname: openvpn",
        1,
    );
    assert!(err(&second).contains("one cluster"));
    assert!(!err("{{{").is_empty());
    assert!(!err("").is_empty());
    let big = vec![b' '; MAX_CONFIG_BYTES + 1];
    assert_eq!(parse(&big), Err(BootstrapError::TooLarge));
}

/// Every duration and port the agent acts on is held to Envoy's rules
/// (PGV bounds in its API, protobuf's Duration range, Envoy's own bound on
/// durations), each refusal naming the field.
#[test]
fn durations_and_ports_are_validated_as_envoy_does() {
    let cases = [
        // PGV gte 1ms on the keepalive; 1 ns would make the connection flap.
        (
            KEEPALIVE,
            KEEPALIVE.replace("30s", "0.000000001s"),
            "connection_keepalive.interval: must be at least 1ms",
        ),
        (
            KEEPALIVE,
            KEEPALIVE.replace("30s", "0.000999s"),
            "at least 1ms",
        ),
        (
            KEEPALIVE,
            KEEPALIVE.replace("5s", "0s"),
            "connection_keepalive.timeout",
        ),
        // PGV gt 0s on connect_timeout.
        (
            "connect_timeout: 5s",
            "connect_timeout: 0s".into(),
            "greater than 0s",
        ),
        // 10^17 s: past protobuf's Duration range; 10^10 s: past Envoy's.
        (
            "connect_timeout: 5s",
            "connect_timeout: 100000000000000000s".into(),
            "protobuf",
        ),
        (
            "connect_timeout: 5s",
            "connect_timeout: 10000000000s".into(),
            "292 years",
        ),
        (
            "connect_timeout: 5s",
            "connect_timeout: -5s".into(),
            "negative",
        ),
        // Envoy's bound holds for every duration, acted on or not.
        (
            CLUSTER,
            "      connect_timeout: 5s\n      dns_refresh_rate: 10000000000s\n".into(),
            "dns_refresh_rate",
        ),
        // A listener on a port the kernel picks; a port past 65535.
        ("port_value: 6443", "port_value: 0".into(), "port_value 0"),
        ("port_value: 8002", "port_value: 0".into(), "port_value 0"),
        (
            "port_value: 6443",
            "port_value: 65536".into(),
            "at most 65535",
        ),
        (
            "port_value: 8088",
            "port_value: 0".into(),
            "port_value is 0",
        ),
    ];
    for (anchor, replacement, want) in cases {
        let e = err(&kkp_with(anchor, &replacement));
        assert!(e.contains(want), "{replacement:?}: want {want:?} in {e}");
    }
    // The bounds themselves are accepted.
    let b = ok(&kkp_with(KEEPALIVE, &KEEPALIVE.replace("30s", "0.001s")));
    assert_eq!(
        b.seed.keepalive.map(|k| k.0),
        Some(Duration::from_millis(1))
    );
    let b = ok(&kkp_with(
        "connect_timeout: 5s",
        "connect_timeout: 9223372035s",
    ));
    assert_eq!(b.seed.connect_timeout, Duration::from_secs(9_223_372_035));
}

#[test]
fn a_filter_config_is_checked_against_its_type() {
    // A field of the other filter, a duplicate, a missing one.
    let e = err(&kkp_with(
        TCP,
        "          stat_prefix: tcp_stats\n          http_filters: []\n",
    ));
    assert!(e.contains("unknown field `http_filters`"), "{e}");
    let e = err(&kkp_with(
        TCP,
        "          stat_prefix: tcp_stats\n          stat_prefix: again\n",
    ));
    assert!(e.contains("duplicate key `stat_prefix`"), "{e}");
    let e = err(&kkp_with(TCP, ""));
    assert!(e.contains("stat_prefix: needs at least 1 character"), "{e}");
    // Another filter whose type the schema does not hold: the filter is
    // named, its fields unchecked.
    let e = err(&kkp_with(
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy\n",
        "envoy.extensions.filters.network.redis_proxy.v3.RedisProxy\n          prefix_routes: {}\n",
    ));
    assert!(e.contains("RedisProxy"), "{e}");
    // An alias bomb ends at the node bound, wherever it is.
    let bomb = "          x1: &a [x, x, x, x, x, x, x, x, x, x]\n          x2: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n          x3: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n          x4: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n          x5: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
    let start = std::time::Instant::now();
    assert!(!err(&kkp_with(TCP, &format!("{TCP}{bomb}"))).is_empty());
    let e = err(&kkp_with(
        "          cluster: \"proxy_cluster\"\n",
        &format!("{bomb}          cluster: *e\n"),
    ));
    assert!(!e.is_empty());
    // Not a wall-clock assertion: printed for whoever runs it.
    println!("two alias bombs refused in {:?}", start.elapsed());
}
