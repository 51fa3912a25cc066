//! The two ways a frontend (kube-apiserver) talks to the server.

mod authority;
pub mod connect_head;
pub mod grpc;
mod hold_preface;
pub(crate) mod hpack;
pub mod http_connect;
mod stream;

pub use authority::FixAuthority;
pub use hold_preface::HoldPreface;
pub use stream::FrontendStream;
