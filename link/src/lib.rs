//! Moving bytes between two peers: the relay every proxy here runs between
//! two connections, the HTTP/2 link (gRPC framing on `h2`, window sizing by
//! measured round trip, control-frame flood guard), and Konnectivity's flow
//! control over an agent stream (credit per connection inside a per-stream
//! and a per-process budget, and the byte budget of the legacy path that
//! has no credit).
//!
//! Sits on the runtime (`daemon`: drain, endpoints, metrics registry) and on
//! `go-compat` (the Go-format metrics the Konnectivity pair exposes).

pub mod budget;
pub mod chunks;
pub mod close_reason;
pub mod debug_connections;
pub mod duplex;
pub mod flow;
pub mod h2flood;
pub mod h2grpc;
pub mod h2io;
pub mod h2window;
pub mod limits;
pub mod relay;
pub mod splice;
pub mod stream_metrics;
pub mod traceparent;
