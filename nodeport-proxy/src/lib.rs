//! KKP's nodeport-proxy as one process: the routing rules of envoy-manager
//! and the data plane Envoy ran. Services and EndpointSlices (from a file now,
//! from the API server later) become one routing table, swapped atomically;
//! NodePort, SNI (6443) and CONNECT tunneling (8088) listeners route by it;
//! Envoy-compatible stats and health are served on 8002.
//!
//! The stages, each a folder; a connection goes down them, the table
//! comes from the top:
//!
//! ```text
//! sources/    file, inline or API-server inventory (Services, EndpointSlices)
//!    |
//! routing/    inventory -> plan (index) -> routing table (table, store)
//!    |
//! listeners/  NodePort, SNI, CONNECT (HTTP/1.1, HTTP/2); the process (proxy)
//!    |
//! relay/      one Session per routed connection: admission, upstream
//!             connect, relay, access-log record
//! ```
//!
//! Beside them: health/ (/healthz, readiness), stats/ (the stats port, the
//! Envoy-named metrics, per-cluster stats), flags (cli), config and limits.

pub mod cli;
pub mod config;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod health;
pub mod limits;
pub mod listeners;
pub mod relay;
pub mod routing;
pub mod sources;
pub mod stats;

pub use config::{ConnectionSettings, ProxyConfig, TableSource};
pub use listeners::proxy::{BoundAddrs, Listeners, NodePortProxy, ProxyError, run};
pub use routing::model::Inventory;
pub use routing::store::TableStatus;

#[cfg(test)]
mod corpus_tests;
