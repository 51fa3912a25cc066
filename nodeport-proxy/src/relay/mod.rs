//! Stage 4, relay: the per-connection session (admission, upstream connect,
//! relay, access-log record) and the parsers of what clients send first
//! (ClientHello, CONNECT head, PROXY header).

pub mod access_log;
pub mod admission;
pub mod client_hello;
pub mod connect_request;
pub(crate) mod first_bytes;
pub mod proxy_protocol;
pub(crate) mod session;
pub mod upstream;
