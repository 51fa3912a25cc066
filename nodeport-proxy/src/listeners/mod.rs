//! Stage 3, listeners: the process (proxy) and its NodePort, SNI and
//! CONNECT tunneling listeners. Each reads what it needs of its client,
//! picks a route and hands a [`crate::relay::session::Session`] on.

pub(crate) mod node_port;
pub(crate) mod proxy;
pub(crate) mod sni;
pub(crate) mod tunnel;
pub(crate) mod tunnel_h2;
pub(crate) mod tunnel_open;
