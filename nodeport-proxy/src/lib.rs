//! KKP's nodeport-proxy as one process: the routing rules of envoy-manager
//! and the data plane Envoy ran. Services and EndpointSlices (from a file now,
//! from the API server later) become one routing table, swapped atomically;
//! NodePort, SNI (6443) and CONNECT tunneling (8088) listeners route by it;
//! Envoy-compatible stats and health are served on 8002.

pub mod access_log;
pub mod cli;
pub mod client_hello;
pub mod cluster_stats;
pub mod config;
pub mod connect_request;
pub mod expose;
mod first_bytes;
mod forward;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod health;
pub mod index;
pub mod kube;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod names;
mod node_port;
pub mod plan;
pub mod policy;
mod proxy;
pub mod proxy_protocol;
pub mod readiness;
mod shards;
mod sni;
pub mod source;
mod stats;
pub mod store;
pub mod table;
mod tunnel;
mod tunnel_h2;
mod tunnel_open;
pub mod upstream;
pub mod yaml_items;

pub use config::{ConnectionSettings, ProxyConfig, TableSource};
pub use model::Inventory;
pub use proxy::{BoundAddrs, Listeners, NodePortProxy, ProxyError, run};
pub use store::TableStatus;

#[cfg(test)]
mod corpus_tests;
