//! Bounds on what a peer can make the shared runtime pieces hold: the
//! health, readiness and metrics endpoints every binary serves.

use std::time::Duration;

/// Connections one health or admin listener serves at once. When full, the
/// oldest is closed for the newcomer: a flood of idle connections cannot
/// keep a kubelet probe or a scrape out, nor take the descriptors the data
/// path needs.
pub const ENDPOINT_MAX_CONNECTIONS: usize = 128;

/// How long an endpoint client may take to send a request head (and how
/// long an idle keep-alive connection is kept).
pub const ENDPOINT_HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Read buffer, and so the largest request head, on an endpoint connection
/// (hyper's minimum).
pub const ENDPOINT_MAX_BUF: usize = 8 << 10;

/// Largest certificate, key or CA bundle file read (a bundle of a few
/// hundred CAs fits; a wrong path naming a huge file does not fill memory).
pub const MAX_PEM_FILE: u64 = 1 << 20;
