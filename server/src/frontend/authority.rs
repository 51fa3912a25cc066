//! Lets older kube-apiservers in over the Unix socket.
//!
//! kube-apiserver dials the socket path as its gRPC target, so grpc-go sends
//! that path as `:authority`: percent-encoded by current grpc-go
//! (`%2Fetc%2Fkubernetes%2F…`), raw (`/etc/kubernetes/…`) by older ones. The
//! `http` crate accepts neither as an authority, so h2 resets the stream as
//! malformed, and it has no switch to relax that. This reader sits between the socket and h2 on the Unix-socket gRPC
//! frontend only: it walks the client's HTTP/2 frames, and when a request's
//! `:authority` would be rejected it replaces it with `localhost` (the
//! authority means nothing on a Unix socket).
//!
//! Header blocks are HPACK-compressed with state shared across the whole
//! connection, so the client's blocks are always decoded here; they pass
//! through untouched until one must change, and from then on every block is
//! re-encoded as plain literals (no dynamic table), which keeps h2's decoder
//! consistent. DATA and every other frame are passed through without copying
//! into an intermediate buffer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// h2's default SETTINGS_MAX_FRAME_SIZE, which re-encoded blocks respect.
const MAX_FRAME: usize = 16_384;
/// Largest header block accepted (matches the server's header list limit).
const MAX_BLOCK: usize = 64 * 1024;
/// h2's default SETTINGS_HEADER_TABLE_SIZE: the most the client may use.
const TABLE_SIZE: usize = 4096;

enum State {
    /// Bytes of the connection preface still expected.
    Preface(usize),
    /// At a frame boundary.
    Frame,
    /// Inside a frame that is passed through; bytes left.
    Payload(usize),
}

struct Pending {
    stream: u32,
    /// END_STREAM from the HEADERS frame.
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

pub struct FixAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet handed on.
    inbuf: BytesMut,
    /// Bytes ready for h2.
    out: BytesMut,
    state: State,
    decoder: super::hpack::Decoder,
    pending: Option<Pending>,
    /// Set once a block was changed: every later block is re-encoded.
    rewriting: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        let decoder = super::hpack::Decoder::new(TABLE_SIZE);
        FixAuthority {
            inner,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            state: State::Preface(PREFACE.len()),
            decoder,
            pending: None,
            rewriting: false,
        }
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn valid_authority(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| s.parse::<http::uri::Authority>().is_ok())
}

/// HPACK literal without indexing, new name, no Huffman (RFC 7541 §6.2.2).
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    for s in [name, value] {
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

impl<S> FixAuthority<S> {
    /// Processes complete frames from `inbuf` into `out`. Returns false when
    /// more input is needed.
    fn step(&mut self) -> io::Result<bool> {
        match self.state {
            State::Preface(left) => {
                if self.inbuf.is_empty() {
                    return Ok(false);
                }
                let n = left.min(self.inbuf.len());
                let seen = PREFACE.len() - left;
                if self.inbuf[..n] != PREFACE[seen..seen + n] {
                    // Not HTTP/2: hand everything on and let h2 refuse it.
                    self.state = State::Payload(usize::MAX);
                    return Ok(true);
                }
                self.out.put(self.inbuf.split_to(n));
                self.state = if n == left {
                    State::Frame
                } else {
                    State::Preface(left - n)
                };
                Ok(true)
            }
            State::Payload(0) => {
                self.state = State::Frame;
                Ok(true)
            }
            // Payload bytes are copied straight to the reader (see poll_read).
            State::Payload(_) => Ok(false),
            State::Frame => {
                if self.inbuf.len() < 9 {
                    return Ok(false);
                }
                let len =
                    u32::from_be_bytes([0, self.inbuf[0], self.inbuf[1], self.inbuf[2]]) as usize;
                let kind = self.inbuf[3];
                if kind != HEADERS && kind != CONTINUATION {
                    if self.pending.is_some() {
                        return Err(bad("frame interleaved with a header block"));
                    }
                    self.out.put(self.inbuf.split_to(9));
                    self.state = State::Payload(len);
                    return Ok(true);
                }
                if len > MAX_BLOCK {
                    return Err(bad("header frame too large"));
                }
                if self.inbuf.len() < 9 + len {
                    self.inbuf.reserve(9 + len - self.inbuf.len());
                    return Ok(false);
                }
                let flags = self.inbuf[4];
                let stream = u32::from_be_bytes([
                    self.inbuf[5],
                    self.inbuf[6],
                    self.inbuf[7],
                    self.inbuf[8],
                ]) & 0x7fff_ffff;
                let frame = self.inbuf.split_to(9 + len);
                self.header_frame(kind, flags, stream, &frame[9..])?;
                Ok(true)
            }
        }
    }

    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        mut payload: &[u8],
    ) -> io::Result<()> {
        match (kind, self.pending.as_mut()) {
            (HEADERS, None) => {
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(
                        *payload
                            .first()
                            .ok_or_else(|| bad("padded frame without pad length"))?,
                    );
                    payload = &payload[1..];
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let p: [u8; 5] = payload
                        .get(..5)
                        .and_then(|p| p.try_into().ok())
                        .ok_or_else(|| bad("short priority"))?;
                    priority = Some(p);
                    payload = &payload[5..];
                }
                let fragment = payload
                    .get(..payload.len().saturating_sub(pad))
                    .filter(|_| pad <= payload.len())
                    .ok_or_else(|| bad("padding exceeds frame"))?;
                self.pending = Some(Pending {
                    stream,
                    flags: flags & 0x1,
                    priority,
                    block: fragment.to_vec(),
                });
            }
            (CONTINUATION, Some(p)) if p.stream == stream => {
                if p.block.len() + payload.len() > MAX_BLOCK {
                    return Err(bad("header block too large"));
                }
                p.block.extend_from_slice(payload);
            }
            _ => return Err(bad("unexpected header frame")),
        }
        if flags & END_HEADERS != 0
            && let Some(p) = self.pending.take()
        {
            self.finish_block(p)?;
        }
        Ok(())
    }

    fn finish_block(&mut self, p: Pending) -> io::Result<()> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut fix = false;
        self.decoder
            .decode(&p.block, |name, value| {
                if name == b":authority" && !valid_authority(value) {
                    fix = true;
                }
                fields.push((name.to_vec(), value.to_vec()));
            })
            .map_err(|e| bad(format!("HPACK: {e}")))?;
        self.rewriting |= fix;
        let block = if self.rewriting {
            let mut out = Vec::with_capacity(p.block.len() + 64);
            for (name, value) in &fields {
                if name == b":authority" && !valid_authority(value) {
                    tracing::debug!(authority = %String::from_utf8_lossy(value), "replacing unparsable :authority");
                    literal(&mut out, name, b"localhost");
                } else {
                    literal(&mut out, name, value);
                }
            }
            out
        } else {
            p.block
        };
        self.emit_block(p.stream, p.flags, p.priority, &block);
        Ok(())
    }

    /// Writes a header block as HEADERS plus CONTINUATION frames.
    fn emit_block(&mut self, stream: u32, end_stream: u8, priority: Option<[u8; 5]>, block: &[u8]) {
        let first_room = MAX_FRAME - if priority.is_some() { 5 } else { 0 };
        let (first, mut rest) = block.split_at(first_room.min(block.len()));
        let mut flags = end_stream | if rest.is_empty() { END_HEADERS } else { 0 };
        if priority.is_some() {
            flags |= PRIORITY;
        }
        let len = first.len() + if priority.is_some() { 5 } else { 0 };
        self.frame_head(len, HEADERS, flags, stream);
        if let Some(p) = priority {
            self.out.put_slice(&p);
        }
        self.out.put_slice(first);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(MAX_FRAME.min(rest.len()));
            rest = tail;
            self.frame_head(
                chunk.len(),
                CONTINUATION,
                if rest.is_empty() { END_HEADERS } else { 0 },
                stream,
            );
            self.out.put_slice(chunk);
        }
    }

    fn frame_head(&mut self, len: usize, kind: u8, flags: u8, stream: u32) {
        self.out.put_slice(&(len as u32).to_be_bytes()[1..]);
        self.out.put_u8(kind);
        self.out.put_u8(flags);
        self.out.put_u32(stream);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let me = &mut *self;
        loop {
            if !me.out.is_empty() {
                let n = me.out.len().min(buf.remaining());
                buf.put_slice(&me.out[..n]);
                me.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if me.step()? {
                continue;
            }
            // A connection waiting for its next frame keeps no buffer.
            if me.inbuf.is_empty() && me.inbuf.capacity() > 0 {
                me.inbuf = BytesMut::new();
            }
            if let State::Payload(left) = me.state
                && left > 0
            {
                let before = buf.filled().len();
                if me.inbuf.is_empty() {
                    // Nothing buffered: read straight into the caller's buffer.
                    let limit = left.min(buf.remaining());
                    let dst = buf.initialize_unfilled_to(limit);
                    let mut sub = ReadBuf::new(dst);
                    ready!(Pin::new(&mut me.inner).poll_read(cx, &mut sub))?;
                    let n = sub.filled().len();
                    buf.advance(n);
                } else {
                    let n = left.min(me.inbuf.len()).min(buf.remaining());
                    buf.put_slice(&me.inbuf[..n]);
                    me.inbuf.advance(n);
                }
                let n = buf.filled().len() - before;
                if left != usize::MAX {
                    me.state = State::Payload(left - n);
                }
                return Poll::Ready(Ok(()));
            }
            // Frame heads and header blocks only: payloads bypass this buffer.
            // Read on the stack first, so that a connection waiting for its
            // next frame holds no heap buffer.
            let mut chunk = [0u8; 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            me.inbuf.extend_from_slice(rb.filled());
            if n == 0 {
                // EOF: whatever is left is handed on as is.
                let rest = me.inbuf.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                me.out.put(rest);
                continue;
            }
        }
    }
}

daemon::forward_async_write!(FixAuthority);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn block(authority: &str) -> Vec<u8> {
        let mut b = Vec::new();
        // :method POST as literal with incremental indexing, so the client's
        // table holds an entry the rewritten stream must not rely on.
        b.push(0x40);
        for s in [":method".as_bytes(), b"POST"] {
            b.push(s.len() as u8);
            b.extend_from_slice(s);
        }
        literal(&mut b, b":authority", authority.as_bytes());
        literal(&mut b, b":path", b"/ProxyService/Proxy");
        b
    }

    async fn run(input: Vec<u8>) -> Vec<u8> {
        let mut r = FixAuthority::new(std::io::Cursor::new(input));
        let mut out = Vec::new();
        r.read_to_end(&mut out)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        out
    }

    fn decode_all(mut bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        assert!(bytes.starts_with(PREFACE));
        bytes = &bytes[PREFACE.len()..];
        let mut d = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut cur = Vec::new();
        while bytes.len() >= 9 {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let (kind, flags) = (bytes[3], bytes[4]);
            let payload = &bytes[9..9 + len];
            if kind == HEADERS || kind == CONTINUATION {
                cur.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    blocks.push(d.decode(&cur).unwrap_or_default());
                    cur.clear();
                }
            }
            bytes = &bytes[9 + len..];
        }
        blocks
    }

    #[tokio::test]
    async fn valid_authorities_pass_untouched() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block("localhost:8090")));
        input.extend(frame(0, 0, 1, b"payload bytes"));
        assert_eq!(run(input.clone()).await, input);
    }

    #[tokio::test]
    async fn raw_paths_are_replaced_and_later_blocks_stay_decodable() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block("/tmp/s.sock")));
        input.extend(frame(0, 0, 1, b"data"));
        // The second block references the client's dynamic-table entry (index 62).
        let mut second = vec![0x80 | 62];
        literal(&mut second, b":authority", b"/tmp/s.sock");
        // Split it across HEADERS and CONTINUATION.
        let (a, b) = second.split_at(3);
        input.extend(frame(HEADERS, 0, 3, a));
        input.extend(frame(CONTINUATION, END_HEADERS, 3, b));
        let blocks = decode_all(&run(input).await);
        assert_eq!(blocks.len(), 2);
        for b in &blocks {
            assert!(
                b.contains(&(b":method".to_vec(), b"POST".to_vec())),
                "{b:?}"
            );
            assert!(
                b.contains(&(b":authority".to_vec(), b"localhost".to_vec())),
                "{b:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_next_frame_holds_no_buffers() {
        use tokio::io::AsyncWriteExt;
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut r = FixAuthority::new(server);
        let mut input = PREFACE.to_vec();
        // Rewritten, so it passes through `out` as well as `inbuf`.
        input.extend(frame(HEADERS, END_HEADERS, 1, &block("/tmp/s.sock")));
        client
            .write_all(&input)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut got = Vec::new();
        loop {
            let mut chunk = [0u8; 256];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut r).poll_read(&mut cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => panic!("unexpected EOF"),
                Poll::Ready(Ok(())) => got.extend_from_slice(rb.filled()),
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => break,
            }
        }
        assert_eq!(decode_all(&got).len(), 1, "the whole block came through");
        assert_eq!((r.inbuf.capacity(), r.out.capacity()), (0, 0));
    }

    #[tokio::test]
    async fn garbage_is_refused_not_panicked_on() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        let mut r = FixAuthority::new(std::io::Cursor::new(input));
        let mut out = Vec::new();
        assert!(r.read_to_end(&mut out).await.is_err());
        let mut r = FixAuthority::new(std::io::Cursor::new(frame(CONTINUATION, 0, 1, b"x")));
        let mut out = Vec::new();
        // Not HTTP/2 at all: passed on for h2 to refuse.
        assert!(r.read_to_end(&mut out).await.is_ok());
    }
}
