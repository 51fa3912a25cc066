//! Loading a YAML table file item by item against loading it whole: over
//! random sequences of edits (items added, removed, changed, moved,
//! repeated, aliased, broken; comments; either indentation), the table
//! kept from item changes always equals the table built from the whole
//! file, and a file that does not load whole does not load by items either.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::*;
use crate::routing::index::Index;
use crate::routing::plan::PlanOptions;

fn pick<'a, T>(rng: &mut StdRng, from: &'a [T]) -> &'a T {
    &from[rng.random_range(0..from.len())]
}

fn service(rng: &mut StdRng) -> Value {
    let name = *pick(rng, &["a", "b", "c", "d", "e", "f", "g", "h"]);
    let ns = *pick(rng, &["x", "y", "z"]);
    let mut ann = serde_json::Map::new();
    ann.insert(
        "nodeport-proxy.k8s.io/expose".into(),
        json!(*pick(
            rng,
            &["SNI, Tunneling", "NodePort", "Tunneling", "bogus"]
        )),
    );
    if rng.random_bool(0.6) {
        let host = *pick(rng, &["h1.example", "h2.example"]);
        ann.insert(
            "nodeport-proxy.k8s.io/port-mapping".into(),
            json!(format!("{{\"https\": \"{host}\"}}")),
        );
    }
    json!({
        "metadata": {"namespace": ns, "name": name, "uid": *pick(rng, &["", "u1", "u2"]),
            "creationTimestamp": *pick(rng, &["2024-01-01T00:00:00Z", "2023-01-01T00:00:00Z"]),
            "annotations": ann},
        "spec": {"type": *pick(rng, &["NodePort", "ClusterIP"]), "ports": [
            {"name": "https", "port": 443, "nodePort": *pick(rng, &[0, 30000, 30001])}]}
    })
}

fn slice(rng: &mut StdRng) -> Value {
    let svc = *pick(rng, &["a", "b", "c", "d", "e", "f", "g", "h"]);
    json!({
        "metadata": {"namespace": *pick(rng, &["x", "y", "z"]), "name": format!("{svc}-{}", rng.random_range(0..2)),
            "labels": {"kubernetes.io/service-name": svc}},
        "ports": [{"name": "https", "port": *pick(rng, &[8443, 9443])}],
        "endpoints": [{"addresses": [*pick(rng, &["10.0.0.1", "10.0.0.2"])],
            "conditions": {"ready": rng.random_bool(0.8)}}]
    })
}

/// One item as YAML: JSON is a YAML flow mapping; on one line or spread
/// over several, with the continuation indented under the dash.
fn item_text(v: &Value, multi: bool, indent: usize) -> String {
    let pad = " ".repeat(indent);
    if multi {
        let pretty = serde_json::to_string_pretty(v).unwrap_or_default();
        let mut out = String::new();
        for (i, line) in pretty.lines().enumerate() {
            if i == 0 {
                out.push_str(&format!("{pad}- {line}\n"));
            } else {
                out.push_str(&format!("{pad}  {line}\n"));
            }
        }
        out
    } else {
        format!("{pad}- {v}\n")
    }
}

#[derive(Clone)]
enum Item {
    Plain(Value, bool),
    /// An anchor on one item and an alias to it as the next.
    Aliased(Value),
    Broken,
}

fn render(services: &[Item], slices: &[Item], indent: usize, comments: bool) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("# table\n");
    for (key, items) in [("services", services), ("endpointSlices", slices)] {
        if items.is_empty() {
            out.push_str(&format!("{key}: []\n"));
            continue;
        }
        out.push_str(&format!("{key}:\n"));
        for it in items {
            if comments {
                out.push_str(&format!("{pad}# next\n\n"));
            }
            match it {
                Item::Plain(v, multi) => out.push_str(&item_text(v, *multi, indent)),
                Item::Aliased(v) => {
                    out.push_str(&format!("{pad}- &dup {v}\n"));
                    out.push_str(&format!("{pad}- *dup\n"));
                }
                Item::Broken => out.push_str(&format!("{pad}- {{metadata: [}}\n")),
            }
        }
    }
    out
}

#[test]
fn loading_by_items_equals_loading_whole() {
    let path = std::path::Path::new("table.yaml");
    let (mut by_changes, mut by_whole) = (0, 0);
    for seed in 0..60u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut by_items = Index::new(PlanOptions::default());
        let mut whole = Index::new(PlanOptions::default());
        let mut cache = ItemCache::default();
        let (mut services, mut slices): (Vec<Item>, Vec<Item>) = (Vec::new(), Vec::new());
        for step in 0..30 {
            let is_services = rng.random_bool(0.5);
            let list = if is_services {
                &mut services
            } else {
                &mut slices
            };
            let fresh = |rng: &mut StdRng| {
                if is_services {
                    service(rng)
                } else {
                    slice(rng)
                }
            };
            match rng.random_range(0..14) {
                0..=3 => {
                    let v = fresh(&mut rng);
                    let at = rng.random_range(0..=list.len());
                    list.insert(at, Item::Plain(v, rng.random_bool(0.5)));
                }
                4 if !list.is_empty() => {
                    let at = rng.random_range(0..list.len());
                    list.remove(at);
                }
                5 if !list.is_empty() => {
                    let at = rng.random_range(0..list.len());
                    list[at] = Item::Plain(fresh(&mut rng), rng.random_bool(0.5));
                }
                6 if list.len() > 1 => {
                    let at = rng.random_range(0..list.len());
                    let it = list.remove(at);
                    list.push(it);
                }
                7 | 8 => {
                    // Things only a whole parse handles, dropped again soon.
                    let v = fresh(&mut rng);
                    if rng.random_bool(0.5) {
                        list.push(Item::Aliased(v));
                    } else {
                        // The same object twice.
                        list.push(Item::Plain(v.clone(), false));
                        list.push(Item::Plain(v, true));
                    }
                }
                9 => list.push(Item::Broken),
                10.. => {
                    list.retain(|i| matches!(i, Item::Plain(..)));
                }
                _ => {}
            }
            let text = render(
                &services,
                &slices,
                *pick(&mut rng, &[0usize, 2]),
                rng.random_bool(0.3),
            );
            let full = parse_file(path, text.as_bytes());
            match load_items(path, text.as_bytes(), &mut cache) {
                Ok(l) => {
                    let inv = full.unwrap_or_else(|e| {
                        panic!("seed {seed} step {step}: loaded by items, not whole: {e}\n{text}")
                    });
                    match l {
                        Loaded::Whole(i) => {
                            by_whole += 1;
                            by_items.replace_all(&i)
                        }
                        Loaded::Changes(changes) => {
                            by_changes += 1;
                            for c in changes {
                                match c {
                                    Change::Service(k, s) => by_items.service(&k, s.as_ref()),
                                    Change::Slice(k, s) => by_items.slice(&k, s.as_ref()),
                                    Change::ServicesListed(_) | Change::SlicesListed(_) => {
                                        panic!("seed {seed} step {step}: a file lists nothing")
                                    }
                                }
                            }
                        }
                    }
                    whole.replace_all(&inv);
                }
                Err(_) => assert!(
                    full.is_err(),
                    "seed {seed} step {step}: loaded whole, not by items\n{text}"
                ),
            }
            assert_eq!(
                by_items.plan(),
                whole.plan(),
                "seed {seed} step {step}: tables differ\n{text}"
            );
        }
    }
    // Both ways were taken often.
    assert!(
        by_whole > 100 && by_changes > 100,
        "{by_changes} by items, {by_whole} whole"
    );
}
