//! Konnectivity wire types, byte-compatible with apiserver-network-proxy v0.36.
//!
//! The code in `gen/` is generated from `proto/` by `tests/bootstrap.rs` (pure Rust,
//! no system `protoc`) and checked in, so building needs no code generator.

#[allow(
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    missing_docs,
    rust_2018_idioms
)]
pub(crate) mod generated {
    include!("gen/_.rs");
}

pub use generated::*;

pub mod codec;
pub mod control;
pub mod header;
pub mod ids;
mod packets;

pub use packets::PacketExt;

/// The upstream release this implementation is wire- and flag-compatible with.
pub const UPSTREAM: &str = "apiserver-network-proxy v0.36.0";

/// grpc-go's spelling of a status code (`codes.Code.String()`), which upstream
/// uses as a metric label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// Upstream's metric label for each packet type, by wire value, then
/// `Unknown` for values this build does not know.
pub const PACKET_TYPE_LABELS: [&str; 9] = [
    "DIAL_REQ",
    "DIAL_RSP",
    "CLOSE_REQ",
    "CLOSE_RSP",
    "DATA",
    "DIAL_CLS",
    "DRAIN",
    "Unknown",
    "WINDOW_UPDATE",
];

/// The [`PACKET_TYPE_LABELS`] index a packet is counted under in the
/// `stream_packets_total` families; `None` for WINDOW_UPDATE, which upstream
/// never sends (flow control between our server and agent), so the
/// families' series stay upstream's.
pub fn counted_packet_type(packet_type: i32) -> Option<usize> {
    (packet_type != PacketType::WindowUpdate as i32).then(|| packet_type_index(packet_type))
}

/// Index into [`PACKET_TYPE_LABELS`] for a raw `type` value.
pub fn packet_type_index(packet_type: i32) -> usize {
    match packet_type {
        0..=6 => packet_type as usize,
        100 => 8,
        _ => 7,
    }
}
