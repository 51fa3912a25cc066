//! Just enough HTTP/2 framing, written by hand, to send requests no HTTP/2
//! library will produce: an `:authority` that is a raw socket path, as older
//! grpc-go (inside kube-apiserver) sends on the Unix socket.

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const GOAWAY: u8 = 7;
pub const CONTINUATION: u8 = 9;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    let len = payload.len() as u32;
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK "literal header field without indexing, new name", no Huffman.
pub fn hpack_literal(block: &mut Vec<u8>, name: &str, value: &str) {
    fn string(block: &mut Vec<u8>, s: &str) {
        assert!(s.len() < 127, "short strings only");
        block.push(s.len() as u8);
        block.extend_from_slice(s.as_bytes());
    }
    block.push(0x00);
    string(block, name);
    string(block, value);
}

/// A gRPC request's HEADERS frame (END_HEADERS) with the given authority.
pub fn grpc_headers(stream: u32, path: &str, authority: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        hpack_literal(&mut block, k, v);
    }
    frame(HEADERS, 0x4, stream, &block)
}

/// One gRPC message (uncompressed) in a DATA frame.
pub fn grpc_data(stream: u32, message: &[u8]) -> Vec<u8> {
    let mut p = BytesMut::with_capacity(5 + message.len());
    p.put_u8(0);
    p.put_u32(message.len() as u32);
    p.put_slice(message);
    frame(DATA, 0, stream, &p)
}

/// Reads one frame: (type, flags, stream, payload).
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

/// Writes the client preface and an empty SETTINGS frame.
pub async fn start<W: AsyncWrite + Unpin>(w: &mut W) -> std::io::Result<()> {
    w.write_all(PREFACE).await?;
    w.write_all(&frame(SETTINGS, 0, 0, &[])).await
}

/// A gRPC request whose header block holds one 4,000-byte dynamic-table
/// entry and `refs` one-byte references to it: a few KiB on the wire that
/// decode to `refs` × 4 KB. Cut into HEADERS and CONTINUATION frames of at
/// most 16 KiB, as a client would.
pub fn header_bomb(stream: u32, authority: &str, refs: usize) -> Vec<u8> {
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/ProxyService/Proxy"),
        (":authority", authority),
        ("content-type", "application/grpc"),
    ] {
        hpack_literal(&mut block, k, v);
    }
    // Literal with incremental indexing, new name: it becomes index 62.
    block.push(0x40);
    block.push(4);
    block.extend_from_slice(b"x-bb");
    let _ = loona_hpack::encoder::encode_integer_into(4000, 7, 0, &mut block);
    block.extend(std::iter::repeat_n(b'a', 4000));
    block.extend(std::iter::repeat_n(0x80 | 62, refs));
    let pieces: Vec<&[u8]> = block.chunks(16 * 1024).collect();
    let mut out = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == pieces.len() { 0x4 } else { 0 };
        out.extend(frame(kind, flags, stream, piece));
    }
    out
}

/// `frames` with END_HEADERS cleared on the last one: a header block the
/// server must hold while it waits for a CONTINUATION that never comes.
pub fn unfinished(mut frames: Vec<u8>) -> Vec<u8> {
    let (mut at, mut last) = (0, None);
    while at + 9 <= frames.len() {
        last = Some(at);
        at += 9 + u32::from_be_bytes([0, frames[at], frames[at + 1], frames[at + 2]]) as usize;
    }
    if let Some(l) = last {
        frames[l + 4] &= !0x4;
    }
    frames
}

/// The `:status` of a response HEADERS frame's block (END_HEADERS, no
/// padding or priority), decoded with a fresh table.
pub fn response_status(block: &[u8]) -> Option<u16> {
    let fields = loona_hpack::Decoder::new().decode(block).ok()?;
    let (_, v) = fields.iter().find(|(n, _)| n == b":status")?;
    std::str::from_utf8(v).ok()?.parse().ok()
}
