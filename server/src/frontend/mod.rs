//! The two ways a frontend (kube-apiserver) talks to the server.

pub mod grpc;
pub mod http_connect;
mod stream;

pub use stream::FrontendStream;
