//! What makes our binaries look like the Go programs they replace, to the
//! people and tools that drive them: Go's flag syntax and `--help`, Go
//! durations and number formatting, klog/zap log lines, client_golang's
//! `/metrics` exposition with its `process_*` families, and Go's acceptance
//! of X.509 v1 certificates.
//!
//! Nothing else of ours sits below this crate; a newcomer reading the data
//! path can skip it: it only changes how things are spelt, never what moves.

pub mod duration;
pub mod errors;
pub mod exposition;
pub mod flags;
pub mod gofmt;
pub mod gometrics;
pub mod logging;
pub mod procstat;
pub mod x509v1;
