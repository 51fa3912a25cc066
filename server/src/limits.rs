//! Every bound on a length a peer controls, in one place.
//!
//! kube-apiserver (frontends) and agents are peers: whatever they send is
//! parsed or buffered only up to these sizes, and going past one ends that
//! stream or connection with an error, never the process.

/// SETTINGS_MAX_HEADER_LIST_SIZE we advertise on every HTTP/2 listener:
/// a request whose decoded header list is larger is refused with 431, and
/// one over four times this ends the connection (GOAWAY ENHANCE_YOUR_CALM),
/// as h2 does. grpc-go's default is 16 MiB; a kube-apiserver request's
/// headers are a few hundred bytes.
pub const MAX_HEADER_LIST_SIZE: usize = 64 << 10;

/// SETTINGS_HEADER_TABLE_SIZE (HTTP/2's default, which we never raise): the
/// most a client's HPACK dynamic table may hold.
pub const HEADER_TABLE_SIZE: usize = 4096;

/// HTTP/2 control frames (SETTINGS weigh 10, see `link::limits`) an agent
/// connection may send at once before the rate and the credit its data
/// earns refill the budget; past it the connection ends with GOAWAY
/// ENHANCE_YOUR_CALM. A fifth of the frontends' 1,000: `--agent-accept-rate`
/// bounds how fast a flooding agent comes back, so what a flood costs is
/// this burst times that rate (RELIABILITY.md, `floods`: PING flood p99
/// 3.12 → 1.46 × quiet). On the frontends, which have no accept rate, a
/// lower burst only makes a flooder reconnect sooner (5.80 × at 200). An
/// agent sends a handful of control frames beyond what its data earns.
pub const AGENT_H2_CONTROL_BURST: f64 = 200.0;

/// New gRPC frontend connections a second a client that flooded may start
/// during `--frontend-flood-penalty` (after a first one at once; the rest
/// wait up to `daemon::limits::MAX_FLOOD_PENALTY_WAIT`, then are closed).
/// Each admitted flooder spends at most one control-frame burst; at 10 a
/// second that is well under 1 % of a core.
pub const FRONTEND_FLOOD_PENALTY_RATE: f64 = 10.0;

/// SETTINGS_MAX_FRAME_SIZE we advertise: the largest frame a peer may send.
pub const MAX_FRAME_SIZE: u32 = 64 << 10;

/// Largest compressed header block (HEADERS plus CONTINUATION payloads) the
/// Unix-socket gRPC frontend buffers to check its `:authority`; a larger one
/// is handed to h2 as it came (h2 then enforces its own limits on it).
/// Together with the HPACK table this is the most header-decoding state one
/// connection holds.
pub const MAX_HEADER_BLOCK: usize = 32 << 10;

/// CONTINUATION frames one header block may span on the Unix-socket gRPC
/// frontend before it is handed to h2 as it came (h2 allows 5 at our
/// settings and then answers GOAWAY ENHANCE_YOUR_CALM).
pub const MAX_CONTINUATIONS: usize = 8;

/// Largest gRPC message accepted from a frontend or an agent (grpc-go's
/// default receive limit); a larger one ends that stream.
pub const MAX_GRPC_MESSAGE: usize = 4 << 20;

/// DATA for a gRPC frontend goes to HTTP/2 in pieces of at most this much
/// (a frontend reads a byte stream; packet boundaries mean nothing to it).
/// hyper hands HTTP/2 a whole message once its stream has any window, so a
/// frontend that stopped reading has one piece buffered there beyond its
/// window, not a 4 MiB packet; the rest stays in the tunnel's queue, counted
/// in the budget and dropped if the tunnel is aborted.
pub const MAX_FRONTEND_PIECE: usize = 64 << 10;

/// Bytes of packets queued for one agent stream (and counted like credit,
/// at least 256 per packet) beside the `--xfr-channel-size` packets: what
/// an agent that stops reading makes the server hold there, whatever the
/// size of the frontends' packets (up to 4 MiB each). A larger packet
/// still goes when the queue is empty.
pub const MAX_AGENT_QUEUE_BYTES: u32 = 4 << 20;

/// Longest HTTP CONNECT request head; a CONNECT head is a few dozen bytes.
pub const MAX_CONNECT_HEAD: usize = 64 << 10;

/// Most header fields parsed in an HTTP CONNECT request head.
pub const MAX_CONNECT_HEADERS: usize = 64;

/// Bytes an HTTP CONNECT client may send before its tunnel is established;
/// they are kept and sent once the dial succeeds.
pub const MAX_EARLY_DATA: usize = 64 << 10;

/// Bytes read and dropped from a client whose TLS handshake we refused, so
/// closing does not reset the connection before it read our alert.
pub const MAX_ALERT_DRAIN: usize = 64 << 10;

/// `--max-pending-dials-per-agent` by default: unanswered dials (DIAL_REQ
/// sent, no DIAL_RSP yet) one agent stream may hold. A dial to a reachable
/// destination is pending for about one TCP handshake, so only destinations
/// that never answer (blackholed, a partitioned node) fill it; past it a
/// new dial goes to another agent, or fails at once. Upstream has no bound:
/// such dials pile up until `--backend-dial-timeout`.
pub const DEFAULT_MAX_PENDING_DIALS_PER_AGENT: usize = 2048;

/// `--max-pending-dials-per-destination` by default: unanswered dials one
/// agent stream may hold to one address, so that one blackholed
/// destination cannot fill the agent's bound for every other one.
pub const DEFAULT_MAX_PENDING_DIALS_PER_DESTINATION: usize = 512;
