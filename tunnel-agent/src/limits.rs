//! Every bound on a length the seed's nodeport-proxy (our one peer besides
//! local clients, whose bytes are only relayed) or the bootstrap file
//! controls, in one place.

/// SETTINGS_MAX_HEADER_LIST_SIZE we advertise to the seed: a CONNECT
/// response's headers are a few bytes. h2's own default is 16 MiB, which
/// would let one header block (HEADERS and up to a thousand CONTINUATION
/// frames) be buffered before it is refused.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 10;

/// Streams the seed may reset before we read them, and streams we may reset
/// for the seed's protocol errors, before the connection is ended (h2's
/// defaults, named here).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Largest bootstrap file read (KKP's renders to about 3 KiB; this leaves
/// room for some sixty listeners). The YAML scanner's time grows faster than
/// linearly with nesting, so the bound is kept small.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Deepest nesting of flow collections (`[`, `{`) in a bootstrap; KKP's has 1.
pub const MAX_FLOW_DEPTH: usize = 32;
/// Most listeners a bootstrap may declare (KKP renders two or three).
pub const MAX_LISTENERS: usize = 1024;
/// Most values (mappings, lists, scalars) a bootstrap may hold once its YAML
/// aliases are expanded; KKP's has about 150, and a 64 KiB file without
/// aliases fewer than 40,000. An alias bomb stops here.
pub const MAX_NODES: usize = 100_000;
