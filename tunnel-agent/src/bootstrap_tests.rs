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
        }
    );
    let b = ok(KKP_OPENVPN);
    assert_eq!(b.tunnels.len(), 2);
    assert_eq!(b.tunnels[1].addr.to_string(), "127.0.0.1:1194");
    assert_eq!(
        b.tunnels[1].authority.to_string(),
        "openvpn-server.cluster-abc.svc.cluster.local:1194"
    );
}

#[test]
fn an_unknown_field_anywhere_is_an_error_naming_it() {
    // Fields Envoy knows that would change behaviour here, put where Envoy
    // accepts them; each must be refused by name.
    let cases = [
        (
            "admin:\n",
            "admin:\n  profile_path: /tmp/x\n",
            "profile_path",
        ),
        (
            "static_resources:\n",
            "overload_manager: {}\nstatic_resources:\n",
            "overload_manager",
        ),
        (
            "          stat_prefix: tcp_stats\n",
            "          stat_prefix: tcp_stats\n          max_connect_attempts: 5\n",
            "max_connect_attempts",
        ),
        (
            "            hostname: apiserver",
            "            use_post: true\n            hostname: apiserver",
            "use_post",
        ),
        (
            "      connect_timeout: 5s\n",
            "      connect_timeout: 5s\n      dns_lookup_family: V6_ONLY\n",
            "dns_lookup_family",
        ),
        (
            "                timeout: 5s\n",
            "                timeout: 5s\n                interval_jitter: {value: 50}\n",
            "interval_jitter",
        ),
        (
            "    filter_chains:\n    - filters:\n      - name: tcp\n",
            "    filter_chains:\n    - filter_chain_match: {destination_port: 1}\n      filters:\n      - name: tcp\n",
            "filter_chain_match",
        ),
        (
            "        port_value: 6443\n",
            "        port_value: 6443\n        ipv4_compat: true\n",
            "ipv4_compat",
        ),
        (
            "          stat_prefix: service_stats\n",
            "          stat_prefix: service_stats\n          codec_type: HTTP1\n",
            "codec_type",
        ),
    ];
    for (anchor, replacement, field) in cases {
        assert!(KKP.contains(anchor), "fixture lacks {anchor:?}");
        let text = KKP.replacen(anchor, replacement, 1);
        let e = err(&text);
        assert!(e.contains(field), "{field}: {e}");
    }
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
        ("port_value: 6443", "port_value: 70000", "70000"),
        (
            "address: 127.0.0.1\n        port_value: 6443",
            "address: localhost\n        port_value: 6443",
            "not an IP",
        ),
        ("connect_timeout: 5s", "connect_timeout: 5", "duration"),
        ("interval: 30s", "interval: 0s", "positive"),
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
        assert!(KKP.contains(anchor), "fixture lacks {anchor:?}");
        let e = err(&KKP.replacen(anchor, replacement, 1));
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

#[test]
fn durations_as_protobuf_json() {
    assert_eq!(duration("x", "0.1s"), Ok(Duration::from_millis(100)));
    assert_eq!(duration("x", "30s"), Ok(Duration::from_secs(30)));
    assert_eq!(duration("x", "1.5s"), Ok(Duration::from_millis(1500)));
    for bad in ["", "s", "5", "5m", "-1s", "1e3s", "NaNs", "infs", "1.2.3s"] {
        assert!(duration("x", bad).is_err(), "{bad}");
    }
}

#[test]
fn a_filter_config_is_checked_against_its_type() {
    let tcp = "          stat_prefix: tcp_stats\n";
    assert!(KKP.contains(tcp));
    // A field of the other filter, a duplicate, a missing one.
    let e = err(&KKP.replacen(
        tcp,
        "          stat_prefix: tcp_stats\n          http_filters: []\n",
        1,
    ));
    assert!(e.contains("unknown field `http_filters`"), "{e}");
    let e = err(&KKP.replacen(
        tcp,
        "          stat_prefix: tcp_stats\n          stat_prefix: again\n",
        1,
    ));
    assert!(e.contains("duplicate field `stat_prefix`"), "{e}");
    let e = err(&KKP.replacen(tcp, "", 1));
    assert!(e.contains("missing field `stat_prefix`"), "{e}");
    // Another filter's own fields: the filter is named, not its fields.
    let e = err(&KKP.replacen(
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy\n",
        "envoy.extensions.filters.network.redis_proxy.v3.RedisProxy\n          prefix_routes: {}\n",
        1,
    ));
    assert!(e.contains("RedisProxy"), "{e}");
    // An alias bomb under a field no filter has is refused by that field's
    // name, its aliases never expanded; one where a string belongs is refused
    // by its shape.
    let bomb = "          x1: &a [x, x, x, x, x, x, x, x, x, x]\n          x2: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n          x3: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n          x4: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n          x5: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
    let e = err(&KKP.replacen(tcp, &format!("{tcp}{bomb}"), 1));
    assert!(e.contains("unknown field `x1`"), "{e}");
    let e = err(&KKP.replacen(
        "          cluster: \"proxy_cluster\"\n",
        &format!("{bomb}          cluster: *e\n"),
        1,
    ));
    assert!(e.contains("expected string scalar"), "{e}");
}
