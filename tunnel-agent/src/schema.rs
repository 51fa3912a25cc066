//! A bootstrap checked against Envoy's v3 schema as Envoy checks it before it
//! runs: protobuf's JSON mapping (field names in either spelling, value
//! types, enum names, oneofs, the well-known types' JSON forms), Envoy's own
//! duration bound and the PGV rules of its API. The schema is
//! [`crate::envoy_schema`], generated from go-control-plane (Envoy's data-plane
//! API as Go types) by `tests/envoyschema`, whose tests also hold these
//! verdicts against go-control-plane's own parser and `Validate()`.
//!
//! What comes out is the tree with every key in its proto name, and every
//! field present with its place, for the policy in `bootstrap.rs` to sort
//! into what the agent acts on, what it ignores and reports, and what it
//! cannot honour.

use crate::envoy_rules;
use crate::envoy_schema::{ENUMS, MESSAGES, ROOTS};
use crate::schema_types::{Card, Enum, Field, Kind, Message, Rule};
use crate::tree::Node;

/// The message named `name` (`envoy.config.bootstrap.v3.Bootstrap`).
pub fn message(name: &str) -> Option<&'static Message> {
    MESSAGES
        .binary_search_by(|m| m.name.cmp(name))
        .ok()
        .map(|i| &MESSAGES[i])
}

/// The bootstrap's message.
pub fn bootstrap() -> &'static Message {
    &MESSAGES[usize::from(ROOTS[0].1)]
}

/// One field present in the file.
#[derive(Debug, Clone)]
pub struct Present {
    /// Where, e.g. `static_resources.clusters[0].connect_timeout`.
    pub path: String,
    /// `envoy.config.cluster.v3.Cluster.connect_timeout`.
    pub qualified: String,
    pub deprecated: bool,
    /// Index in [`Checked::present`] of the field it is inside.
    pub parent: Option<usize>,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Checked {
    /// Every field present, parents before their children.
    pub present: Vec<Present>,
    /// Fields Envoy's schema does not know (with `allow_unknown`), by place.
    pub unknown: Vec<String>,
    /// How many messages held unknown fields (Envoy's
    /// `server.static_unknown_fields` counts so).
    pub unknown_messages: usize,
    /// Any values whose `@type` the table does not hold: their content is not
    /// checked.
    pub opaque: Vec<String>,
}

/// Why a bootstrap is not one Envoy would take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

fn err<T>(path: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        path: if path.is_empty() {
            "(top)".into()
        } else {
            path.into()
        },
        message: message.into(),
    })
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Checks `node` as an `envoy.config.bootstrap.v3.Bootstrap` and returns it
/// with every key in its proto name. Fields the schema does not know are
/// errors, as in Envoy, unless `allow_unknown` (Envoy's
/// `--allow-unknown-static-fields`): then they are dropped and listed.
pub fn check(node: &Node, allow_unknown: bool) -> Result<(Node, Checked), SchemaError> {
    let mut w = Walker {
        allow_unknown,
        out: Checked::default(),
    };
    let tree = w.message(node, bootstrap(), "", None)?;
    Ok((tree, w.out))
}

struct Walker {
    allow_unknown: bool,
    out: Checked,
}

fn wrapper_kind(name: &str) -> Option<Kind> {
    Some(match name {
        "google.protobuf.BoolValue" => Kind::Bool,
        "google.protobuf.StringValue" => Kind::Str,
        "google.protobuf.BytesValue" => Kind::Bytes,
        "google.protobuf.Int32Value" => Kind::I32,
        "google.protobuf.Int64Value" => Kind::I64,
        "google.protobuf.UInt32Value" => Kind::U32,
        "google.protobuf.UInt64Value" => Kind::U64,
        "google.protobuf.FloatValue" => Kind::F32,
        "google.protobuf.DoubleValue" => Kind::F64,
        _ => return None,
    })
}

/// Messages whose JSON form is not an object of their fields.
fn special_json(name: &str) -> bool {
    wrapper_kind(name).is_some()
        || matches!(
            name,
            "google.protobuf.Duration"
                | "google.protobuf.Timestamp"
                | "google.protobuf.Struct"
                | "google.protobuf.Value"
                | "google.protobuf.ListValue"
                | "google.protobuf.FieldMask"
                | "google.protobuf.Empty"
                | "google.protobuf.Any"
        )
}

/// A number as protobuf's JSON parser takes it: a JSON number, or a string
/// holding one.
fn number(node: &Node) -> Option<f64> {
    match node {
        Node::Int(i) => Some(*i as f64),
        Node::Float(f) => Some(*f),
        Node::Str(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            s if !s.is_empty() && !s.starts_with(' ') && !s.ends_with(' ') => s.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// An integer of the given range, as protobuf's JSON parser takes it (a
/// number without a fraction, or a string holding one).
fn integer(node: &Node, min: i128, max: i128) -> Option<i128> {
    let v: i128 = match node {
        Node::Int(i) => *i,
        Node::Float(f) if f.fract() == 0.0 && f.abs() < 1e38 => *f as i128,
        Node::Str(s) => match s.parse::<i128>() {
            Ok(i) => i,
            Err(_) => {
                let f: f64 = s.parse().ok()?;
                if f.fract() != 0.0 || f.abs() >= 1e38 {
                    return None;
                }
                f as i128
            }
        },
        _ => return None,
    };
    (min..=max).contains(&v).then_some(v)
}

/// A scalar value normalized for rules: its number, string or bool.
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Num(f64),
    Str(String),
    Bool(bool),
    Enum(i32),
    Bytes(usize),
}

impl Walker {
    /// Checks a scalar of `kind` and gives it back with its normalized value.
    fn scalar(&self, node: &Node, kind: Kind, path: &str) -> Result<Scalar, SchemaError> {
        let bad = |what: &str| err(path, format!("expected {what}, got {}", node.describe()));
        Ok(match kind {
            Kind::Bool => match node {
                Node::Bool(b) => Scalar::Bool(*b),
                _ => return bad("a boolean"),
            },
            Kind::Str => match node {
                Node::Str(s) => Scalar::Str(s.clone()),
                _ => return bad("a string"),
            },
            Kind::Bytes => match node {
                Node::Str(s) => {
                    use base64::Engine as _;
                    let e = base64::engine::general_purpose::STANDARD;
                    let u = base64::engine::general_purpose::URL_SAFE;
                    let trimmed = s.trim_end_matches('=');
                    let len = e
                        .decode(s)
                        .or_else(|_| u.decode(s))
                        .or_else(|_| {
                            base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed)
                        })
                        .or_else(|_| {
                            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(trimmed)
                        });
                    match len {
                        Ok(b) => Scalar::Bytes(b.len()),
                        Err(_) => return bad("base64 bytes"),
                    }
                }
                _ => return bad("base64 bytes"),
            },
            Kind::I32 => match integer(node, i32::MIN.into(), i32::MAX.into()) {
                Some(v) => Scalar::Num(v as f64),
                None => return bad("a 32-bit integer"),
            },
            Kind::U32 => match integer(node, 0, u32::MAX.into()) {
                Some(v) => Scalar::Num(v as f64),
                None => return bad("an unsigned 32-bit integer"),
            },
            Kind::I64 => match integer(node, i64::MIN.into(), i64::MAX.into()) {
                Some(v) => Scalar::Num(v as f64),
                None => return bad("a 64-bit integer"),
            },
            Kind::U64 => match integer(node, 0, u64::MAX.into()) {
                Some(v) => Scalar::Num(v as f64),
                None => return bad("an unsigned 64-bit integer"),
            },
            Kind::F32 | Kind::F64 => match number(node) {
                Some(v)
                    if kind == Kind::F64 || !v.is_finite() || v.abs() <= f64::from(f32::MAX) =>
                {
                    Scalar::Num(v)
                }
                _ => return bad("a number"),
            },
            Kind::Enum(i) => {
                let e = &ENUMS[usize::from(i)];
                match node {
                    Node::Str(s) => match e.values.iter().find(|(n, _)| n == s) {
                        Some((_, v)) => Scalar::Enum(*v),
                        None => {
                            return err(
                                path,
                                format!(
                                    "{s:?} is not a value of {} ({})",
                                    e.name,
                                    e.values
                                        .iter()
                                        .map(|(n, _)| *n)
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                            );
                        }
                    },
                    Node::Int(v) => match i32::try_from(*v) {
                        Ok(v) => Scalar::Enum(v),
                        Err(_) => return bad("an enum value"),
                    },
                    _ => return bad("an enum value name"),
                }
            }
            Kind::Msg(_) => return bad("a message"),
        })
    }

    /// Checks one value of `field` (an element, for repeated fields).
    fn value(
        &mut self,
        node: &Node,
        kind: Kind,
        path: &str,
        parent: Option<usize>,
    ) -> Result<(Node, Option<Scalar>), SchemaError> {
        match kind {
            Kind::Msg(i) => {
                let m = &MESSAGES[usize::from(i)];
                let n = self.message(node, m, path, parent)?;
                let scalar = match (m.name, &n) {
                    ("google.protobuf.Duration", Node::Str(s)) => envoy_rules::parse_duration(s)
                        .ok()
                        .map(|d| Scalar::Num(d.as_secs_f64())),
                    (name, n) if wrapper_kind(name).is_some() && *n != Node::Null => {
                        wrapper_kind(name).and_then(|k| self.scalar(n, k, path).ok())
                    }
                    _ => None,
                };
                Ok((n, scalar))
            }
            _ => {
                let s = self.scalar(node, kind, path)?;
                Ok((node.clone(), Some(s)))
            }
        }
    }

    /// Checks `node` as message `m`; returns it normalized.
    fn message(
        &mut self,
        node: &Node,
        m: &'static Message,
        path: &str,
        parent: Option<usize>,
    ) -> Result<Node, SchemaError> {
        if *node == Node::Null {
            return Ok(Node::Null);
        }
        if special_json(m.name) {
            return self.special(node, m, path, parent);
        }
        let Node::Map(entries) = node else {
            return err(
                path,
                format!("expected a mapping ({}), got {}", m.name, node.describe()),
            );
        };
        self.fields(entries, m, path, parent, &[])
    }

    /// The fields of message `m` from `entries` (`skip`: keys already read,
    /// e.g. an Any's `@type`).
    fn fields(
        &mut self,
        entries: &[(String, Node)],
        m: &'static Message,
        path: &str,
        parent: Option<usize>,
        skip: &[&str],
    ) -> Result<Node, SchemaError> {
        let mut out: Vec<(String, Node)> = Vec::new();
        let mut values: Vec<(&'static Field, usize, Vec<Scalar>)> = Vec::new();
        let mut oneof_set: Vec<Option<&'static str>> = vec![None; m.oneofs.len()];
        let mut had_unknown = false;
        for (key, value) in entries {
            if skip.contains(&key.as_str()) {
                continue;
            }
            let Some(f) = m.fields.iter().find(|f| f.name == key || f.json == key) else {
                let at = join(path, key);
                if self.allow_unknown {
                    self.out.unknown.push(at);
                    had_unknown = true;
                    continue;
                }
                return err(
                    &at,
                    format!(
                        "unknown field `{key}`: Envoy's {} has no such field",
                        m.name
                    ),
                );
            };
            let at = join(path, f.name);
            if out.iter().any(|(k, _)| k == f.name) {
                return err(&at, "set twice (by its proto and its JSON name)");
            }
            if f.disallowed {
                return err(
                    &at,
                    "deprecated, and disallowed by default in Envoy: it refuses this field",
                );
            }
            // protobuf's JSON parser: null is the default, present or not.
            if *value == Node::Null
                && !matches!(f.kind, Kind::Msg(i) if MESSAGES[usize::from(i)].name == "google.protobuf.Value")
            {
                continue;
            }
            if let Some(o) = f.oneof {
                let slot = &mut oneof_set[usize::from(o)];
                if let Some(other) = slot {
                    return err(
                        &at,
                        format!(
                            "`{other}` and `{}` are both set, but they are alternatives (oneof {})",
                            f.name,
                            m.oneofs[usize::from(o)].0
                        ),
                    );
                }
                *slot = Some(f.name);
            }
            self.out.present.push(Present {
                path: at.clone(),
                qualified: format!("{}.{}", m.name, f.name),
                deprecated: f.deprecated,
                parent,
            });
            let me = Some(self.out.present.len() - 1);
            let (normalized, scalars) = match f.card {
                Card::One => {
                    let (n, s) = self.value(value, f.kind, &at, me)?;
                    (n, s.into_iter().collect())
                }
                Card::Many => {
                    let Node::Seq(items) = value else {
                        return err(&at, format!("expected a list, got {}", value.describe()));
                    };
                    let mut ns = Vec::with_capacity(items.len());
                    let mut ss = Vec::new();
                    for (i, item) in items.iter().enumerate() {
                        let (n, s) = self.value(item, f.kind, &format!("{at}[{i}]"), me)?;
                        ns.push(n);
                        ss.extend(s);
                    }
                    (Node::Seq(ns), ss)
                }
                Card::Map(key_kind) => {
                    let Node::Map(pairs) = value else {
                        return err(&at, format!("expected a mapping, got {}", value.describe()));
                    };
                    let mut ns = Vec::with_capacity(pairs.len());
                    let mut keys = Vec::new();
                    for (k, v) in pairs {
                        let kp = format!("{at}[{k}]");
                        let key_node = match key_kind {
                            Kind::Str => Node::Str(k.clone()),
                            Kind::Bool => match k.as_str() {
                                "true" => Node::Bool(true),
                                "false" => Node::Bool(false),
                                _ => return err(&kp, "a map key must be true or false"),
                            },
                            _ => Node::Str(k.clone()),
                        };
                        keys.push(self.scalar(&key_node, key_kind, &kp)?);
                        let (n, _) = self.value(v, f.kind, &kp, me)?;
                        ns.push((k.clone(), n));
                    }
                    (Node::Map(ns), keys)
                }
            };
            out.push((f.name.to_string(), normalized));
            values.push((f, out.len() - 1, scalars));
        }
        if had_unknown {
            self.out.unknown_messages += 1;
        }
        if m.pgv {
            let values: Vec<(&'static Field, &Node, &[Scalar])> = values
                .iter()
                .map(|(f, i, s)| (*f, &out[*i].1, s.as_slice()))
                .collect();
            pgv(m, path, &values, &oneof_set)?;
        }
        Ok(Node::Map(out))
    }

    /// The well-known types whose JSON form is their own.
    fn special(
        &mut self,
        node: &Node,
        m: &'static Message,
        path: &str,
        parent: Option<usize>,
    ) -> Result<Node, SchemaError> {
        if let Some(kind) = wrapper_kind(m.name) {
            self.scalar(node, kind, path)?;
            return Ok(node.clone());
        }
        match m.name {
            "google.protobuf.Duration" => match node {
                Node::Str(s) => {
                    envoy_rules::parse_duration(s).map_err(|e| SchemaError {
                        path: path.into(),
                        message: e,
                    })?;
                    Ok(node.clone())
                }
                _ => err(
                    path,
                    format!("expected a duration like \"5s\", got {}", node.describe()),
                ),
            },
            "google.protobuf.Timestamp" | "google.protobuf.FieldMask" => match node {
                Node::Str(_) => Ok(node.clone()),
                _ => err(path, format!("expected a string, got {}", node.describe())),
            },
            "google.protobuf.Struct" => match node {
                Node::Map(_) => Ok(node.clone()),
                _ => err(path, format!("expected a mapping, got {}", node.describe())),
            },
            "google.protobuf.ListValue" => match node {
                Node::Seq(_) => Ok(node.clone()),
                _ => err(path, format!("expected a list, got {}", node.describe())),
            },
            "google.protobuf.Empty" => match node {
                Node::Map(m) if m.is_empty() => Ok(node.clone()),
                _ => err(path, "expected an empty mapping"),
            },
            "google.protobuf.Any" => self.any(node, path, parent),
            // google.protobuf.Value: any JSON value.
            _ => Ok(node.clone()),
        }
    }

    /// An Any: `@type` and the fields of that type (or `value`, for a
    /// well-known type with a JSON form of its own).
    fn any(&mut self, node: &Node, path: &str, parent: Option<usize>) -> Result<Node, SchemaError> {
        let Node::Map(entries) = node else {
            return err(
                path,
                format!("expected a mapping with \"@type\", got {}", node.describe()),
            );
        };
        let Some(url) = node.get("@type") else {
            if entries.is_empty() {
                return Ok(Node::Map(Vec::new()));
            }
            return err(path, "an Any without \"@type\"");
        };
        let Some(url) = url.as_str() else {
            return err(&join(path, "@type"), "expected a string");
        };
        let name = url.rsplit('/').next().unwrap_or(url);
        if !url.contains('/') || name.is_empty() {
            return err(
                &join(path, "@type"),
                format!("{url:?} is not a type URL like type.googleapis.com/<message>"),
            );
        }
        let Some(m) = message(name) else {
            // Not in the table: Envoy takes it if it links that type; its
            // content is not checked here.
            self.out.opaque.push(format!("{path} ({name})"));
            return Ok(node.clone());
        };
        let mut out = vec![("@type".to_string(), Node::Str(url.to_string()))];
        if special_json(m.name) {
            let value = node.get("value").unwrap_or(&Node::Null);
            if entries.len() > 2 || (entries.len() == 2 && node.get("value").is_none()) {
                return err(path, format!("an Any of {} holds only \"value\"", m.name));
            }
            out.push((
                "value".into(),
                self.special(value, m, &join(path, "value"), parent)?,
            ));
            return Ok(Node::Map(out));
        }
        let Node::Map(fields) = self.fields(entries, m, path, parent, &["@type"])? else {
            return Ok(Node::Map(out));
        };
        out.extend(fields);
        Ok(Node::Map(out))
    }
}

/// The PGV rules of message `m`'s fields, as go-control-plane's
/// `Validate()` applies them (absent scalars are their zero value).
fn pgv(
    m: &'static Message,
    path: &str,
    values: &[(&'static Field, &Node, &[Scalar])],
    oneof_set: &[Option<&'static str>],
) -> Result<(), SchemaError> {
    for (i, (name, required)) in m.oneofs.iter().enumerate() {
        if *required && oneof_set[i].is_none() {
            return err(
                path,
                format!(
                    "one of {} is required (oneof {name})",
                    m.fields
                        .iter()
                        .filter(|f| f.oneof == Some(i as u8))
                        .map(|f| format!("`{}`", f.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
    for f in m.fields {
        if f.rules.is_empty() || f.rules.contains(&Rule::Skip) {
            continue;
        }
        let at = join(path, f.name);
        let got = values.iter().find(|(g, _, _)| std::ptr::eq(*g, f));
        // A oneof member not set is not validated.
        if got.is_none() && f.oneof.is_some() {
            continue;
        }
        let bad = |why: String| err::<()>(&at, format!("{why} (PGV rule of Envoy's API)"));
        match (f.card, &f.kind) {
            (Card::Many, _) | (Card::Map(_), _) => {
                let (count, scalars, node) = match got {
                    Some((_, n, s)) => (
                        match n {
                            Node::Seq(v) => v.len(),
                            Node::Map(v) => v.len(),
                            _ => 0,
                        },
                        *s,
                        Some(*n),
                    ),
                    None => (0, &[][..], None),
                };
                let enum_def = match f.kind {
                    Kind::Enum(e) => Some(&ENUMS[usize::from(e)]),
                    _ => None,
                };
                if f.rules.contains(&Rule::IgnoreEmpty) && count == 0 {
                    continue;
                }
                for r in f.rules {
                    match *r {
                        Rule::MinItems(n) if (count as u64) < n => {
                            bad(format!("needs at least {n} item(s), has {count}"))?
                        }
                        Rule::MaxItems(n) if count as u64 > n => {
                            bad(format!("allows at most {n} item(s), has {count}"))?
                        }
                        Rule::Unique => {
                            if let Some(Node::Seq(items)) = node {
                                for (i, a) in items.iter().enumerate() {
                                    if items[..i].contains(a) {
                                        bad("items must be unique".into())?;
                                    }
                                }
                            }
                        }
                        Rule::Items(rules) if matches!(f.card, Card::Many) => {
                            for (i, s) in scalars.iter().enumerate() {
                                scalar_rules(rules, s, enum_def, &format!("{at}[{i}]"))?;
                            }
                            if rules.contains(&Rule::Required)
                                && let Some(Node::Seq(items)) = node
                                && items.contains(&Node::Null)
                            {
                                bad("an item is required to be set".into())?;
                            }
                        }
                        Rule::Keys(rules) => {
                            for s in scalars {
                                scalar_rules(rules, s, None, &at)?;
                            }
                        }
                        _ => {}
                    }
                }
            }
            (Card::One, Kind::Msg(i)) => {
                let inner = &MESSAGES[usize::from(*i)];
                let present = got.is_some_and(|(_, n, _)| **n != Node::Null);
                if !present {
                    if f.rules.contains(&Rule::Required) {
                        bad("is required".into())?;
                    }
                    continue;
                }
                if let Some((_, _, scalars)) = got
                    && let Some(s) = scalars.first()
                {
                    if inner.name == "google.protobuf.Duration" {
                        duration_rules(f.rules, s, &at)?;
                    } else {
                        scalar_rules(f.rules, s, None, &at)?;
                    }
                }
                if inner.name == "google.protobuf.Any"
                    && let Some((_, n, _)) = got
                {
                    for r in f.rules {
                        if let Rule::AnyIn(allowed) = r {
                            let url = n.get("@type").and_then(Node::as_str).unwrap_or("");
                            if !allowed.contains(&url) {
                                bad(format!("@type {url:?} is not one of {allowed:?}"))?;
                            }
                        }
                    }
                }
            }
            (Card::One, kind) => {
                let zero = match kind {
                    Kind::Bool => Scalar::Bool(false),
                    Kind::Str => Scalar::Str(String::new()),
                    Kind::Bytes => Scalar::Bytes(0),
                    Kind::Enum(_) => Scalar::Enum(0),
                    _ => Scalar::Num(0.0),
                };
                let s = got.and_then(|(_, _, s)| s.first()).unwrap_or(&zero);
                let enum_def = match kind {
                    Kind::Enum(e) => Some(&ENUMS[usize::from(*e)]),
                    _ => None,
                };
                scalar_rules(f.rules, s, enum_def, &at)?;
            }
        }
    }
    Ok(())
}

fn seconds(s: u64, n: u32) -> f64 {
    s as f64 + f64::from(n) / 1e9
}

/// A PGV duration bound as people write it (`0s`, `1ms`, `5s`).
fn shown(s: u64, n: u32) -> String {
    if s == 0 && n == 0 {
        "0s".into()
    } else {
        format!("{:?}", std::time::Duration::new(s, n))
    }
}

fn duration_rules(rules: &[Rule], s: &Scalar, at: &str) -> Result<(), SchemaError> {
    let Scalar::Num(v) = s else { return Ok(()) };
    let v = *v;
    for r in rules {
        let (ok, what) = match *r {
            Rule::DurationGt(a, b) => (v > seconds(a, b), format!("greater than {}", shown(a, b))),
            Rule::DurationGte(a, b) => (v >= seconds(a, b), format!("at least {}", shown(a, b))),
            Rule::DurationLt(a, b) => (v < seconds(a, b), format!("less than {}", shown(a, b))),
            Rule::DurationLte(a, b) => (v <= seconds(a, b), format!("at most {}", shown(a, b))),
            _ => (true, String::new()),
        };
        if !ok {
            return err(at, format!("must be {what} (PGV rule of Envoy's API)"));
        }
    }
    Ok(())
}

fn header_char_ok(c: char, name: bool, strict: bool) -> bool {
    if !strict {
        return !matches!(c, '\0' | '\n' | '\r');
    }
    if name {
        c.is_ascii_alphanumeric() || "!#$%&'*+,-.^_|~`".contains(c)
    } else {
        !(('\0'..='\u{8}').contains(&c) || ('\u{a}'..='\u{1f}').contains(&c) || c == '\u{7f}')
    }
}

/// PGV's rules on one scalar value (`enum_def`: its enum, if it is one).
fn scalar_rules(
    rules: &[Rule],
    s: &Scalar,
    enum_def: Option<&Enum>,
    at: &str,
) -> Result<(), SchemaError> {
    let empty = match s {
        Scalar::Str(v) => v.is_empty(),
        Scalar::Num(v) => *v == 0.0,
        Scalar::Bytes(n) => *n == 0,
        Scalar::Enum(v) => *v == 0,
        Scalar::Bool(b) => !b,
    };
    if empty && rules.contains(&Rule::IgnoreEmpty) {
        return Ok(());
    }
    for r in rules {
        let fail = match (*r, s) {
            (Rule::MinLen(n), Scalar::Str(v)) => {
                ((v.chars().count() as u64) < n).then(|| format!("needs at least {n} character(s)"))
            }
            (Rule::MaxLen(n), Scalar::Str(v)) => {
                (v.chars().count() as u64 > n).then(|| format!("allows at most {n} character(s)"))
            }
            (Rule::Len(n), Scalar::Str(v)) => {
                (v.chars().count() as u64 != n).then(|| format!("must be {n} character(s) long"))
            }
            (Rule::MinBytes(n), Scalar::Str(v)) => {
                ((v.len() as u64) < n).then(|| format!("needs at least {n} byte(s)"))
            }
            (Rule::MaxBytes(n), Scalar::Str(v)) => {
                (v.len() as u64 > n).then(|| format!("allows at most {n} byte(s)"))
            }
            (Rule::MinBytes(n), Scalar::Bytes(len)) => {
                ((*len as u64) < n).then(|| format!("needs at least {n} byte(s)"))
            }
            (Rule::MaxBytes(n), Scalar::Bytes(len)) => {
                (*len as u64 > n).then(|| format!("allows at most {n} byte(s)"))
            }
            (Rule::In(set), Scalar::Str(v)) => {
                (!set.contains(&v.as_str())).then(|| format!("must be one of {set:?}"))
            }
            (Rule::NotIn(set), Scalar::Str(v)) => set
                .contains(&v.as_str())
                .then(|| format!("must not be one of {set:?}")),
            (Rule::Prefix(p), Scalar::Str(v)) => {
                (!v.starts_with(p)).then(|| format!("must start with {p:?}"))
            }
            (Rule::Suffix(p), Scalar::Str(v)) => {
                (!v.ends_with(p)).then(|| format!("must end with {p:?}"))
            }
            (Rule::Contains(p), Scalar::Str(v)) => {
                (!v.contains(p)).then(|| format!("must contain {p:?}"))
            }
            (Rule::StrConst(p), Scalar::Str(v)) => (v != p).then(|| format!("must be {p:?}")),
            (Rule::HeaderName { strict }, Scalar::Str(v)) => {
                let ok = if strict {
                    let body = v.strip_prefix(':').unwrap_or(v);
                    !body.is_empty() && body.chars().all(|c| header_char_ok(c, true, true))
                } else {
                    v.chars().all(|c| header_char_ok(c, true, false))
                };
                (!ok).then(|| "is not a valid HTTP header name".to_string())
            }
            (Rule::HeaderValue { strict }, Scalar::Str(v)) => {
                (!v.chars().all(|c| header_char_ok(c, false, strict)))
                    .then(|| "is not a valid HTTP header value".to_string())
            }
            (Rule::Gt(n), Scalar::Num(v)) => (*v <= n).then(|| format!("must be greater than {n}")),
            (Rule::Gte(n), Scalar::Num(v)) => (*v < n).then(|| format!("must be at least {n}")),
            (Rule::Lt(n), Scalar::Num(v)) => (*v >= n).then(|| format!("must be less than {n}")),
            (Rule::Lte(n), Scalar::Num(v)) => (*v > n).then(|| format!("must be at most {n}")),
            (Rule::NumConst(n), Scalar::Num(v)) => (*v != n).then(|| format!("must be {n}")),
            (Rule::BoolConst(b), Scalar::Bool(v)) => (*v != b).then(|| format!("must be {b}")),
            (Rule::DefinedOnly, Scalar::Enum(v)) => enum_def
                .filter(|e| !e.values.iter().any(|(_, n)| n == v))
                .map(|e| format!("{v} is not a value of {}", e.name)),
            (Rule::EnumNotIn(set), Scalar::Enum(v)) => {
                set.contains(v).then(|| format!("must not be {v}"))
            }
            (Rule::EnumIn(set), Scalar::Enum(v)) => {
                (!set.contains(v)).then(|| format!("must be one of {set:?}"))
            }
            _ => None,
        };
        if let Some(why) = fail {
            return err(at, format!("{why} (PGV rule of Envoy's API)"));
        }
    }
    Ok(())
}
