//! Command-line flags in Go's syntax, so the flags upstream manifests pass keep
//! working unchanged: `--name=value`, `--name value`, `-name=value` (Go's `flag`
//! package, which KKP's binaries use), bare `--bool` / `--bool=false`, Go
//! durations (`1h0m0s`), Go ints (`0x10`), pflag string slices (`a,b`, `[]`).
//!
//! Written here rather than taken from clap because clap cannot accept
//! single-dash long flags or Go's value syntax, and both appear in real manifests.
//!
//! A binary declares its flags once, as the fields of a [`typed_flags!`]
//! struct: `--help` comes from that declaration and the binary reads the
//! filled struct, so a flag it never declared cannot be read (a typo does not
//! compile) and none reads as a silent zero.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use crate::duration;

/// The type of a flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    String,
    Int,
    Float,
    Duration,
    Strings,
}

/// A parsed flag value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    String(String),
    Int(i64),
    Float(f64),
    Duration(Duration),
    Strings(Vec<String>),
}

impl Value {
    fn render(&self) -> String {
        match self {
            Value::Bool(b) => b.to_string(),
            Value::String(s) => format!("{s:?}"),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Duration(d) => duration::format(*d),
            Value::Strings(v) => format!("[{}]", v.join(",")),
        }
    }
}

#[derive(Debug, Clone)]
struct Flag {
    name: &'static str,
    short: Option<char>,
    kind: Kind,
    default: Value,
    usage: &'static str,
    deprecated: Option<&'static str>,
    hidden: bool,
}

/// Why parsing stopped. `Help` is not a failure: the caller prints usage.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FlagError {
    #[error("help requested")]
    Help,
    #[error("version requested")]
    Version,
    #[error("unknown flag: {0}")]
    Unknown(String),
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("invalid argument {value:?} for \"--{flag}\" flag: {reason}")]
    Invalid {
        flag: String,
        value: String,
        reason: String,
    },
    #[error("unexpected argument {0:?}: this command takes only flags")]
    Positional(String),
}

/// A declared set of flags. Build it with the typed adders, then [`FlagSet::parse`].
#[derive(Debug, Clone)]
pub struct FlagSet {
    program: String,
    about: String,
    flags: Vec<Flag>,
    /// What `--version` says the program is compatible with.
    compatible_with: Option<&'static str>,
    /// Exit status for a bad command line or configuration, as the program
    /// this one replaces uses (cobra: 1; Go's flag package: 2).
    usage_exit: i32,
}

/// The result of parsing: every declared flag has a value (its default if unset).
#[derive(Debug, Clone, Default)]
pub struct Values {
    values: BTreeMap<&'static str, Value>,
    explicit: BTreeSet<&'static str>,
    /// Flags in the order they were given (repeats included).
    given: Vec<&'static str>,
}

impl FlagSet {
    pub fn new(program: &str, about: &str) -> Self {
        FlagSet {
            program: program.to_string(),
            about: about.to_string(),
            flags: Vec::new(),
            compatible_with: None,
            usage_exit: 2,
        }
    }

    /// Names what this program replaces, for `--version`.
    pub fn compatible_with(mut self, what: &'static str) -> Self {
        self.compatible_with = Some(what);
        self
    }

    /// The exit status for a bad command line or configuration.
    pub fn usage_exit(mut self, code: i32) -> Self {
        self.usage_exit = code;
        self
    }

    /// `--version`'s line: version, commit, and what it is compatible with.
    pub fn version(&self) -> String {
        let mut s = format!(
            "{} {} (commit {})",
            self.program,
            env!("CARGO_PKG_VERSION"),
            env!("DAEMON_GIT_COMMIT")
        );
        if let Some(c) = self.compatible_with {
            s.push_str(&format!(", compatible with {c}"));
        }
        s
    }

    fn add(mut self, name: &'static str, kind: Kind, default: Value, usage: &'static str) -> Self {
        debug_assert!(
            self.flags.iter().all(|f| f.name != name),
            "flag {name} declared twice"
        );
        self.flags.push(Flag {
            name,
            short: None,
            kind,
            default,
            usage,
            deprecated: None,
            hidden: false,
        });
        self
    }

    pub fn bool(self, name: &'static str, default: bool, usage: &'static str) -> Self {
        self.add(name, Kind::Bool, Value::Bool(default), usage)
    }

    pub fn string(self, name: &'static str, default: &str, usage: &'static str) -> Self {
        self.add(
            name,
            Kind::String,
            Value::String(default.to_string()),
            usage,
        )
    }

    pub fn int(self, name: &'static str, default: i64, usage: &'static str) -> Self {
        self.add(name, Kind::Int, Value::Int(default), usage)
    }

    pub fn float(self, name: &'static str, default: f64, usage: &'static str) -> Self {
        self.add(name, Kind::Float, Value::Float(default), usage)
    }

    pub fn duration(self, name: &'static str, default: Duration, usage: &'static str) -> Self {
        self.add(name, Kind::Duration, Value::Duration(default), usage)
    }

    pub fn strings(self, name: &'static str, default: &[&str], usage: &'static str) -> Self {
        let v = default.iter().map(|s| (*s).to_string()).collect();
        self.add(name, Kind::Strings, Value::Strings(v), usage)
    }

    fn last(&mut self) -> Option<&mut Flag> {
        self.flags.last_mut()
    }

    /// Gives the flag added last a one-letter alias (`-v`).
    pub fn short(mut self, c: char) -> Self {
        if let Some(f) = self.last() {
            f.short = Some(c);
        }
        self
    }

    /// Accepts the flag added last but warns that it has no effect any more.
    pub fn deprecated(mut self, message: &'static str) -> Self {
        if let Some(f) = self.last() {
            f.deprecated = Some(message);
            f.hidden = true;
        }
        self
    }

    /// Accepts the flag added last without listing it in the usage text.
    pub fn hidden(mut self) -> Self {
        if let Some(f) = self.last() {
            f.hidden = true;
        }
        self
    }

    /// Adds the klog flags upstream binaries accept ([`Klog`]), with klog's
    /// defaults except `-v` (upstream's mains set 4), and component-base's
    /// `--logging-format`; [`crate::logging`] applies them.
    pub fn with_klog(self, default_verbosity: i64) -> Self {
        let mut set = Klog::declare(self);
        if let Some(f) = set.flags.iter_mut().find(|f| f.name == "v") {
            f.default = Value::Int(default_verbosity);
        }
        set
    }

    /// Adds KKP's logging flags ([`KkpLogging`], `pkg/log/zap.go`);
    /// [`crate::logging`] applies them.
    pub fn with_kkp_logging(self) -> Self {
        KkpLogging::declare(self)
    }

    fn find(&self, name: &str) -> Option<&Flag> {
        let normalized = name.replace('_', "-");
        self.flags.iter().find(|f| f.name == normalized)
    }

    fn find_short(&self, c: &str) -> Option<&Flag> {
        let mut chars = c.chars();
        let (Some(ch), None) = (chars.next(), chars.next()) else {
            return None;
        };
        self.flags.iter().find(|f| f.short == Some(ch))
    }

    /// Parses `args` (without the program name).
    pub fn parse<I, S>(&self, args: I) -> Result<Values, FlagError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut values = Values {
            values: self
                .flags
                .iter()
                .map(|f| (f.name, f.default.clone()))
                .collect(),
            explicit: BTreeSet::new(),
            given: Vec::new(),
        };
        let mut args = args.into_iter().map(Into::into);
        while let Some(arg) = args.next() {
            if arg == "--" {
                if let Some(extra) = args.next() {
                    return Err(FlagError::Positional(extra));
                }
                break;
            }
            let Some(body) = arg
                .strip_prefix("--")
                .or_else(|| arg.strip_prefix('-'))
                .filter(|b| !b.is_empty())
            else {
                return Err(FlagError::Positional(arg));
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if matches!(name, "h" | "help") {
                return Err(FlagError::Help);
            }
            if name == "version" && self.find("version").is_none() {
                return Err(FlagError::Version);
            }
            let flag = self
                .find(name)
                .or_else(|| self.find_short(name))
                .ok_or_else(|| FlagError::Unknown(arg.clone()))?;
            let raw = match (inline, flag.kind) {
                (Some(v), _) => v,
                (None, Kind::Bool) => "true".to_string(),
                (None, _) => args
                    .next()
                    .ok_or_else(|| FlagError::MissingValue(format!("--{}", flag.name)))?,
            };
            let value = parse_value(flag, &raw)?;
            if let Some(msg) = flag.deprecated {
                eprintln!("Flag --{} has been deprecated, {msg}", flag.name);
            }
            // A slice flag given twice appends, as pflag does.
            match (values.values.get_mut(flag.name), value) {
                (Some(Value::Strings(old)), Value::Strings(new))
                    if values.explicit.contains(flag.name) =>
                {
                    old.extend(new)
                }
                (Some(slot), value) => *slot = value,
                (None, _) => {}
            }
            values.explicit.insert(flag.name);
            values.given.push(flag.name);
        }
        Ok(values)
    }

    /// The help text: one line per visible flag with its type and default.
    pub fn usage(&self) -> String {
        let mut out = format!(
            "{}\n\nUsage:\n  {} [flags]\n\nFlags:\n",
            self.about, self.program
        );
        for f in self.flags.iter().filter(|f| !f.hidden) {
            let short = f.short.map(|c| format!("-{c}, ")).unwrap_or_default();
            let ty = match f.kind {
                Kind::Bool => "",
                Kind::String => " string",
                Kind::Int => " int",
                Kind::Float => " float",
                Kind::Duration => " duration",
                Kind::Strings => " strings",
            };
            let _ = writeln!(out, "  {short}--{}{ty}", f.name);
            let _ = writeln!(out, "        {} (default {})", f.usage, f.default.render());
        }
        out
    }

    /// Parses the process arguments. `-h` prints usage and exits 0; any error
    /// prints the reason and exits with the program's usage status: 2 (Go's
    /// flag package) unless `usage_exit` set another (the Konnectivity
    /// binaries exit 1, as upstream's cobra commands do).
    pub fn parse_env_or_exit(&self) -> Values {
        let _ = USAGE_EXIT.set(self.usage_exit);
        match self.parse(std::env::args().skip(1)) {
            Ok(v) => v,
            Err(FlagError::Help) => {
                print!("{}", self.usage());
                std::process::exit(0)
            }
            Err(FlagError::Version) => {
                println!("{}", self.version());
                std::process::exit(0)
            }
            Err(e) => usage_error(&format!("{e}\nRun '{} --help' for usage.", self.program)),
        }
    }
}

/// The running program's exit status for usage errors (set when its flags
/// are parsed).
static USAGE_EXIT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

/// Reports an invalid command line or configuration and exits with the
/// status the replaced program uses for it (see [`FlagSet::usage_exit`]).
pub fn usage_error(message: &str) -> ! {
    eprintln!("Error: {message}");
    std::process::exit(USAGE_EXIT.get().copied().unwrap_or(2))
}

/// Reports an error that stops the program at start (a port in use, a
/// file it cannot read) in one sentence and exits 1, as upstream's commands
/// do for errors returned from their run function.
pub fn fatal(message: &str) -> ! {
    eprintln!("Error: {message}");
    std::process::exit(1)
}

fn invalid(flag: &Flag, value: &str, reason: impl ToString) -> FlagError {
    FlagError::Invalid {
        flag: flag.name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_value(flag: &Flag, raw: &str) -> Result<Value, FlagError> {
    Ok(match flag.kind {
        Kind::Bool => Value::Bool(
            parse_go_bool(raw)
                .ok_or_else(|| invalid(flag, raw, "strconv.ParseBool: parsing: invalid syntax"))?,
        ),
        Kind::String => Value::String(raw.to_string()),
        Kind::Int => {
            Value::Int(parse_go_int(raw).ok_or_else(|| invalid(flag, raw, "invalid syntax"))?)
        }
        Kind::Float => Value::Float(raw.parse().map_err(|e| invalid(flag, raw, e))?),
        Kind::Duration => Value::Duration(duration::parse(raw).map_err(|e| invalid(flag, raw, e))?),
        Kind::Strings => {
            // pflag prints an empty slice as `[]`; test frameworks pass it back verbatim.
            let inner = raw
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .unwrap_or(raw);
            Value::Strings(
                inner
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        }
    })
}

fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// `strconv.ParseInt(s, 0, 64)`: decimal, `0x`, `0o`/`0`, `0b`, `_` separators.
fn parse_go_int(v: &str) -> Option<i64> {
    let (neg, body) = match v.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let body = body.replace('_', "");
    let (radix, digits) =
        if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            (16, h.to_string())
        } else if let Some(b) = body.strip_prefix("0b").or_else(|| body.strip_prefix("0B")) {
            (2, b.to_string())
        } else if let Some(o) = body.strip_prefix("0o").or_else(|| body.strip_prefix("0O")) {
            (8, o.to_string())
        } else if body.len() > 1 && body.starts_with('0') {
            (8, body[1..].to_string())
        } else {
            (10, body)
        };
    if digits.is_empty() {
        return None;
    }
    let n = i64::from_str_radix(&digits, radix).ok()?;
    Some(if neg { -n } else { n })
}

impl Values {
    /// A duration flag by name, for tests that check a manifest's flags
    /// without knowing which binary's struct they fill; binaries read their
    /// [`typed_flags!`] struct. Panics when no duration flag has that name.
    #[doc(hidden)]
    pub fn duration(&self, name: &str) -> Duration {
        match self.values.get(name) {
            Some(Value::Duration(d)) => *d,
            _ => panic!("no duration flag --{name} is declared"),
        }
    }
}

/// A type a flag's value can be read into: the flag kinds' Rust types, and
/// [`Given`] around any of them. Used by [`typed_flags!`].
pub trait FlagValue: Sized {
    /// What the declaration gives as the default.
    type Default;
    #[doc(hidden)]
    fn declare(
        set: FlagSet,
        name: &'static str,
        default: Self::Default,
        usage: &'static str,
    ) -> FlagSet;
    #[doc(hidden)]
    fn read(values: &Values, name: &'static str) -> Self;
}

macro_rules! flag_value {
    ($ty:ty, $adder:ident, $variant:ident) => {
        impl FlagValue for $ty {
            type Default = $ty;
            fn declare(
                set: FlagSet,
                name: &'static str,
                default: $ty,
                usage: &'static str,
            ) -> FlagSet {
                set.$adder(name, default, usage)
            }
            fn read(values: &Values, name: &'static str) -> $ty {
                match values.values.get(name) {
                    Some(Value::$variant(v)) => v.clone(),
                    _ => Default::default(),
                }
            }
        }
    };
}

flag_value!(bool, bool, Bool);
flag_value!(i64, int, Int);
flag_value!(f64, float, Float);
flag_value!(Duration, duration, Duration);

impl FlagValue for String {
    type Default = String;
    fn declare(set: FlagSet, name: &'static str, default: String, usage: &'static str) -> FlagSet {
        set.string(name, &default, usage)
    }
    fn read(values: &Values, name: &'static str) -> String {
        match values.values.get(name) {
            Some(Value::String(v)) => v.clone(),
            _ => String::new(),
        }
    }
}

impl FlagValue for Vec<String> {
    type Default = Vec<String>;
    fn declare(
        set: FlagSet,
        name: &'static str,
        default: Vec<String>,
        usage: &'static str,
    ) -> FlagSet {
        let default: Vec<&str> = default.iter().map(String::as_str).collect();
        set.strings(name, &default, usage)
    }
    fn read(values: &Values, name: &'static str) -> Vec<String> {
        match values.values.get(name) {
            Some(Value::Strings(v)) => v.clone(),
            _ => Vec::new(),
        }
    }
}

/// A flag's value with its name and whether (and where) the command line
/// gave it: for "only when set" settings, errors that name the flag, and two
/// flags that set the same thing (the one given last wins).
#[derive(Debug, Clone, PartialEq)]
pub struct Given<T> {
    pub value: T,
    name: &'static str,
    /// Index among the flags given of this one's last appearance.
    position: Option<usize>,
}

impl<T> Given<T> {
    /// The flag's declared name (without dashes).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether the flag appeared on the command line (as opposed to its default).
    pub fn is_set(&self) -> bool {
        self.position.is_some()
    }

    /// The value when the flag was given.
    pub fn if_set(&self) -> Option<&T> {
        self.position.map(|_| &self.value)
    }

    /// Whether this flag was given after `other` (or `other` not at all),
    /// as pflag leaves the value of whichever came last.
    pub fn given_after<U>(&self, other: &Given<U>) -> bool {
        self.position > other.position
    }
}

impl<T: FlagValue> FlagValue for Given<T> {
    type Default = T::Default;
    fn declare(
        set: FlagSet,
        name: &'static str,
        default: T::Default,
        usage: &'static str,
    ) -> FlagSet {
        T::declare(set, name, default, usage)
    }
    fn read(values: &Values, name: &'static str) -> Self {
        Given {
            value: T::read(values, name),
            name,
            position: values.given.iter().rposition(|g| *g == name),
        }
    }
}

impl Given<String> {
    /// A path flag that, when set (non-empty), must name an existing file.
    pub fn existing_file(&self) -> Result<Option<std::path::PathBuf>, String> {
        existing_file(self.name, &self.value)
    }
}

impl Given<i64> {
    /// A port flag as `u16`, with the flag name in the error.
    pub fn port(&self) -> Result<u16, String> {
        let v = self.value;
        u16::try_from(v).map_err(|_| format!("--{}: {v} is not a valid port", self.name))
    }
}

fn existing_file(name: &str, s: &str) -> Result<Option<std::path::PathBuf>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let p = std::path::PathBuf::from(s);
    match std::fs::metadata(&p) {
        Ok(m) if m.is_dir() => Err(format!("--{name} {s} is a directory; it must name a file")),
        Ok(_) => Ok(Some(p)),
        Err(e) => Err(format!("--{name} {s}: {}", crate::errors::io_reason(&e))),
    }
}

/// Declares a struct of flags once: each field's flag name, default and usage
/// (and `short('c')`, `deprecated("why")`, `hidden`), in `--help` order, and
/// groups of flags (`#[embed(with_klog(4))] log: Klog`) after them. It
/// generates the struct, `declare(FlagSet) -> FlagSet` (what `--help` lists)
/// and `from_values(&Values) -> Self` (the struct filled from a parse), both
/// from that one list, so a misspelt field does not compile and no flag is
/// read by a name it was not declared under. With `= (FlagSet::new(..))`
/// after the name it also generates `flag_set()`.
///
/// ```
/// go_compat::typed_flags! {
///     pub struct Demo = (go_compat::flags::FlagSet::new("demo", "A demo.")) {
///         #[flag("server-port", 8090, "Port we listen on.")] server_port: i64,
///         #[flag("mode", "grpc", "Mode.", short('m'))] mode: String,
///     }
/// }
/// let v = Demo::flag_set().parse(["-m", "http"]).unwrap_or_default();
/// let d = Demo::from_values(&v);
/// assert_eq!((d.server_port, d.mode.as_str()), (8090, "http"));
/// ```
///
/// A misspelt field is a compile error (the same code, `server_prot`):
///
/// ```compile_fail
/// go_compat::typed_flags! {
///     pub struct Demo = (go_compat::flags::FlagSet::new("demo", "A demo.")) {
///         #[flag("server-port", 8090, "Port we listen on.")] server_port: i64,
///         #[flag("mode", "grpc", "Mode.", short('m'))] mode: String,
///     }
/// }
/// let v = Demo::flag_set().parse(["-m", "http"]).unwrap_or_default();
/// let d = Demo::from_values(&v);
/// assert_eq!((d.server_prot, d.mode.as_str()), (8090, "http"));
/// ```
#[macro_export]
macro_rules! typed_flags {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident = ($set:expr) { $($body:tt)* }
    ) => {
        $crate::typed_flags! { $(#[$meta])* $vis struct $name { $($body)* } }
        // A private struct need not use every generated function.
        #[allow(dead_code)]
        impl $name {
            /// The flags as `--help` lists them.
            $vis fn flag_set() -> $crate::flags::FlagSet {
                Self::declare($set)
            }
            /// The process arguments parsed into these flags; see
            /// [`FlagSet::parse_env_or_exit`]($crate::flags::FlagSet::parse_env_or_exit).
            $vis fn parse_env_or_exit() -> Self {
                Self::from_values(&Self::flag_set().parse_env_or_exit())
            }
            /// [`Self::parse_env_or_exit`], with the parse itself beside the
            /// typed flags (for code that still takes the parse).
            $vis fn parse_env_or_exit_with_values() -> ($crate::flags::Values, Self) {
                let values = Self::flag_set().parse_env_or_exit();
                let typed = Self::from_values(&values);
                (values, typed)
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                #[flag($flag:literal, $default:expr, $usage:expr $(, $modifier:ident $(($arg:expr))?)*)]
                $field:ident : $ty:ty,
            )*
            $(
                #[embed($group:ident($($garg:expr),*))]
                $gfield:ident : $gty:ty,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis struct $name {
            $(pub $field: $ty,)*
            $(pub $gfield: $gty,)*
        }
        // A private struct need not use every generated function.
        #[allow(dead_code)]
        impl $name {
            /// Adds these flags to `set`, in order.
            $vis fn declare(set: $crate::flags::FlagSet) -> $crate::flags::FlagSet {
                $(
                    let set = <$ty as $crate::flags::FlagValue>::declare(
                        set,
                        $flag,
                        ($default).into(),
                        $usage,
                    )$(.$modifier($($arg)?))*;
                )*
                $(let set = set.$group($($garg),*);)*
                set
            }
            /// These flags' values from a parse of a set they were declared in.
            $vis fn from_values(values: &$crate::flags::Values) -> Self {
                $name {
                    $($field: <$ty as $crate::flags::FlagValue>::read(values, $flag),)*
                    $($gfield: <$gty>::from_values(values),)*
                }
            }
        }
    };
}

crate::typed_flags! {
    /// klog's flags ([`FlagSet::with_klog`]).
    pub struct Klog {
        #[flag("v", 0, "number for the log level verbosity", short('v'))]
        v: i64,
        #[flag("vmodule", "", "comma-separated list of pattern=N settings for file-filtered logging (pattern: a source file name without .rs, * and ? allowed)")]
        vmodule: String,
        #[flag("log-dir", "", "If non-empty, write log files in this directory (no effect when -logtostderr=true)")]
        log_dir: String,
        #[flag("log-file", "", "If non-empty, use this log file (no effect when -logtostderr=true)")]
        log_file: String,
        #[flag("log-file-max-size", 1800, "Defines the maximum size a log file can grow to (no effect when -logtostderr=true). Unit is megabytes. If the value is 0, the maximum file size is unlimited.")]
        log_file_max_size: i64,
        #[flag("logtostderr", true, "log to standard error instead of files")]
        logtostderr: bool,
        #[flag("alsologtostderr", false, "log to standard error as well as files (no effect when -logtostderr=true)")]
        alsologtostderr: bool,
        #[flag("alsologtostderrthreshold", "INFO", "logs at or above this threshold go to stderr when -alsologtostderr=true (no effect when -logtostderr=true)")]
        alsologtostderrthreshold: String,
        #[flag("stderrthreshold", "ERROR", "logs at or above this threshold go to stderr when writing to files and stderr (no effect when -logtostderr=true or -alsologtostderr=true unless -legacy_stderr_threshold_behavior=false)")]
        stderrthreshold: String,
        #[flag("legacy-stderr-threshold-behavior", true, "If true, stderrthreshold is ignored when logtostderr=true (legacy behavior). If false, stderrthreshold is honored even when logtostderr=true")]
        legacy_stderr_threshold_behavior: bool,
        #[flag("add-dir-header", false, "If true, adds the file directory to the header of the log messages")]
        add_dir_header: bool,
        #[flag("skip-headers", false, "If true, avoid header prefixes in the log messages")]
        skip_headers: bool,
        #[flag("skip-log-headers", false, "If true, avoid headers when opening log files (no effect when -logtostderr=true)")]
        skip_log_headers: bool,
        #[flag("one-output", false, "If true, only write logs to their native severity level (vs also writing to each lower severity level; no effect when -logtostderr=true)")]
        one_output: bool,
        #[flag("log-backtrace-at", ":0", "accepted for compatibility (Rust has no goroutine stacks to print)")]
        log_backtrace_at: String,
        #[flag("logging-format", "text", "Sets the log format. Permitted formats: \"json\", \"text\" (component-base's spelling; ours).")]
        logging_format: String,
    }
}

crate::typed_flags! {
    /// KKP's logging flags (`pkg/log/zap.go`, [`FlagSet::with_kkp_logging`]):
    /// `-log-debug` and `-log-format` (JSON, the default, or Console).
    pub struct KkpLogging {
        #[flag("log-debug", false, "Enables more verbose logging")]
        log_debug: bool,
        #[flag("log-format", "JSON", "Log format, one of JSON, Console")]
        log_format: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads by name for these tests of the parser itself.
    impl Values {
        fn bool(&self, name: &'static str) -> bool {
            bool::read(self, name)
        }
        fn string(&self, name: &'static str) -> String {
            String::read(self, name)
        }
        fn int(&self, name: &'static str) -> i64 {
            i64::read(self, name)
        }
        fn strings(&self, name: &'static str) -> Vec<String> {
            Vec::<String>::read(self, name)
        }
        fn is_set(&self, name: &'static str) -> bool {
            Given::<String>::read(self, name).is_set()
        }
    }

    fn set() -> FlagSet {
        FlagSet::new("t", "test")
            .string("mode", "grpc", "m")
            .int("server-port", 8090, "p")
            .bool("delete-existing-uds-file", true, "d")
            .duration("keepalive-time", Duration::from_secs(3600), "k")
            .strings("alpn-proto", &[], "a")
            .bool("warn-on-channel-limit", true, "w")
            .deprecated("no-op")
            .with_klog(0)
    }

    #[test]
    fn accepts_upstream_spellings() {
        let v = set()
            .parse([
                "--mode=http-connect",
                "--server-port",
                "0",
                "--delete-existing-uds-file=false",
                "--keepalive-time=1h0m0s",
                "--alpn-proto=[]",
                "-v=5",
                "--logtostderr",
                "--warn-on-channel-limit=true",
            ])
            .unwrap_or_default();
        assert_eq!(v.string("mode"), "http-connect");
        assert_eq!(v.int("server-port"), 0);
        assert!(!v.bool("delete-existing-uds-file"));
        assert_eq!(v.duration("keepalive-time"), Duration::from_secs(3600));
        assert!(v.strings("alpn-proto").is_empty());
        assert_eq!(v.int("v"), 5);
        assert!(v.bool("logtostderr"));
        assert!(v.is_set("mode") && !v.is_set("log-file"));
    }

    #[test]
    fn accepts_go_flag_package_spellings() {
        let v = set()
            .parse(["-mode", "grpc", "-server-port=0x10", "-log_file=/tmp/x"])
            .unwrap_or_default();
        assert_eq!(v.int("server-port"), 16);
        assert_eq!(v.string("log-file"), "/tmp/x");
    }

    #[test]
    fn slices_split_and_append() {
        let v = set()
            .parse(["--alpn-proto=a,b", "--alpn-proto", "c"])
            .unwrap_or_default();
        assert_eq!(v.strings("alpn-proto"), ["a", "b", "c"]);
    }

    #[test]
    fn defaults_apply_when_unset() {
        let v = set().parse(Vec::<String>::new()).unwrap_or_default();
        assert_eq!(v.string("mode"), "grpc");
        assert_eq!(v.int("server-port"), 8090);
        assert!(v.bool("delete-existing-uds-file"));
    }

    #[test]
    fn errors_name_the_problem() {
        let s = set();
        assert_eq!(
            s.parse(["--nope=1"]).err(),
            Some(FlagError::Unknown("--nope=1".into()))
        );
        assert!(
            matches!(s.parse(["--server-port=abc"]), Err(FlagError::Invalid { flag, .. }) if flag == "server-port")
        );
        assert!(matches!(
            s.parse(["--keepalive-time=10"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            s.parse(["--delete-existing-uds-file=maybe"]),
            Err(FlagError::Invalid { .. })
        ));
        assert_eq!(
            s.parse(["--mode"]).err(),
            Some(FlagError::MissingValue("--mode".into()))
        );
        assert_eq!(
            s.parse(["stray"]).err(),
            Some(FlagError::Positional("stray".into()))
        );
        assert_eq!(s.parse(["-h"]).err(), Some(FlagError::Help));
    }

    #[test]
    fn usage_lists_visible_flags_only() {
        let u = set().usage();
        assert!(u.contains("--keepalive-time duration"));
        assert!(u.contains("(default 1h0m0s)"));
        assert!(!u.contains("warn-on-channel-limit"));
    }
    crate::typed_flags! {
        struct Typed = (FlagSet::new("t", "test").usage_exit(1)) {
            #[flag("mode", "grpc", "m", short('m'))]
            mode: String,
            #[flag("server-port", 8090, "p")]
            server_port: Given<i64>,
            #[flag("keepalive-time", Duration::from_secs(3600), "k")]
            keepalive_time: Duration,
            #[flag("alpn-proto", Vec::new(), "a")]
            alpn_proto: Vec<String>,
            #[flag("lease-label", "x", "", deprecated("no-op"))]
            lease_label: Given<String>,
            #[flag("lease-label-selector", "x", "s")]
            lease_label_selector: Given<String>,
            #[flag("kubeconfig", "", "k", hidden)]
            kubeconfig: Given<String>,
            #[embed(with_klog(3))]
            log: Klog,
        }
    }

    #[test]
    fn typed_declaration_is_the_builders() {
        let built = FlagSet::new("t", "test")
            .usage_exit(1)
            .string("mode", "grpc", "m")
            .short('m')
            .int("server-port", 8090, "p")
            .duration("keepalive-time", Duration::from_secs(3600), "k")
            .strings("alpn-proto", &[], "a")
            .string("lease-label", "x", "")
            .deprecated("no-op")
            .string("lease-label-selector", "x", "s")
            .string("kubeconfig", "", "k")
            .hidden()
            .with_klog(3);
        assert_eq!(Typed::flag_set().usage(), built.usage());
        assert!(built.usage().contains("(default 3)"));
        assert_eq!(Typed::flag_set().usage_exit, 1);
    }

    #[test]
    fn typed_fields_are_filled_from_the_parse() {
        let v = Typed::flag_set()
            .parse([
                "-m",
                "http-connect",
                "--alpn-proto=a,b",
                "--lease-label-selector=a=b",
                "--lease-label=c",
                "-v=5",
            ])
            .unwrap_or_default();
        let t = Typed::from_values(&v);
        assert_eq!(t.mode, "http-connect");
        assert_eq!(t.server_port.value, 8090);
        assert!(!t.server_port.is_set() && t.server_port.if_set().is_none());
        assert_eq!(t.keepalive_time, Duration::from_secs(3600));
        assert_eq!(t.alpn_proto, ["a", "b"]);
        assert!(t.lease_label.given_after(&t.lease_label_selector));
        assert!(!t.lease_label_selector.given_after(&t.lease_label));
        assert_eq!(t.log.v, 5);
        let v = Typed::flag_set()
            .parse(["--lease-label-selector=a=b"])
            .unwrap_or_default();
        let t = Typed::from_values(&v);
        assert!(t.lease_label_selector.given_after(&t.lease_label));
        assert_eq!(
            t.lease_label_selector.if_set().map(String::as_str),
            Some("a=b")
        );
    }

    #[test]
    fn given_checks_name_the_flag() {
        let v = Typed::flag_set()
            .parse(["--server-port=70000", "--kubeconfig=/nonexistent/k"])
            .unwrap_or_default();
        let t = Typed::from_values(&v);
        assert_eq!(
            t.server_port.port(),
            Err("--server-port: 70000 is not a valid port".into())
        );
        let e = t.kubeconfig.existing_file().err().unwrap_or_default();
        assert!(e.starts_with("--kubeconfig /nonexistent/k: "), "{e}");
        let v = Typed::flag_set()
            .parse(["--kubeconfig=/"])
            .unwrap_or_default();
        assert_eq!(
            Typed::from_values(&v).kubeconfig.existing_file(),
            Err("--kubeconfig / is a directory; it must name a file".into())
        );
        assert_eq!(
            Typed::from_values(&Values::default())
                .kubeconfig
                .existing_file(),
            Ok(None)
        );
    }
}
