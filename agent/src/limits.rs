//! Every bound on a length a peer controls, in one place.
//!
//! Servers are peers: what they send is parsed or buffered only up to these
//! sizes, and going past one fails that stream or dial with an error.

/// Largest gRPC message accepted from or sent to a server (grpc-go's
/// default); a larger one ends that stream.
pub const MAX_GRPC_MESSAGE: usize = 4 << 20;

/// SETTINGS_MAX_FRAME_SIZE we advertise on a server link: the largest
/// HTTP/2 frame a server may send us, and so what h2 buffers at most to
/// decode one. As large as our server's, so that a gRPC message of 16 KiB of
/// data (which never fits HTTP/2's default 16 KiB frame) can arrive in one
/// frame instead of being gathered out of two.
pub const MAX_FRAME_SIZE: u32 = 64 << 10;

/// Longest DIAL_REQ address dialed (a DNS name is at most 253 bytes); a
/// longer one is refused without a lookup, and error texts never echo more.
pub const MAX_DIAL_ADDRESS: usize = 1024;

/// Longest DIAL_REQ `traceparent` (our server's extension field; a
/// version-00 value is 55 bytes) read; a longer one is ignored, as a
/// malformed one is, and the dial's span starts a trace of its own.
pub const MAX_TRACEPARENT: usize = 256;

/// Largest error body read from kube-apiserver for a failed lease call's
/// reason.
pub const MAX_STATUS_BODY: usize = 64 << 10;

/// Shortest pause between two connection attempts or server-count checks.
/// Upstream's agent takes `--sync-interval=0` as no pause at all, a busy
/// loop against a server that is down; ours retries every 100 ms then.
pub const MIN_SYNC_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
