//! The shape of Envoy's schema table ([`crate::envoy_schema`], generated):
//! messages, their fields and oneofs, enums, and the PGV rules the table
//! expresses. [`crate::schema`] checks a bootstrap against the table.

/// A field's value type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Str,
    Bytes,
    I32,
    I64,
    U32,
    U64,
    F32,
    F64,
    /// Index into [`crate::envoy_schema::ENUMS`].
    Enum(u16),
    /// Index into [`crate::envoy_schema::MESSAGES`].
    Msg(u16),
}

/// Singular, repeated, or a map with keys of this kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Card {
    One,
    Many,
    Map(Kind),
}

/// A PGV rule, as far as the table expresses it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    Required,
    Skip,
    DurationGt(u64, u32),
    DurationGte(u64, u32),
    DurationLt(u64, u32),
    DurationLte(u64, u32),
    IgnoreEmpty,
    MinLen(u64),
    MaxLen(u64),
    MinBytes(u64),
    MaxBytes(u64),
    Len(u64),
    LenBytes(u64),
    MinItems(u64),
    MaxItems(u64),
    In(&'static [&'static str]),
    NotIn(&'static [&'static str]),
    Prefix(&'static str),
    Suffix(&'static str),
    Contains(&'static str),
    StrConst(&'static str),
    /// A regular expression: not enforced (one field in the table, which
    /// the policy refuses anyway).
    Pattern(&'static str),
    HeaderName {
        strict: bool,
    },
    HeaderValue {
        strict: bool,
    },
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
    NumConst(f64),
    BoolConst(bool),
    DefinedOnly,
    EnumNotIn(&'static [i32]),
    EnumIn(&'static [i32]),
    Unique,
    Items(&'static [Rule]),
    Keys(&'static [Rule]),
    Values(&'static [Rule]),
    AnyIn(&'static [&'static str]),
    /// A rule kind the generator could not express: not enforced.
    Unsupported(&'static str),
}

#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    pub json: &'static str,
    pub kind: Kind,
    pub card: Card,
    /// Index into the message's `oneofs`.
    pub oneof: Option<u8>,
    pub deprecated: bool,
    /// Deprecated and disallowed by default: Envoy refuses it.
    pub disallowed: bool,
    pub rules: &'static [Rule],
}

#[derive(Debug)]
pub struct Message {
    pub name: &'static str,
    /// Name, and whether PGV requires one member set.
    pub oneofs: &'static [(&'static str, bool)],
    /// PGV validates this message (not disabled or ignored).
    pub pgv: bool,
    pub fields: &'static [Field],
}

#[derive(Debug)]
pub struct Enum {
    pub name: &'static str,
    pub values: &'static [(&'static str, i32)],
}
