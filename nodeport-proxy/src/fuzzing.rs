//! Entry points for the fuzz targets that read what the table file (or the
//! apiserver) says, rather than what a client sends: the file parsers with
//! the plan built from what they accept, and KKP's annotations. Each takes
//! arbitrary bytes, must never panic, and checks what its output promises.
//! The committed corpora replay them in `cargo test` (corpus_tests.rs).

use crate::routing::expose::{ExposeTypes, parse_expose, port_mapping};
use crate::routing::index::build;
use crate::routing::model::{ObjectMeta, Protocol, Service, ServicePort, ServiceSpec};
use crate::routing::plan::PlanOptions;

/// The table file: the first byte picks JSON (odd) or YAML (even), the rest
/// is the file. Whatever parses must build a plan, the same plan twice, and
/// every route must name a cluster the plan has.
pub fn table_file(data: &[u8]) {
    let Some((&kind, text)) = data.split_first() else {
        return;
    };
    let json = kind % 2 == 1;
    let path = std::path::Path::new(if json { "table.json" } else { "table.yaml" });
    let whole = crate::sources::source::parse_file(path, text);
    // Loading by items (plain block YAML) must agree with loading whole. Any
    // other file `load_items` loads whole with `parse_file` itself: a second
    // parse of it would check nothing and halve the executions per second.
    let plain = !json
        && std::str::from_utf8(text)
            .ok()
            .and_then(crate::sources::yaml_items::split)
            .is_some();
    if plain {
        let mut cache = crate::sources::source::ItemCache::default();
        let by_items = crate::sources::source::load_items(path, text, &mut cache);
        match (&by_items, &whole) {
            (Ok(crate::sources::source::Loaded::Changes(changes)), Ok(inv)) => {
                let mut services = Vec::new();
                let mut slices = Vec::new();
                for c in changes {
                    match c {
                        crate::routing::store::Change::Service(_, Some(s)) => {
                            services.push(s.clone())
                        }
                        crate::routing::store::Change::Slice(_, Some(s)) => slices.push(s.clone()),
                        other => panic!("a first load deletes nothing: {other:?}"),
                    }
                }
                assert_eq!(services, inv.services, "services by items differ");
                assert_eq!(slices, inv.endpoint_slices, "slices by items differ");
            }
            (Ok(crate::sources::source::Loaded::Whole(a)), Ok(b)) => assert_eq!(a, b),
            (Ok(_), Err(e)) => panic!("loaded by items but not whole: {e}"),
            (Err(_), Ok(_)) => panic!("loaded whole but not by items"),
            (Err(_), Err(_)) => {}
        }
    }
    let Ok(inventory) = whole else {
        return;
    };
    for options in [
        PlanOptions::default(),
        PlanOptions {
            namespace: Some("cluster-a".into()),
            sni: false,
            ..PlanOptions::default()
        },
    ] {
        let (plan, _) = build(&inventory, &options);
        let (again, _) = build(&inventory, &options);
        assert_eq!(plan, again, "the plan must be a function of the inventory");
        let clusters = plan
            .node_ports
            .values()
            .chain(plan.sni.values())
            .chain(plan.tunnels.values());
        for c in clusters {
            assert!(
                plan.clusters.contains_key(c),
                "route to missing cluster {c}"
            );
        }
        if !options.sni {
            assert!(plan.sni.is_empty());
        }
    }
}

/// The Service ports the annotation inputs are checked against.
const PORTS: [(&str, Protocol); 4] = [
    ("https", Protocol::Tcp),
    ("http", Protocol::Tcp),
    ("", Protocol::Tcp),
    ("dns", Protocol::Udp),
];

/// KKP's annotations: the input is the `port-mapping` JSON and, split at
/// the first NUL, an `expose` value. An accepted mapping names only TCP
/// ports of the Service, each host once, each a valid SNI host; an accepted
/// expose value names at least one way to expose.
pub fn annotations(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (mapping, expose) = text.split_once('\0').unwrap_or((&text, ""));
    if let Some(types) = parse_expose(expose) {
        assert!(types.any());
        assert_ne!(types, ExposeTypes::default());
    }
    let service = Service {
        metadata: ObjectMeta {
            namespace: "ns".into(),
            name: "svc".into(),
            annotations: [(
                crate::routing::expose::PORT_MAPPING_ANNOTATION_KEY.to_string(),
                mapping.to_string(),
            )]
            .into(),
            ..ObjectMeta::default()
        },
        spec: ServiceSpec {
            ports: PORTS
                .iter()
                .map(|(name, protocol)| ServicePort {
                    name: (*name).into(),
                    port: 443,
                    node_port: 0,
                    protocol: *protocol,
                })
                .collect(),
            ..ServiceSpec::default()
        },
    };
    if let Ok(m) = port_mapping(&service) {
        let mut hosts = std::collections::BTreeSet::new();
        for (port, host) in &m {
            assert!(
                PORTS.iter().any(|(n, p)| n == port && *p == Protocol::Tcp),
                "{port:?} is not a TCP port"
            );
            assert!(hosts.insert(host.clone()), "host {host} twice");
            let s = host.to_string();
            assert!(!s.is_empty() && !s.contains(char::is_whitespace), "{s:?}");
        }
    }
}

/// A client's first bytes on a listener that expects a PROXY header. A
/// complete header lies within the input and the bound, parses the same from
/// exactly its own bytes, and every shorter prefix of it asks for more (or
/// is refused); an unfinished one is shorter than the bound.
pub fn proxy_header(data: &[u8]) {
    use crate::limits::MAX_PROXY_HEADER;
    use crate::relay::proxy_protocol::parse;
    match parse(data) {
        Ok(Some(h)) => {
            assert!(h.len <= data.len() && h.len <= MAX_PROXY_HEADER, "{h:?}");
            assert_eq!(parse(&data[..h.len]), Ok(Some(h)));
            if let Some((src, dst)) = h.addresses {
                // What we would send on names the same client.
                let v2 = crate::relay::proxy_protocol::v2_header(src, dst);
                let back = parse(&v2).ok().flatten().and_then(|h| h.addresses);
                assert_eq!(
                    back.map(|(s, _)| (s.ip().to_canonical(), s.port())),
                    Some((src.ip().to_canonical(), src.port()))
                );
            }
        }
        Ok(None) => assert!(data.len() < MAX_PROXY_HEADER),
        Err(_) => {}
    }
    // The allow-list annotation, from the same bytes.
    let text = String::from_utf8_lossy(data);
    if let Ok(crate::routing::policy::SourceRanges::Only(nets)) =
        crate::routing::policy::parse_source_ranges(&text)
    {
        assert!(!nets.is_empty() && nets.len() <= crate::limits::MAX_SOURCE_RANGES);
        for n in nets.iter() {
            assert!(crate::routing::policy::SourceRanges::Only(nets.clone()).allows(n.network()));
        }
    }
}
