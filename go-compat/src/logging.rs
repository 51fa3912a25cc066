//! The one logging layer every binary uses, in the format and with the flags
//! of the program it replaces, so log pipelines and manifests keep working:
//!
//! - proxy-server and proxy-agent log as upstream's klog does: the text
//!   header `I1124 12:00:00.000000    1234 file.rs:12] "message" key="value"`
//!   by default, or component-base's JSON with `--logging-format=json`; `-v`
//!   (upstream's default 4), `--vmodule`, `--logtostderr`, `--alsologtostderr`,
//!   `--stderrthreshold`, `--log-file`, `--log-dir`, `--log-file-max-size`,
//!   `--one-output`, `--skip-headers`, `--add-dir-header`,
//!   `--skip-log-headers` with klog's meaning;
//! - nodeport-proxy, lb-updater and tunnel-agent log as KKP's zap logger
//!   (`pkg/log/zap.go`): JSON by default, `-log-format=Console`, `-log-debug`.
//!
//! Events come from `tracing`; their level maps to klog's severity and
//! verbosity in [`klog_v`]. `RUST_LOG`, when set, replaces the verbosity
//! flags with a `tracing` filter (a developer's switch; the format stays).
//!
//! Written here because no crate writes klog's or zap's line formats; the
//! formats are small and fixed, and the unit tests pin them byte for byte.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::flags::{KkpLogging, Klog};

/// How a line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// klog's text format (upstream's default).
    KlogText,
    /// component-base's JSON (`--logging-format=json`).
    KlogJson,
    /// KKP's zap JSON (`-log-format=JSON`, their default).
    ZapJson,
    /// KKP's zap console format (`-log-format=Console`).
    ZapConsole,
}

/// klog's severities, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Info = 0,
    Warning = 1,
    Error = 2,
    Fatal = 3,
}

impl Severity {
    fn of(level: &Level) -> Severity {
        match *level {
            Level::ERROR => Severity::Error,
            Level::WARN => Severity::Warning,
            _ => Severity::Info,
        }
    }

    fn char(self) -> char {
        match self {
            Severity::Info => 'I',
            Severity::Warning => 'W',
            Severity::Error => 'E',
            Severity::Fatal => 'F',
        }
    }

    fn name(self) -> &'static str {
        match self {
            Severity::Info => "INFO",
            Severity::Warning => "WARNING",
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
        }
    }

    /// klog's `--stderrthreshold` syntax: a name or its number.
    fn parse(flag: &str, s: &str) -> Result<Severity, String> {
        match s.to_ascii_uppercase().as_str() {
            "INFO" | "0" => Ok(Severity::Info),
            "WARNING" | "1" => Ok(Severity::Warning),
            "ERROR" | "2" => Ok(Severity::Error),
            "FATAL" | "3" => Ok(Severity::Fatal),
            _ => Err(format!(
                "--{flag} {s:?} is not a severity; use INFO, WARNING, ERROR or FATAL"
            )),
        }
    }
}

/// Crates of this workspace: their debug and trace events are ours to map
/// onto klog's verbosity; everything else (h2, hyper, rustls, kube) is noise
/// below it.
const OUR_CRATES: &[&str] = &[
    "proxy_server",
    "proxy_agent",
    "daemon",
    "go_compat",
    "link",
    "konnectivity_proto",
    "nodeport_proxy",
    "tunnel_agent",
    "lb_updater",
    "local_stack",
];

fn ours(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    OUR_CRATES.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The klog verbosity (`-v`) an event needs to be written: errors, warnings
/// and info always (V(0)); our debug events at V(3), where upstream logs each
/// dial and connection; our trace events at V(5), upstream's per-packet
/// level; other crates' debug at V(7) and trace at V(9).
pub fn klog_v(meta: &Metadata<'_>) -> u8 {
    match (*meta.level(), ours(meta)) {
        (Level::ERROR | Level::WARN | Level::INFO, _) => 0,
        (Level::DEBUG, true) => 3,
        (Level::TRACE, true) => 5,
        (Level::DEBUG, false) => 7,
        _ => 9,
    }
}

/// `--vmodule`: `pattern=N` entries; the first whose pattern matches an
/// event's file decides its verbosity instead of `-v`.
#[derive(Debug, Clone, Default)]
pub struct VModule(Vec<(String, u8)>);

impl VModule {
    pub fn parse(spec: &str) -> Result<VModule, String> {
        let mut out = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || {
                format!("--vmodule {spec:?}: {entry:?} is not pattern=N (e.g. session=5,core*=4)")
            };
            let (pattern, level) = entry.split_once('=').ok_or_else(bad)?;
            let level: u8 = level.trim().parse().map_err(|_| bad())?;
            if pattern.is_empty() {
                return Err(bad());
            }
            out.push((pattern.to_string(), level));
        }
        Ok(VModule(out))
    }

    /// The level for `file` (a source path), if a pattern matches it: as in
    /// klog, against the base name without its extension, or against the
    /// whole path without extension when the pattern has a `/`.
    pub fn level_for(&self, file: &str) -> Option<u8> {
        let stem = file.strip_suffix(".rs").unwrap_or(file);
        let base = stem.rsplit('/').next().unwrap_or(stem);
        self.0.iter().find_map(|(pattern, level)| {
            let subject = if pattern.contains('/') { stem } else { base };
            glob(pattern.as_bytes(), subject.as_bytes()).then_some(*level)
        })
    }
}

/// `*` and `?` glob matching (Go's `filepath.Match` without classes).
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && glob(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && glob(rest, &name[1..]),
    }
}

/// Which events are written.
#[derive(Debug, Clone)]
pub enum Verbosity {
    /// klog: `-v` and `--vmodule`.
    Klog { v: u8, vmodule: VModule },
    /// KKP: info and above, plus our debug events with `-log-debug`.
    Zap { debug: bool },
}

impl Verbosity {
    pub fn enabled(&self, meta: &Metadata<'_>) -> bool {
        match self {
            Verbosity::Klog { v, vmodule } => {
                let need = klog_v(meta);
                if need == 0 {
                    return true;
                }
                let have = meta.file().and_then(|f| vmodule.level_for(f)).unwrap_or(*v);
                need <= have
            }
            Verbosity::Zap { debug } => {
                *meta.level() <= Level::INFO
                    || (*debug && *meta.level() == Level::DEBUG && ours(meta))
            }
        }
    }
}

/// The verbosity filter: decided once per call site, so a disabled event
/// costs what a disabled `tracing` event always costs.
struct VerbosityFilter(Verbosity);

/// Our spans carry the fields of the events inside them (a connection's
/// peer, an agent's ID): they are kept whatever the verbosity. Other
/// crates' spans follow the verbosity as their events do: h2 opens several
/// per frame (some formatting the frame), and keeping them all cost 10–15 %
/// of the server's and agent's CPU per dial (BENCHMARKS.md, P4).
fn keeps(verbosity: &Verbosity, meta: &Metadata<'_>) -> bool {
    (meta.is_span() && ours(meta)) || verbosity.enabled(meta)
}

impl<S> Filter<S> for VerbosityFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        keeps(&self.0, meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if keeps(&self.0, meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

/// Where lines go, as klog decides it.
pub struct Outputs {
    /// Lines at or above this severity go to standard error (`None`: none).
    stderr: Option<Severity>,
    files: Files,
}

// One value per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Files {
    None,
    /// `--log-file`: every line, truncated and restarted when full.
    One(Mutex<LogFile>),
    /// `--log-dir` (or the temp dir): one file per severity, each with the
    /// lines of its severity and above (only its own with `--one-output`).
    PerSeverity {
        files: [Mutex<Option<LogFile>>; 4],
        dir: PathBuf,
        program: String,
        one_output: bool,
        headers: bool,
    },
}

/// One open log file, restarted when the next line would pass `max_bytes`.
pub struct LogFile {
    file: File,
    path: PathBuf,
    written: u64,
    max_bytes: u64,
    headers: bool,
}

impl LogFile {
    /// Opens `path` for appending, as klog does at start.
    pub fn open(path: &Path, max_bytes: u64, headers: bool) -> std::io::Result<LogFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut f = LogFile {
            file,
            path: path.to_path_buf(),
            written,
            max_bytes,
            headers,
        };
        if written == 0 {
            f.header();
        }
        Ok(f)
    }

    fn header(&mut self) {
        if !self.headers {
            return;
        }
        let now = jiff::Zoned::now();
        let text = format!(
            "Log file created at: {}\nRunning on machine: {}\nBinary: Built with rustc for {}/{}\nLog line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n",
            now.strftime("%Y/%m/%d %H:%M:%S"),
            hostname(),
            std::env::consts::OS,
            go_arch(),
        );
        if self.file.write_all(text.as_bytes()).is_ok() {
            self.written += text.len() as u64;
        }
    }

    /// Writes one line; when it would pass the size limit the file is
    /// truncated first (klog's rotation of `--log-file`).
    pub fn write_line(&mut self, line: &[u8]) {
        if self.written + line.len() as u64 >= self.max_bytes {
            match File::create(&self.path) {
                Ok(f) => {
                    self.file = f;
                    self.written = 0;
                    self.header();
                }
                Err(e) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "log: cannot restart {}: {}",
                        self.path.display(),
                        crate::errors::io_reason(&e)
                    );
                }
            }
        }
        if self.file.write_all(line).is_ok() {
            self.written += line.len() as u64;
        }
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknownhost".into())
}

/// The user name for klog's file names, from `/etc/passwd`.
fn user_name() -> String {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_string))
        })
        .unwrap_or_default();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id = f.nth(1)?;
                (id == uid).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| "unknownuser".into())
}

impl Outputs {
    /// Everything to standard error.
    pub fn stderr() -> Outputs {
        Outputs {
            stderr: Some(Severity::Info),
            files: Files::None,
        }
    }

    fn write(&self, severity: Severity, line: &[u8]) {
        if self.stderr.is_some_and(|t| severity >= t) {
            let _ = std::io::stderr().lock().write_all(line);
        }
        match &self.files {
            Files::None => {}
            Files::One(f) => f.lock().write_line(line),
            Files::PerSeverity {
                files,
                dir,
                program,
                one_output,
                headers,
            } => {
                for (i, slot) in files.iter().enumerate() {
                    let s = i as u8;
                    let wanted = if *one_output {
                        s == severity as u8
                    } else {
                        s <= severity as u8
                    };
                    if !wanted {
                        continue;
                    }
                    let mut slot = slot.lock();
                    if slot.is_none() {
                        let tag = [
                            Severity::Info,
                            Severity::Warning,
                            Severity::Error,
                            Severity::Fatal,
                        ][i];
                        *slot = open_in_dir(dir, program, tag, *headers);
                    }
                    if let Some(f) = slot.as_mut() {
                        f.write_line(line);
                    }
                }
            }
        }
    }
}

/// klog's log file in a directory: `program.host.user.log.SEVERITY.date-time.pid`
/// with a `program.SEVERITY` symlink to it; 1800 MB each (klog's fixed size
/// when no `--log-file` is given).
fn open_in_dir(dir: &Path, program: &str, severity: Severity, headers: bool) -> Option<LogFile> {
    let now = jiff::Zoned::now();
    let host = hostname();
    let host = host.split('.').next().unwrap_or("unknownhost").to_string();
    let name = format!(
        "{program}.{host}.{}.log.{}.{}.{}",
        user_name(),
        severity.name(),
        now.strftime("%Y%m%d-%H%M%S"),
        std::process::id()
    );
    let path = dir.join(&name);
    match LogFile::open(&path, 1800 << 20, headers) {
        Ok(f) => {
            let link = dir.join(format!("{program}.{}", severity.name()));
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(&name, &link);
            Some(f)
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "log: cannot create log file {}: {}",
                path.display(),
                crate::errors::io_reason(&e)
            );
            None
        }
    }
}

/// Everything the layer needs to write a line.
pub struct Settings {
    pub format: Format,
    pub verbosity: Verbosity,
    pub outputs: Outputs,
    pub skip_headers: bool,
    pub add_dir_header: bool,
}

impl Settings {
    /// From klog's flags.
    pub fn klog(flags: &Klog) -> Result<Settings, String> {
        let format = match flags.logging_format.as_str() {
            "" | "text" => Format::KlogText,
            "json" => Format::KlogJson,
            other => {
                return Err(format!(
                    "--logging-format {other:?} is not a format; use text or json"
                ));
            }
        };
        let v = u8::try_from(flags.v.clamp(0, 255)).unwrap_or(0);
        let vmodule = VModule::parse(&flags.vmodule)?;
        Ok(Settings {
            format,
            verbosity: Verbosity::Klog { v, vmodule },
            outputs: klog_outputs(flags)?,
            skip_headers: flags.skip_headers,
            add_dir_header: flags.add_dir_header,
        })
    }

    /// From KKP's logging flags.
    pub fn kkp(flags: &KkpLogging) -> Result<Settings, String> {
        let format = match flags.log_format.to_ascii_lowercase().as_str() {
            "json" => Format::ZapJson,
            "console" => Format::ZapConsole,
            other => {
                return Err(format!(
                    "invalid log-format specified {other:?}; available: JSON, Console"
                ));
            }
        };
        Ok(Settings {
            format,
            verbosity: Verbosity::Zap {
                debug: flags.log_debug,
            },
            outputs: Outputs::stderr(),
            skip_headers: false,
            add_dir_header: false,
        })
    }
}

/// klog's choice of outputs from its flags.
fn klog_outputs(flags: &Klog) -> Result<Outputs, String> {
    let stderr_threshold = Severity::parse("stderrthreshold", &flags.stderrthreshold)?;
    let also_threshold =
        Severity::parse("alsologtostderrthreshold", &flags.alsologtostderrthreshold)?;
    if flags.logtostderr {
        // Files are ignored; stderr gets everything unless the legacy
        // behaviour is turned off, then only what passes the threshold.
        let threshold = if flags.legacy_stderr_threshold_behavior {
            Severity::Info
        } else {
            stderr_threshold
        };
        return Ok(Outputs {
            stderr: Some(threshold),
            files: Files::None,
        });
    }
    let stderr = if flags.alsologtostderr {
        also_threshold
    } else {
        stderr_threshold
    };
    let max_mb = flags.log_file_max_size;
    if max_mb < 0 {
        return Err(format!(
            "--log-file-max-size must not be negative, got {max_mb}"
        ));
    }
    let max_bytes = match max_mb as u64 {
        0 => u64::MAX,
        mb => mb.saturating_mul(1 << 20),
    };
    let headers = !flags.skip_log_headers;
    let log_file = &flags.log_file;
    let files = if !log_file.is_empty() {
        let f = LogFile::open(Path::new(log_file), max_bytes, headers).map_err(|e| {
            format!(
                "--log-file {log_file}: cannot open it: {}",
                crate::errors::io_reason(&e)
            )
        })?;
        Files::One(Mutex::new(f))
    } else {
        let dir = match flags.log_dir.as_str() {
            "" => std::env::temp_dir(),
            d => PathBuf::from(d),
        };
        if !dir.is_dir() {
            return Err(format!("--log-dir {}: no such directory", dir.display()));
        }
        Files::PerSeverity {
            files: Default::default(),
            dir,
            program: program_name(),
            one_output: flags.one_output,
            headers,
        }
    };
    Ok(Outputs {
        stderr: Some(stderr),
        files,
    })
}

fn program_name() -> String {
    std::env::args()
        .next()
        .as_deref()
        .and_then(|a| a.rsplit('/').next().map(str::to_string))
        .unwrap_or_else(|| "proxy".into())
}

/// The logging flags of a binary: [`Klog`] ([`crate::flags::FlagSet::with_klog`])
/// or [`KkpLogging`] ([`crate::flags::FlagSet::with_kkp_logging`]).
pub trait LogFlags {
    fn settings(&self) -> Result<Settings, String>;
}

impl LogFlags for Klog {
    fn settings(&self) -> Result<Settings, String> {
        Settings::klog(self)
    }
}

impl LogFlags for KkpLogging {
    fn settings(&self) -> Result<Settings, String> {
        Settings::kkp(self)
    }
}

/// Installs the global subscriber from the flags. Call once, first thing
/// after parsing them.
pub fn init(flags: &impl LogFlags) -> Result<(), String> {
    install(flags.settings()?)
}

/// Installs the global subscriber.
pub fn install(settings: Settings) -> Result<(), String> {
    let layer = LineLayer {
        format: settings.format,
        outputs: settings.outputs,
        skip_headers: settings.skip_headers,
        add_dir_header: settings.add_dir_header,
        pid: std::process::id(),
    };
    let registry = tracing_subscriber::registry();
    match std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok())
    {
        Some(env) => registry.with(layer.with_filter(env)).try_init(),
        None => registry
            .with(layer.with_filter(VerbosityFilter(settings.verbosity)))
            .try_init(),
    }
    .map_err(|e| e.to_string())
}

/// A field value as the formats distinguish it.
#[derive(Debug, Clone)]
enum Val {
    /// Quoted in klog's text, a JSON string.
    Str(String),
    /// Numbers and booleans: bare in both.
    Bare(String),
}

/// Fields of an event or span, in order; the event's message apart.
#[derive(Debug, Default, Clone)]
struct Fields {
    message: Option<String>,
    kv: Vec<(&'static str, Val)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Val::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Val::Bare(value.to_string()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Val::Bare(value.to_string()));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Val::Bare(value.to_string()));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.put(field, Val::Bare(value.to_string()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = if value.is_finite() {
            crate::gofmt::go_float(value)
        } else {
            // JSON has no NaN or infinity; klog prints them bare, zap as strings.
            return self.put(field, Val::Str(crate::gofmt::go_float(value)));
        };
        self.put(field, Val::Bare(v));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Val::Bare(value.to_string()));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Val::Str(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.put(field, Val::Str(s));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, v: Val) {
        if field.name() == "message" {
            self.message = Some(match v {
                Val::Str(s) | Val::Bare(s) => s,
            });
        } else {
            // `log` crate records arrive with `log.*` fields; they are the
            // header's business, not the line's.
            if field.name().starts_with("log.") {
                return;
            }
            self.kv.push((field.name(), v));
        }
    }
}

/// What an event needs from the clock, taken once per line.
struct Stamp {
    zoned: jiff::Zoned,
}

impl Stamp {
    fn now() -> Stamp {
        Stamp {
            zoned: jiff::Zoned::now(),
        }
    }

    /// klog's `mmdd hh:mm:ss.uuuuuu`.
    fn klog(&self) -> String {
        let z = &self.zoned;
        format!(
            "{:02}{:02} {:02}:{:02}:{:02}.{:06}",
            z.month(),
            z.day(),
            z.hour(),
            z.minute(),
            z.second(),
            z.subsec_nanosecond() / 1000
        )
    }

    /// component-base's `ts`: milliseconds since the epoch, as a float.
    fn epoch_millis(&self) -> String {
        let nanos = self.zoned.timestamp().as_nanosecond();
        let ms = nanos as f64 / 1e6;
        format!("{ms}")
    }

    /// zap's ISO8601 encoder: `2006-01-02T15:04:05.000Z0700`.
    fn iso8601(&self) -> String {
        let z = &self.zoned;
        let offset = z.offset().seconds();
        let zone = if offset == 0 {
            "Z".to_string()
        } else {
            let a = offset.unsigned_abs();
            format!(
                "{}{:02}{:02}",
                if offset < 0 { '-' } else { '+' },
                a / 3600,
                (a % 3600) / 60
            )
        };
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}{zone}",
            z.year(),
            z.month(),
            z.day(),
            z.hour(),
            z.minute(),
            z.second(),
            z.subsec_nanosecond() / 1_000_000
        )
    }
}

struct LineLayer {
    format: Format,
    outputs: Outputs,
    skip_headers: bool,
    add_dir_header: bool,
    pid: u32,
}

impl<S> Layer<S> for LineLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        // A connection's span lives as long as the connection: room for its
        // fields, not the 4 a first push makes.
        let mut fields = Fields {
            message: None,
            kv: Vec::with_capacity(attrs.metadata().fields().len()),
        };
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(fields) = ext.get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        // Span fields first (outermost first), as klog prints a contextual
        // logger's values before the call's.
        let mut context: Vec<(&'static str, Val)> = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<Fields>() {
                    context.extend(f.kv.iter().cloned());
                }
            }
        }
        let meta = event.metadata();
        let severity = Severity::of(meta.level());
        let line = Line {
            meta,
            severity,
            message: fields.message.as_deref().unwrap_or(""),
            context: &context,
            fields: &fields.kv,
        };
        let text = match self.format {
            Format::KlogText => line.klog_text(self.pid, self.skip_headers, self.add_dir_header),
            Format::KlogJson => line.klog_json(),
            Format::ZapJson => line.zap_json(),
            Format::ZapConsole => line.zap_console(),
        };
        self.outputs.write(severity, text.as_bytes());
    }
}

/// One event, ready to be written in any format.
pub struct Line<'a> {
    meta: &'a Metadata<'a>,
    severity: Severity,
    message: &'a str,
    context: &'a [(&'static str, Val)],
    fields: &'a [(&'static str, Val)],
}

impl Line<'_> {
    /// The source file as klog (`file.rs`) or, with `dir`, as zap's short
    /// caller and klog's `--add-dir-header` name it (`dir/file.rs`). Rust's
    /// `src` directories are skipped, so `agent/src/session.rs` is
    /// `agent/session.rs`, as Go's package directory would show it.
    fn file(&self, dir: bool) -> String {
        let path = self.meta.file().unwrap_or("???");
        let mut parts = path.rsplit('/').filter(|p| *p != "src");
        let base = parts.next().unwrap_or(path);
        match (dir, parts.next()) {
            (true, Some(d)) => format!("{d}/{base}"),
            _ => base.to_string(),
        }
    }

    fn kvs(&self) -> impl Iterator<Item = &(&'static str, Val)> {
        self.context.iter().chain(self.fields.iter())
    }

    /// `I1124 12:00:00.000000    1234 file.rs:12] "message" key="value"`.
    fn klog_text(&self, pid: u32, skip_headers: bool, add_dir: bool) -> String {
        let mut out = String::with_capacity(128);
        if !skip_headers {
            let _ = write!(
                out,
                "{}{} {:>7} {}:{}] ",
                self.severity.char(),
                Stamp::now().klog(),
                pid,
                self.file(add_dir),
                self.meta.line().unwrap_or(0)
            );
        }
        out.push_str(&crate::gofmt::go_quote(self.message));
        for (k, v) in self.kvs() {
            out.push(' ');
            out.push_str(k);
            match v {
                Val::Bare(s) => {
                    out.push('=');
                    out.push_str(s);
                }
                Val::Str(s) => klog_string(&mut out, s),
            }
        }
        out.push('\n');
        out
    }

    /// component-base's JSON: `{"ts":…,"caller":"dir/file.rs:12","msg":"…","v":0,…}`;
    /// errors carry no `v`.
    fn klog_json(&self) -> String {
        let mut out = String::with_capacity(160);
        let _ = write!(
            out,
            "{{\"ts\":{},\"caller\":{},\"msg\":{}",
            Stamp::now().epoch_millis(),
            json_str(&format!(
                "{}:{}",
                self.file(true),
                self.meta.line().unwrap_or(0)
            )),
            json_str(self.message)
        );
        for (k, v) in self.context {
            json_kv(&mut out, k, v);
        }
        if self.severity < Severity::Error {
            let _ = write!(out, ",\"v\":{}", klog_v(self.meta));
        }
        for (k, v) in self.fields {
            json_kv(&mut out, k, v);
        }
        out.push_str("}\n");
        out
    }

    fn zap_level(&self) -> &'static str {
        match *self.meta.level() {
            Level::ERROR => "error",
            Level::WARN => "warn",
            Level::INFO => "info",
            _ => "debug",
        }
    }

    /// KKP's zap JSON: `{"level":"info","time":"…","caller":"dir/file.rs:12","msg":"…",…}`.
    fn zap_json(&self) -> String {
        let mut out = String::with_capacity(160);
        let _ = write!(
            out,
            "{{\"level\":\"{}\",\"time\":\"{}\",\"caller\":{},\"msg\":{}",
            self.zap_level(),
            Stamp::now().iso8601(),
            json_str(&format!(
                "{}:{}",
                self.file(true),
                self.meta.line().unwrap_or(0)
            )),
            json_str(self.message)
        );
        for (k, v) in self.kvs() {
            json_kv(&mut out, k, v);
        }
        out.push_str("}\n");
        out
    }

    /// KKP's zap console format: tab-separated time, level, caller, message,
    /// then the fields as spaced JSON.
    fn zap_console(&self) -> String {
        let mut out = String::with_capacity(160);
        let _ = write!(
            out,
            "{}\t{}\t{}:{}\t{}",
            Stamp::now().iso8601(),
            self.zap_level(),
            self.file(true),
            self.meta.line().unwrap_or(0),
            self.message
        );
        let mut first = true;
        for (k, v) in self.kvs() {
            out.push_str(if first { "\t{" } else { ", " });
            first = false;
            out.push_str(&json_str(k));
            out.push_str(": ");
            match v {
                Val::Bare(s) => out.push_str(s),
                Val::Str(s) => out.push_str(&json_str(s)),
            }
        }
        if !first {
            out.push('}');
        }
        out.push('\n');
        out
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn json_kv(out: &mut String, k: &str, v: &Val) {
    out.push(',');
    out.push_str(&json_str(k));
    out.push(':');
    match v {
        Val::Bare(s) => out.push_str(s),
        Val::Str(s) => out.push_str(&json_str(s)),
    }
}

/// klog's string value: `="quoted"`, or for text with line breaks the
/// multi-line form `=<` / tab-indented lines / ` >`.
fn klog_string(out: &mut String, s: &str) {
    if !s.contains('\n') {
        out.push('=');
        out.push_str(&crate::gofmt::go_quote(s));
        return;
    }
    out.push_str("=<\n");
    let mut rest = s;
    while let Some(i) = rest.find('\n') {
        out.push('\t');
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    if rest.is_empty() {
        out.push_str(" >");
    } else {
        out.push('\t');
        out.push_str(rest);
        out.push_str("\n >");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::callsite::{Callsite, Identifier};
    use tracing::metadata::Kind;

    struct Site;
    impl Callsite for Site {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            &META
        }
    }
    static SITE: Site = Site;
    static META: Metadata<'static> = tracing::metadata!(
        name: "event",
        target: "proxy_agent::session",
        level: Level::INFO,
        fields: &[],
        callsite: &SITE,
        kind: Kind::EVENT
    );

    fn meta(level: Level, target: &'static str, file: &'static str) -> Metadata<'static> {
        Metadata::new(
            "event",
            target,
            level,
            Some(file),
            Some(12),
            None,
            tracing::field::FieldSet::new(&[], Identifier(&SITE)),
            Kind::EVENT,
        )
    }

    fn span_meta(level: Level, target: &'static str) -> Metadata<'static> {
        Metadata::new(
            "span",
            target,
            level,
            Some("src/x.rs"),
            Some(1),
            None,
            tracing::field::FieldSet::new(&[], Identifier(&SITE)),
            Kind::SPAN,
        )
    }

    #[test]
    fn our_spans_are_kept_at_any_verbosity_others_follow_it() {
        let quiet = Verbosity::Klog {
            v: 0,
            vmodule: VModule::default(),
        };
        let loud = Verbosity::Klog {
            v: 9,
            vmodule: VModule::default(),
        };
        let ours = span_meta(Level::DEBUG, "proxy_server::frontend::grpc");
        let h2 = span_meta(Level::TRACE, "h2::codec::framed_write");
        let hyper_info = span_meta(Level::INFO, "hyper::proto");
        assert!(keeps(&quiet, &ours));
        assert!(!keeps(&quiet, &h2));
        assert!(keeps(&loud, &h2));
        assert!(keeps(&quiet, &hyper_info));
        let zap = Verbosity::Zap { debug: false };
        assert!(keeps(
            &zap,
            &span_meta(Level::TRACE, "nodeport_proxy::listeners::tunnel")
        ));
        assert!(!keeps(&zap, &span_meta(Level::DEBUG, "h2::proto")));
    }

    fn line<'a>(m: &'a Metadata<'a>, fields: &'a [(&'static str, Val)]) -> Line<'a> {
        Line {
            meta: m,
            severity: Severity::of(m.level()),
            message: "connection \"closed\"",
            context: &[],
            fields,
        }
    }

    #[test]
    fn klog_text_header_and_values() {
        let m = meta(Level::WARN, "proxy_agent::session", "agent/src/session.rs");
        let fields = [
            ("addr", Val::Str("127.0.0.1:80".into())),
            ("n", Val::Bare("5".into())),
            ("body", Val::Str("a\nb".into())),
        ];
        let text = line(&m, &fields).klog_text(1234, false, false);
        // W1124 12:00:00.000000    1234 session.rs:12] "…" …
        let (head, rest) = text.split_at(30);
        let b = head.as_bytes();
        assert_eq!(b[0], b'W', "{text}");
        assert!(b[1..5].iter().all(u8::is_ascii_digit), "{text}");
        assert_eq!(&head[5..6], " ");
        assert_eq!((&head[8..9], &head[11..12], &head[14..15]), (":", ":", "."));
        assert_eq!(&head[21..], "    1234 ", "{text}");
        assert_eq!(
            rest,
            "session.rs:12] \"connection \\\"closed\\\"\" addr=\"127.0.0.1:80\" n=5 body=<\n\ta\n\tb\n >\n"
        );
        let short = line(&m, &[]).klog_text(7, true, true);
        assert_eq!(short, "\"connection \\\"closed\\\"\"\n");
        let with_dir = line(&m, &[]).klog_text(7, false, true);
        assert!(with_dir.contains(" agent/session.rs:12] "), "{with_dir}");
    }

    #[test]
    fn json_formats() {
        let m = meta(Level::DEBUG, "proxy_agent::session", "agent/src/session.rs");
        let fields = [
            ("id", Val::Bare("3".into())),
            ("peer", Val::Str("x\"y".into())),
        ];
        let klog: serde_json::Value =
            serde_json::from_str(&line(&m, &fields).klog_json()).unwrap_or_default();
        assert_eq!(klog["caller"], "agent/session.rs:12");
        assert_eq!(klog["msg"], "connection \"closed\"");
        assert_eq!(klog["v"], 3);
        assert_eq!(klog["id"], 3);
        assert_eq!(klog["peer"], "x\"y");
        assert!(klog["ts"].as_f64().is_some_and(|t| t > 1.6e12), "{klog}");
        let zap = line(&m, &fields).zap_json();
        assert!(zap.starts_with("{\"level\":\"debug\",\"time\":\""), "{zap}");
        let zap: serde_json::Value = serde_json::from_str(&zap).unwrap_or_default();
        assert_eq!(zap["caller"], "agent/session.rs:12");
        assert_eq!(zap["id"], 3);
        let time = zap["time"].as_str().unwrap_or_default();
        // 2024-11-24T12:00:00.000Z or …+0100
        assert_eq!(time.len().max(24), time.len(), "{time}");
        assert_eq!(&time[10..11], "T");
        assert_eq!(&time[19..20], ".");
        let console = line(&m, &fields).zap_console();
        let cols: Vec<&str> = console.trim_end().split('\t').collect();
        assert_eq!(cols.len(), 5, "{console}");
        assert_eq!(
            cols[1..4],
            ["debug", "agent/session.rs:12", "connection \"closed\""]
        );
        assert_eq!(cols[4], "{\"id\": 3, \"peer\": \"x\\\"y\"}");
        let e = meta(Level::ERROR, "proxy_agent::session", "agent/src/session.rs");
        let err: serde_json::Value =
            serde_json::from_str(&line(&e, &[]).klog_json()).unwrap_or_default();
        assert!(err.get("v").is_none(), "{err}");
    }

    #[test]
    fn verbosity_and_vmodule() {
        let debug_ours = meta(Level::DEBUG, "proxy_server::core", "server/src/core.rs");
        let trace_ours = meta(Level::TRACE, "proxy_server::core", "server/src/core.rs");
        let debug_h2 = meta(Level::DEBUG, "h2::proto", "/cargo/h2/src/proto.rs");
        let info_h2 = meta(Level::INFO, "h2::proto", "/cargo/h2/src/proto.rs");
        let v = |v: u8, vmodule: &str| Verbosity::Klog {
            v,
            vmodule: VModule::parse(vmodule).unwrap_or_default(),
        };
        assert!(v(0, "").enabled(&info_h2));
        assert!(!v(2, "").enabled(&debug_ours));
        assert!(v(4, "").enabled(&debug_ours));
        assert!(!v(4, "").enabled(&trace_ours));
        assert!(!v(4, "").enabled(&debug_h2));
        assert!(v(5, "").enabled(&trace_ours));
        assert!(v(0, "co*=5").enabled(&trace_ours));
        assert!(!v(0, "session=5").enabled(&debug_ours));
        assert!(v(9, "core=2,co*=9").enabled(&debug_h2));
        assert!(
            !v(9, "core=2,co*=9").enabled(&debug_ours),
            "first match wins"
        );
        assert!(v(0, "server/src/core=3").enabled(&debug_ours));
        assert!(VModule::parse("core").is_err() && VModule::parse("core=x").is_err());
        let zap = Verbosity::Zap { debug: true };
        assert!(zap.enabled(&debug_ours) && !zap.enabled(&debug_h2) && !zap.enabled(&trace_ours));
        assert!(!Verbosity::Zap { debug: false }.enabled(&debug_ours));
    }

    #[test]
    fn log_file_restarts_when_full() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("x.log");
        let mut f = LogFile::open(&path, 100, true).unwrap_or_else(|e| panic!("{e}"));
        let header = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(header.starts_with("Log file created at: "), "{header}");
        let mut g = LogFile::open(&path, 1000, false).unwrap_or_else(|e| panic!("{e}"));
        g.write_line(b"appended\n");
        assert!(
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .ends_with("appended\n"),
            "opened again at start: appended, not truncated"
        );
        drop(g);
        let mut f2 = LogFile::open(&path, 100, false).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..20 {
            f2.write_line(format!("line {i:02}\n").as_bytes());
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(text.len() < 100, "{text}");
        assert!(text.ends_with("line 19\n"), "{text}");
        f.write_line(b"");
    }

    #[test]
    fn static_metadata_is_ours() {
        assert!(ours(&META));
        assert_eq!(klog_v(&META), 0);
    }
}
