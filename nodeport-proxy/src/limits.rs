//! Every bound on a length a peer or the table file controls, in one place.
//!
//! Clients of the SNI, tunneling and NodePort listeners are peers, and so is
//! whoever writes the table file or the Services it mirrors: what they send
//! is parsed or buffered only up to these sizes, and going past one ends that
//! connection, stream or load with an error, never the process.

use std::time::Duration;

/// Largest ClientHello handshake message accepted on the SNI listener.
/// Post-quantum key shares make real ones about 2 KiB; 16 KiB leaves room for
/// many PSK identities.
pub const MAX_CLIENT_HELLO: usize = 16 << 10;

/// Bytes read from an SNI client before its ClientHello must be complete:
/// the message, its record headers, and a little early data after it.
pub const MAX_SNI_PREFIX: usize = MAX_CLIENT_HELLO + 1024;

/// Longest HTTP/1.1 request head on the tunneling listener; a CONNECT head is
/// a few dozen bytes. Bytes after it in the same read are early tunnel data,
/// so they are bounded by this too.
pub const MAX_CONNECT_HEAD: usize = 8 << 10;

/// Most header fields parsed in an HTTP/1.1 CONNECT head (431 past it).
pub const MAX_CONNECT_HEADERS: usize = 64;

/// SETTINGS_MAX_HEADER_LIST_SIZE on the tunneling listener's HTTP/2
/// connections: a CONNECT whose decoded header list is larger is refused
/// (431), and h2 ends a connection sending far more (GOAWAY). h2 decodes
/// field by field against this bound and buffers at most
/// `MAX_HEADER_LIST_SIZE / MAX_FRAME_SIZE` CONTINUATION frames of one block.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 10;

/// SETTINGS_HEADER_TABLE_SIZE we advertise (HTTP/2's default): the most a
/// client's HPACK dynamic table makes us hold per connection.
pub const HEADER_TABLE_SIZE: u32 = 4096;

/// SETTINGS_MAX_FRAME_SIZE we advertise (HTTP/2's default and minimum).
pub const MAX_FRAME_SIZE: u32 = 16 << 10;

/// HTTP/2 flow-control windows a tunneling connection starts with: the most
/// DATA a client may have in flight to us per stream and per connection
/// until the windows grow with the link (up to
/// `-tunneling-max-stream-window`, and only as far as
/// `-tunneling-connection-budget` and `-tunneling-memory-budget` allow;
/// `link::h2window`). Received DATA is released only as it is forwarded,
/// so the windows are also what a stream or connection can make us buffer;
/// hence these starting windows are reserved from the budgets too, and a
/// connection that finds them spent starts at HTTP/2's own 65,535 bytes
/// (`link::h2window::SPEC_WINDOW`, which a client may use before it hears
/// from us, so it is owed even past the budget).
pub const STREAM_WINDOW: u32 = 256 << 10;
pub const CONNECTION_WINDOW: u32 = 1 << 20;
/// Defaults of those flags: a stream window of 16 MiB carries 160 MB/s over
/// a 100 ms round trip; one client connection (one tunnel-agent, i.e. one
/// node) may park 64 MiB with us, all of them together 128 MiB. The process
/// budget is sized with the deploy limit (1 GiB, deploy/nodeport-proxy): a
/// replica with 20,000 Services (~100 MiB, BENCHMARKS.md P11), its tunneling
/// listener at -max-connections-per-listener with data moving on every
/// tunnel (10,000 × 67 KiB, BENCHMARKS.md NPM) and this budget full come to
/// about 0.9 GiB; a budget past the pod's limit would leave the decision to
/// the OOM killer.
pub const DEFAULT_MAX_STREAM_WINDOW: u32 = 16 << 20;
pub const DEFAULT_CONNECTION_BUDGET: i64 = 64 << 20;
pub const DEFAULT_MEMORY_BUDGET: i64 = 128 << 20;
/// How long a connection's data may stop before its windows shrink.
pub const WINDOW_IDLE: Duration = Duration::from_secs(5);

/// Streams a client may reset before we accept them (the HTTP/2 "rapid
/// reset" attack, CVE-2023-44487); past it the connection gets GOAWAY. h2's
/// default, named here.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams we may reset because of a client's protocol errors before the
/// connection is ended with GOAWAY (h2's default, named here).
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// After refusing an HTTP/1.1 request, how much of what the client still
/// sends is read and dropped (so the close does not reset the response
/// away), and for how long.
pub const MAX_REFUSAL_DRAIN: usize = 64 << 10;
pub const REFUSAL_DRAIN_TIME: Duration = Duration::from_secs(1);

/// Largest table file (`-config`) read. A seed with 20,000 exposed Services
/// and their EndpointSlices writes about 30 MB of YAML; a larger file is
/// refused with an error naming it, and the current table stays.
pub const MAX_TABLE_FILE: u64 = 256 << 20;
/// The YAML parser's budget for a table file (events, nodes, scalar bytes):
/// serde-saphyr's defaults (a million events, 250,000 nodes) fit a
/// hand-written config, not a 20,000-Service table. Without aliases each
/// event takes at least a byte of the file, so the file's bound bounds them
/// as well; aliases are held to the parser's own replay limit.
pub const MAX_TABLE_YAML_NODES: usize = MAX_TABLE_FILE as usize;
/// Deepest nesting in a table file's YAML (an EndpointSlice's is about 6).
pub const MAX_TABLE_YAML_DEPTH: usize = 64;

/// Access-log lines queued for the writer thread; when it falls behind this
/// far, further lines are dropped (and counted) rather than held.
pub const ACCESS_LOG_QUEUE: usize = 8192;

/// Longest PROXY protocol header read from a client on a listener given
/// `-accept-proxy-protocol`: v1 lines are at most 107 bytes; v2 headers are
/// 16 bytes plus addresses (at most 216) plus TLVs, which load balancers
/// keep small (AWS's VPC endpoint id, Azure's link id: tens of bytes).
pub const MAX_PROXY_HEADER: usize = 4096;

/// Longest `nodeport-proxy.k8s.io/source-ranges` value read, and most ranges
/// in it; past either the Service refuses every client (and the log says
/// why).
pub const MAX_SOURCE_RANGES_ANNOTATION: usize = 64 << 10;
pub const MAX_SOURCE_RANGES: usize = 1024;

/// A batch of at least this many Kubernetes changes (a list, a relist) is
/// followed by giving freed pages back to the OS at once: what decoding it
/// took is garbage then. Smaller batches (single watch events) free little.
pub const PURGE_AFTER_CHANGES: usize = 256;

/// Per-cluster circuit breakers (`relay::admission`, issue 38, KKP #15962):
/// upstream connections open or being opened, and connects not yet
/// answered, per cluster (`-max-connections-per-cluster`,
/// `-max-pending-connects-per-cluster`). Pending: Envoy's default
/// (max_pending_requests, 1,024), which KKP's envoy-manager leaves in place;
/// a pending connect also ends at `-upstream-connect-timeout` (1 s, KKP's).
/// Connections: Envoy's max_connections is 1,024, but one node's
/// tunnel-agent may hold 4,096 tunnels to one cluster (its
/// `-max-connections-per-listener`), and issue 33 wants 1,100 of them open
/// through the seed, so ours is 4,096: the most one agent listener sends,
/// and still under half a listener's 10,000.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLUSTER: usize = 4096;
pub const DEFAULT_MAX_PENDING_CONNECTS_PER_CLUSTER: usize = 1024;
/// Bytes one cluster's connections may hold in our buffers before it admits
/// no new connection (`-max-buffered-bytes-per-cluster`). Envoy has no such
/// bound (1 MiB per connection and direction, so 2 GiB for a cluster at its
/// 1,024 connections); 16 MiB is a full 16 KiB buffer for 1,024 of them, so
/// a cluster that stops reading costs at most this plus one buffer per
/// direction of the connections it admitted before.
pub const DEFAULT_MAX_BUFFERED_BYTES_PER_CLUSTER: usize = 16 << 20;

/// `-tunneling-flood-penalty`'s default: how long a client address that
/// flooded a tunneling connection (GOAWAY `ENHANCE_YOUR_CALM`) stays slowed
/// after its last flood (`daemon::flood_penalty`).
pub const DEFAULT_FLOOD_PENALTY: Duration = Duration::from_secs(30);
/// New tunneling connections a second such an address may start meanwhile.
/// Each admitted flooder spends at most one control-frame burst (about
/// 150 µs of CPU), so 10 a second costs the proxy well under 1 % of a core;
/// a tunnel-agent behind the same address keeps its open connection and
/// may still open 10 new ones a second.
pub const FLOOD_PENALTY_RATE: f64 = 10.0;
/// New connections a second the SNI listener takes from its slow lane
/// (`-sni-overflow-slow-lane`), all flagged addresses together: at the cost
/// of a refused storm connection (tens of µs) well under 1 % of a core,
/// while a flagged client that now reaches a healthy cluster still gets in.
pub const SLOW_LANE_RATE: f64 = 10.0;
