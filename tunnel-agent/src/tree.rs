//! A bootstrap file as a generic tree (what Envoy's own loader makes of YAML
//! before protobuf's JSON parser reads it), built in one place: [`parse`] is
//! the only call into the YAML library. Every node counts against
//! [`MAX_NODES`], aliases' copies included, so an alias bomb ends at the
//! bound instead of expanding into gigabytes.

use std::cell::Cell;

use serde::Deserialize;
use serde::de::{Error, MapAccess, SeqAccess, Visitor};

use crate::limits::MAX_NODES;

/// A YAML (or JSON) value.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// In file order; keys are strings (protobuf JSON has no others).
    Map(Vec<(String, Node)>),
}

impl Node {
    /// What kind of value it is, for errors.
    pub fn describe(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }

    /// The value of `key` in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of a list; none for null or anything else.
    pub fn items(&self) -> &[Node] {
        match self {
            Node::Seq(v) => v,
            _ => &[],
        }
    }

    /// The entries of a mapping; none for null or anything else.
    pub fn entries(&self) -> &[(String, Node)] {
        match self {
            Node::Map(m) => m,
            _ => &[],
        }
    }
}

thread_local! {
    /// Nodes the parse on this thread may still make.
    static BUDGET: Cell<usize> = const { Cell::new(0) };
}

fn spend<E: Error>() -> Result<(), E> {
    BUDGET.with(|b| match b.get() {
        0 => Err(E::custom(format!(
            "more than {MAX_NODES} values (aliases expanded)"
        ))),
        n => {
            b.set(n - 1);
            Ok(())
        }
    })
}

/// Parses YAML (a superset of JSON) into a tree of at most [`MAX_NODES`]
/// nodes.
pub fn parse(bytes: &[u8]) -> Result<Node, String> {
    BUDGET.with(|b| b.set(MAX_NODES));
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    // YAML 1.2 scalars (`yes` is no boolean), a repeated key kept in the
    // tree (the schema check names it), the error on one line.
    let options = serde_saphyr::options! {
        strict_booleans: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        with_snippet: false,
    };
    let node =
        serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| e.to_string());
    BUDGET.with(|b| b.set(0));
    node
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a YAML value")
            }
            fn visit_unit<E: Error>(self) -> Result<Node, E> {
                spend()?;
                Ok(Node::Null)
            }
            fn visit_none<E: Error>(self) -> Result<Node, E> {
                self.visit_unit()
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E: Error>(self, v: bool) -> Result<Node, E> {
                spend()?;
                Ok(Node::Bool(v))
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<Node, E> {
                spend()?;
                Ok(Node::Int(v.into()))
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<Node, E> {
                spend()?;
                Ok(Node::Int(v.into()))
            }
            fn visit_i128<E: Error>(self, v: i128) -> Result<Node, E> {
                spend()?;
                Ok(Node::Int(v))
            }
            fn visit_u128<E: Error>(self, v: u128) -> Result<Node, E> {
                spend()?;
                Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
            }
            fn visit_f64<E: Error>(self, v: f64) -> Result<Node, E> {
                spend()?;
                Ok(Node::Float(v))
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Node, E> {
                spend()?;
                Ok(Node::Str(v.to_owned()))
            }
            fn visit_string<E: Error>(self, v: String) -> Result<Node, E> {
                spend()?;
                Ok(Node::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                spend()?;
                let mut items = Vec::new();
                while let Some(n) = a.next_element::<Node>()? {
                    items.push(n);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Node, A::Error> {
                spend()?;
                let mut entries: Vec<(String, Node)> = Vec::new();
                while let Some(key) = m.next_key::<Node>()? {
                    let key = match key {
                        Node::Str(s) => s,
                        Node::Int(i) => i.to_string(),
                        Node::Bool(b) => b.to_string(),
                        other => {
                            return Err(A::Error::custom(format!(
                                "a mapping key is {}, not a string",
                                other.describe()
                            )));
                        }
                    };
                    if entries.iter().any(|(k, _)| *k == key) {
                        return Err(A::Error::custom(format!("duplicate key `{key}`")));
                    }
                    let value = m.next_value::<Node>()?;
                    entries.push((key, value));
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_into_one_tree() {
        let n = parse(b"a: 1\nb: [x, 2.5, true, null]\nc: {d: \"5s\"}\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.get("a"), Some(&Node::Int(1)));
        assert_eq!(
            n.get("b").map(Node::items),
            Some(
                &[
                    Node::Str("x".into()),
                    Node::Float(2.5),
                    Node::Bool(true),
                    Node::Null
                ][..]
            )
        );
        assert_eq!(
            n.get("c").and_then(|c| c.get("d")).and_then(Node::as_str),
            Some("5s")
        );
        let e = parse(b"a: 1\na: 2\n").err().unwrap_or_default();
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn an_alias_bomb_stops_at_the_node_bound() {
        let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";
        let e = parse(bomb.as_bytes()).err().unwrap_or_default();
        assert!(!e.is_empty());
        // Within the bound, aliases are values like any other.
        let n = parse(b"a: &a {x: 1}\nb: *a\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.get("b"), n.get("a"));
    }
}
