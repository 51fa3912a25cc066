//! KKP's envoy-agent as one small process. Each local listener (by default
//! the tunneling agent IP `100.64.30.10:6443`) turns accepted connections into
//! HTTP/2 CONNECT streams to a fixed authority, all multiplexed over one h2c
//! connection to the seed's nodeport-proxy tunneling port. The connection is
//! kept alive with HTTP/2 PINGs and re-dialled (re-resolving DNS) with back-off.

pub mod agent;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod envoy_rules;
#[rustfmt::skip]
pub mod envoy_schema;
pub mod limits;
pub mod metrics;
pub mod reload;
pub mod schema;
pub mod schema_types;
pub mod seed;
pub mod tree;

pub use agent::{AgentError, AgentListeners, TunnelAgent, run};
pub use config::{AgentConfig, ListenerSpec};

#[cfg(test)]
mod corpus_tests;
