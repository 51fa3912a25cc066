//! Bounds on what a peer can make the shared runtime pieces hold: the
//! health, readiness and metrics endpoints every binary serves, the PEM files
//! it loads and the egress HTTP proxy's answers.

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

/// Longest answer head read from an egress HTTP proxy to the CONNECT that
/// opens a peer connection through it (`crate::egress_proxy`); a real one is
/// a status line and a few headers.
pub const MAX_PROXY_RESPONSE_HEAD: usize = 8 << 10;
/// Longest `NO_PROXY` value read; a longer one is ignored (the proxy used).
pub const MAX_NO_PROXY: usize = 64 << 10;

/// Addresses a listener's flood penalty remembers at once
/// (`crate::flood_penalty`); past it, the one whose penalty ends first is
/// forgotten.
pub const MAX_FLAGGED_SOURCES: usize = 4096;
/// Longest a new connection from an address that flooded waits for its
/// turn (`crate::flood_penalty`); one that would wait longer is closed. With
/// the penalty's rate this bounds how many of an address's connections wait.
pub const MAX_FLOOD_PENALTY_WAIT: Duration = Duration::from_secs(10);

/// Client addresses a slow lane steers at once (`crate::slow_lane`); past
/// it, the one whose penalty ends first is forgotten. Each takes two
/// instructions of the kernel's program (IPv6: five), and a classic BPF
/// program may have 4,096.
pub const MAX_SLOW_LANE_SOURCES: usize = 512;
/// A slow lane's listen backlog: the flagged clients' connections the kernel
/// completes and queues for the process; past it, it drops their SYNs and
/// the clients retry on their own schedule, at no cost to the process.
pub const SLOW_LANE_BACKLOG: i32 = 64;
