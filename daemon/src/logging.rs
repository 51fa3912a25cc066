//! Logging set up from the klog flags upstream manifests pass, mapped onto
//! `tracing`: `-v` picks the level, `--log-file` (with `--logtostderr=false` or
//! `--alsologtostderr`) picks where lines go. `RUST_LOG` overrides the level.

use std::fs::OpenOptions;
use std::sync::Arc;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

use crate::flags::Values;

/// klog verbosity to a `tracing` level: 0–2 info, 3–4 debug, 5+ trace.
pub fn level_for_verbosity(v: i64) -> &'static str {
    match v {
        i64::MIN..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// Installs the global subscriber. Safe to call once per process.
pub fn init(values: &Values) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{},h2=info,hyper=info,tower=info,rustls=info",
            level_for_verbosity(values.int("v"))
        ))
    });
    let log_file = values.string("log-file");
    let dir = values.string("log-dir");
    let path = if !log_file.is_empty() {
        Some(std::path::PathBuf::from(log_file))
    } else if !dir.is_empty() {
        Some(std::path::Path::new(&dir).join(format!(
                "{}.log",
                std::env::args()
                    .next()
                    .as_deref()
                    .and_then(|a| a.rsplit('/').next().map(str::to_string))
                    .unwrap_or_else(|| "proxy".into())
            )))
    } else {
        None
    };
    let to_stderr = values.bool("logtostderr") || values.bool("alsologtostderr") || path.is_none();
    let writer = match (path, to_stderr) {
        (Some(p), also_stderr) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .map_err(|e| format!("opening log file {}: {e}", p.display()))?;
            let file = Arc::new(file);
            if also_stderr && !values.bool("logtostderr") {
                BoxMakeWriter::new(file.and(std::io::stderr))
            } else if values.bool("logtostderr") {
                // klog: logtostderr wins over files.
                BoxMakeWriter::new(std::io::stderr)
            } else {
                BoxMakeWriter::new(file)
            }
        }
        (None, _) => BoxMakeWriter::new(std::io::stderr),
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal() && path_is_none_or_stderr(values))
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(!values.bool("skip-headers"))
        .try_init()
        .map_err(|e| e.to_string())
}

/// Colours only when the lines go to a terminal and not to a file.
fn path_is_none_or_stderr(values: &Values) -> bool {
    values.string("log-file").is_empty() && values.string("log-dir").is_empty()
}
