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
