//! The runtime every binary in this workspace runs on: listeners and the
//! accept loop, one drain signal shared by listeners and live tunnels,
//! signals, TLS configuration from PEM files and its hot reload, the
//! health/metrics/debug HTTP endpoints, the Envoy-named metrics registry,
//! outbound connections through an HTTP proxy, and the process set-up
//! (allocator, file-descriptor limit).
//!
//! It sits on `go-compat` (Go-worded errors, durations, client_golang
//! metrics for the TLS reload counters) and knows nothing of the data path
//! (`link`) or of any protocol the binaries speak.

pub mod accept_rate;
pub mod authority;
pub mod drain;
pub mod egress_proxy;
pub mod endpoints;
pub mod envoy_stats;
pub mod file_watch;
pub mod flood_penalty;
pub mod forward;
pub mod hangup;
pub mod keepalive;
#[cfg(feature = "kubernetes")]
pub mod lease;
pub mod limits;
pub mod listen;
pub mod metrics;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod prefixed;
pub mod process;
pub mod signals;
pub mod slow_lane;
pub mod tls;
