//! What every binary in this workspace needs besides its own protocol: Go-style
//! command-line flags (so upstream manifests keep working), TLS configuration
//! from PEM files, the health/metrics HTTP endpoints, logging mapped from klog
//! flags, listeners, and one drain signal shared by listeners and live tunnels.

pub mod authority;
pub mod budget;
pub mod cert_validity;
pub mod chunks;
pub mod debug_connections;
pub mod drain;
pub mod duplex;
pub mod duration;
pub mod egress_proxy;
pub mod endpoints;
pub mod errors;
pub mod file_watch;
pub mod flags;
pub mod forward;
pub mod gofmt;
pub mod gometrics;
pub mod h2flood;
pub mod h2grpc;
pub mod h2io;
pub mod h2window;
pub mod hangup;
pub mod keepalive;
#[cfg(feature = "kubernetes")]
pub mod lease;
pub mod limits;
pub mod listen;
pub mod logging;
pub mod metrics;
#[cfg(feature = "pprof")]
pub mod pprof;
pub mod prefixed;
pub mod process;
pub mod procstat;
pub mod relay;
pub mod signals;
pub mod tls;
mod tls_metrics;
pub mod tls_reload;
pub mod x509v1;
