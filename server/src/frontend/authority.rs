//! Lets older kube-apiservers in over the Unix socket.
//!
//! kube-apiserver dials the socket path as its gRPC target, so grpc-go sends
//! that path as `:authority`: percent-encoded by current grpc-go
//! (`%2Fetc%2Fkubernetes%2F…`), raw (`/etc/kubernetes/…`) by older ones. The
//! `http` crate accepts neither as an authority, so h2 resets the stream as
//! malformed, and it has no switch to relax that. This reader sits between
//! the socket and h2 on the Unix-socket gRPC frontend only: it walks the
//! client's HTTP/2 frames, and when a request's `:authority` would be
//! rejected it replaces that one field (the authority means nothing on a
//! Unix socket).
//!
//! Header blocks are HPACK-compressed with state shared across the whole
//! connection, so every block is decoded here to follow the client's dynamic
//! table, but nothing it expands to is kept: each field is looked at by
//! reference and dropped. A replaced field keeps its representation and, when
//! it enters the dynamic table, its length, so h2's table stays the same size
//! as the client's and every later block passes through byte for byte.
//! h2 still decodes each block itself and enforces the header-list limits
//! (431 for a list over [`MAX_HEADER_LIST_SIZE`], GOAWAY ENHANCE_YOUR_CALM
//! far beyond it). What this reader buffers is bounded by
//! [`MAX_HEADER_BLOCK`] and [`MAX_CONTINUATIONS`]; a block past either, a
//! block that does not decode, or frames out of order make it hand the rest
//! of the connection to h2 as it came, so h2 answers with the HTTP/2 error it
//! would give on the TLS frontend. DATA and every other frame are passed
//! through without copying into an intermediate buffer.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

use super::hpack::{Decoder, Repr, encode_integer};
use crate::limits::{HEADER_TABLE_SIZE, MAX_CONTINUATIONS, MAX_HEADER_BLOCK, MAX_HEADER_LIST_SIZE};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Size of the frames written for a header block: every HTTP/2 peer's minimum.
const OUT_FRAME: usize = 16_384;
/// Frame heads and header blocks are read this much at a time, on the stack.
const READ_CHUNK: usize = 1024;
/// What an unusable `:authority` becomes (cut or padded with `-` where its
/// length must be kept).
const REPLACEMENT: &[u8] = b"localhost";

enum State {
    /// Bytes of the connection preface still expected.
    Preface(usize),
    /// At a frame boundary.
    Frame,
    /// Inside a frame that is passed through; bytes left.
    Payload(usize),
    /// Gathering a header frame's payload into the pending block.
    Gather { left: usize, head: [u8; 9] },
    /// Everything from here on goes to h2 as it came.
    Raw,
}

struct Pending {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    /// The block's fragments so far (padding and priority removed).
    block: Vec<u8>,
    continuations: usize,
}

pub struct FixAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet handed on (frame heads and header
    /// fragments; at most one [`READ_CHUNK`]).
    inbuf: BytesMut,
    /// Bytes ready for h2, in order.
    out: VecDeque<Bytes>,
    state: State,
    decoder: Decoder,
    pending: Option<Pending>,
    /// A header list over the limit was logged on this connection.
    told_oversize: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            inbuf: BytesMut::new(),
            out: VecDeque::new(),
            state: State::Preface(PREFACE.len()),
            decoder: Decoder::new(HEADER_TABLE_SIZE),
            pending: None,
            told_oversize: false,
        }
    }

    /// Heap bytes this connection's header handling holds beyond the HPACK
    /// table: what a peer's header input can make it keep.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.inbuf.capacity()
            + self.out.iter().map(Bytes::len).sum::<usize>()
            + self.pending.as_ref().map_or(0, |p| p.block.capacity())
    }
}

fn valid_authority(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| s.parse::<http::uri::Authority>().is_ok())
}

fn frame_head(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// The representation that replaces an unusable `:authority` of `len`
/// decoded bytes that was represented as `repr`.
fn replacement(repr: Repr, len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let value: Vec<u8> = match repr {
        Repr::Incremental => {
            // Same length, so the entry h2 adds is the size of the client's
            // and both tables evict alike. An entry longer than the table
            // empties it whatever its length, so longer ones are cut.
            let n = len.min(HEADER_TABLE_SIZE);
            if n == 0 {
                return None;
            }
            out.push(0x40 | 1); // incremental indexing, name :authority
            (0..n)
                .map(|i| REPLACEMENT.get(i).copied().unwrap_or(b'-'))
                .collect()
        }
        Repr::Indexed | Repr::NotIndexed => {
            out.push(0x01); // without indexing, name :authority
            REPLACEMENT.to_vec()
        }
    };
    encode_integer(value.len(), 7, 0, &mut out);
    out.extend_from_slice(&value);
    Some(out)
}

impl<S> FixAuthority<S> {
    /// Processes what `inbuf` holds. Returns false when more input is needed.
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
                    self.state = State::Raw;
                    return Ok(true);
                }
                self.out.push_back(self.inbuf.split_to(n).freeze());
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
            State::Payload(_) | State::Raw => Ok(false),
            State::Gather { left, head } => {
                let Some(p) = self.pending.as_mut() else {
                    return Err(io::Error::other("header fragment without a block"));
                };
                if self.inbuf.is_empty() {
                    return Ok(false);
                }
                let n = left.min(self.inbuf.len());
                p.block.extend_from_slice(&self.inbuf[..n]);
                self.inbuf.advance(n);
                if n < left {
                    self.state = State::Gather {
                        left: left - n,
                        head,
                    };
                } else {
                    self.state = State::Frame;
                    self.frame_gathered(head);
                }
                Ok(true)
            }
            State::Frame => {
                if self.inbuf.len() < 9 {
                    return Ok(false);
                }
                let mut head = [0u8; 9];
                head.copy_from_slice(&self.inbuf[..9]);
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let kind = head[3];
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                match (kind, self.pending.as_mut()) {
                    (HEADERS, None) if len <= MAX_HEADER_BLOCK => {
                        self.pending = Some(Pending {
                            stream,
                            end_stream: false,
                            priority: None,
                            block: Vec::with_capacity(len),
                            continuations: 0,
                        });
                    }
                    (HEADERS, None) => {
                        self.hand_over(stream, "header block larger than we buffer");
                        return Ok(true);
                    }
                    (CONTINUATION, Some(p)) if p.stream == stream => {
                        if p.continuations >= MAX_CONTINUATIONS {
                            self.hand_over(stream, "too many CONTINUATION frames");
                            return Ok(true);
                        }
                        if p.block.len() + len > MAX_HEADER_BLOCK {
                            self.hand_over(stream, "header block larger than we buffer");
                            return Ok(true);
                        }
                        p.continuations += 1;
                        p.block.reserve_exact(len);
                    }
                    (HEADERS | CONTINUATION, _) => {
                        self.hand_over(stream, "header frame out of order");
                        return Ok(true);
                    }
                    (_, Some(_)) => {
                        self.hand_over(stream, "frame interleaved with a header block");
                        return Ok(true);
                    }
                    (_, None) => {
                        self.out.push_back(self.inbuf.split_to(9).freeze());
                        self.state = State::Payload(len);
                        return Ok(true);
                    }
                }
                self.inbuf.advance(9);
                self.state = State::Gather { left: len, head };
                Ok(true)
            }
        }
    }

    /// A header frame's payload is in the pending block.
    fn frame_gathered(&mut self, head: [u8; 9]) {
        let flags = head[4];
        if head[3] == HEADERS && !self.strip_headers_frame(flags) {
            // h2 refuses the frame as it came.
            if let Some(p) = self.pending.take() {
                self.out.push_back(Bytes::copy_from_slice(&head));
                self.out.push_back(Bytes::from(p.block));
            }
            self.give_up(
                u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
                "malformed HEADERS frame",
            );
            return;
        }
        if flags & END_HEADERS != 0 {
            self.finish_block();
        }
    }

    /// Removes a HEADERS frame's pad length, priority and padding from the
    /// pending block, keeping the priority. False if the frame is malformed.
    fn strip_headers_frame(&mut self, flags: u8) -> bool {
        let Some(p) = self.pending.as_mut() else {
            return false;
        };
        let mut skip = 0;
        let mut pad = 0;
        if flags & PADDED != 0 {
            let Some(&n) = p.block.first() else {
                return false;
            };
            pad = usize::from(n);
            skip = 1;
        }
        if flags & PRIORITY != 0 {
            let Some(prio) = p.block.get(skip..skip + 5) else {
                return false;
            };
            let mut b = [0u8; 5];
            b.copy_from_slice(prio);
            p.priority = Some(b);
            skip += 5;
        }
        if skip + pad > p.block.len() {
            return false;
        }
        p.block.truncate(p.block.len() - pad);
        p.block.drain(..skip);
        p.end_stream = flags & END_STREAM != 0;
        true
    }

    /// Decodes the complete pending block, replaces an unusable
    /// `:authority`, and hands the block on.
    fn finish_block(&mut self) {
        let Some(mut p) = self.pending.take() else {
            return;
        };
        let mut list = 0usize;
        let mut seen_authority = false;
        let mut fix: Option<(Range<usize>, Repr, usize)> = None;
        let decoded = self.decoder.decode(&p.block, |f| {
            list = list.saturating_add(f.list_size());
            // A request has one :authority; h2 refuses any more as malformed.
            if f.name == b":authority" && !seen_authority {
                seen_authority = true;
                if !valid_authority(f.value) {
                    tracing::debug!(authority = %String::from_utf8_lossy(f.value), "replacing unparsable :authority");
                    fix = Some((f.span, f.repr, f.value.len()));
                }
            }
        });
        let stream = p.stream;
        if let Err(e) = decoded {
            // h2 decodes the same block and answers with its connection error.
            self.emit_block(p, true);
            self.give_up(stream, &format!("HPACK: {e}"));
            return;
        }
        if list > MAX_HEADER_LIST_SIZE && !self.told_oversize {
            self.told_oversize = true;
            tracing::info!(
                stream,
                list_size = list,
                limit = MAX_HEADER_LIST_SIZE,
                "frontend sent a request header list over the limit; refused (431, or GOAWAY past 4 times the limit)"
            );
        }
        if let Some((span, repr, len)) = fix
            && let Some(new) = replacement(repr, len)
        {
            p.block.splice(span, new);
        }
        self.emit_block(p, true);
    }

    /// Hands the rest of the connection to h2 as it came, from the frame
    /// whose head is at the front of `inbuf`; a block gathered so far goes
    /// first, unterminated, so h2 sees the sequence the client sent.
    fn hand_over(&mut self, stream: u32, why: &str) {
        if let Some(p) = self.pending.take() {
            self.emit_block(p, false);
        }
        self.give_up(stream, why);
    }

    fn give_up(&mut self, stream: u32, why: &str) {
        tracing::info!(
            stream,
            reason = why,
            "frontend header input not rewritten; passing the connection to HTTP/2 unchanged"
        );
        self.state = State::Raw;
    }

    /// Queues a header block as a HEADERS frame plus CONTINUATION frames.
    fn emit_block(&mut self, p: Pending, end_headers: bool) {
        let block = Bytes::from(p.block);
        let prio = p.priority.map_or(0, |_| 5);
        let first = (OUT_FRAME - prio).min(block.len());
        let mut flags = if p.end_stream { END_STREAM } else { 0 };
        if p.priority.is_some() {
            flags |= PRIORITY;
        }
        let last_flag = if end_headers { END_HEADERS } else { 0 };
        let single = first == block.len();
        let head = frame_head(
            first + prio,
            HEADERS,
            flags | if single { last_flag } else { 0 },
            p.stream,
        );
        self.out.push_back(Bytes::copy_from_slice(&head));
        if let Some(prio) = p.priority {
            self.out.push_back(Bytes::copy_from_slice(&prio));
        }
        self.out.push_back(block.slice(..first));
        let mut at = first;
        while at < block.len() {
            let n = OUT_FRAME.min(block.len() - at);
            let last = at + n == block.len();
            let head = frame_head(n, CONTINUATION, if last { last_flag } else { 0 }, p.stream);
            self.out.push_back(Bytes::copy_from_slice(&head));
            self.out.push_back(block.slice(at..at + n));
            at += n;
        }
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
        // One call hands over as much as is ready (many small frames at
        // once, as the socket gave them), and reads the socket only when it
        // has nothing yet: a frame at a time cost h2 a read call per frame
        // head and per payload (a PING flood's cost was mostly that).
        let started = buf.filled().len();
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if let Some(front) = me.out.front_mut() {
                let n = front.len().min(buf.remaining());
                buf.put_slice(&front[..n]);
                front.advance(n);
                if front.is_empty() {
                    me.out.pop_front();
                }
                continue;
            }
            if me.step()? {
                continue;
            }
            let left = match me.state {
                State::Payload(left) => left,
                State::Raw => usize::MAX,
                _ => 0,
            };
            if left > 0 && !me.inbuf.is_empty() {
                let n = left.min(me.inbuf.len()).min(buf.remaining());
                buf.put_slice(&me.inbuf[..n]);
                me.inbuf.advance(n);
                if let State::Payload(left) = me.state {
                    me.state = State::Payload(left - n);
                }
                continue;
            }
            if buf.filled().len() > started {
                return Poll::Ready(Ok(()));
            }
            // A connection waiting for its next frame keeps no buffer.
            if me.inbuf.is_empty() && me.inbuf.capacity() > 0 {
                me.inbuf = BytesMut::new();
            }
            if me.out.capacity() > 0 {
                me.out = VecDeque::new();
            }
            if left > 0 {
                // Nothing buffered: read straight into the caller's buffer.
                let limit = left.min(buf.remaining());
                let dst = buf.initialize_unfilled_to(limit);
                let mut sub = ReadBuf::new(dst);
                ready!(Pin::new(&mut me.inner).poll_read(cx, &mut sub))?;
                let n = sub.filled().len();
                buf.advance(n);
                if let State::Payload(left) = me.state {
                    me.state = State::Payload(left - n);
                }
                return Poll::Ready(Ok(()));
            }
            // Frame heads and header blocks only: payloads bypass this buffer.
            // Read on the stack first, so that a connection waiting for its
            // next frame holds no heap buffer.
            let mut chunk = [0u8; READ_CHUNK];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // EOF: whatever is left is handed on as is.
                if let Some(p) = me.pending.take() {
                    me.emit_block(p, false);
                }
                me.state = State::Raw;
                if !me.inbuf.is_empty() {
                    me.out.push_back(me.inbuf.split().freeze());
                }
                if me.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            me.inbuf.extend_from_slice(rb.filled());
        }
    }
}

daemon::forward_async_write!(FixAuthority);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = frame_head(payload.len(), kind, flags, stream).to_vec();
        f.extend_from_slice(payload);
        f
    }

    /// HPACK literal without indexing, new name, no Huffman (RFC 7541 §6.2.2).
    fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.push(0x00);
        for s in [name, value] {
            let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
            out.extend_from_slice(s);
        }
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

    type Block = Vec<(Vec<u8>, Vec<u8>)>;

    /// Decodes every header block with loona (h2's stand-in: an independent
    /// decoder whose table follows only what it is given).
    fn decode_all(mut bytes: &[u8]) -> Vec<Block> {
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
                let mut payload = payload;
                if kind == HEADERS && flags & PADDED != 0 {
                    let pad = usize::from(payload[0]);
                    payload = &payload[1..payload.len() - pad];
                }
                if kind == HEADERS && flags & PRIORITY != 0 {
                    payload = &payload[5..];
                }
                cur.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    blocks.push(d.decode(&cur).unwrap_or_else(|e| panic!("{e:?}")));
                    cur.clear();
                }
            }
            bytes = &bytes[9 + len..];
        }
        blocks
    }

    /// Reads everything `r` yields from `input` (written in `piece`-byte
    /// writes), checking after every read what its header handling holds.
    async fn run_bounded(input: Vec<u8>, piece: usize) -> (Vec<u8>, usize) {
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for chunk in input.chunks(piece) {
                if client.write_all(chunk).await.is_err() {
                    return;
                }
            }
        });
        let mut r = FixAuthority::new(server);
        let (mut out, mut peak) = (Vec::new(), 0);
        loop {
            let mut chunk = [0u8; 4096];
            let n = r.read(&mut chunk).await.unwrap_or_else(|e| panic!("{e}"));
            peak = peak.max(r.buffered());
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        let _ = writer.await;
        (out, peak)
    }

    /// Reads everything with reads of at most `size` bytes: what came out
    /// and how many reads returned data.
    async fn read_in(input: &[u8], size: usize) -> (Vec<u8>, usize) {
        let mut r = FixAuthority::new(std::io::Cursor::new(input.to_vec()));
        let (mut out, mut reads, mut buf) = (Vec::new(), 0, vec![0u8; size]);
        loop {
            let n = r.read(&mut buf).await.unwrap_or_else(|e| panic!("{e}"));
            if n == 0 {
                return (out, reads);
            }
            reads += 1;
            out.extend_from_slice(&buf[..n]);
        }
    }

    /// Small frames the socket gave at once are handed on together, not one
    /// frame head or payload per read: a PING flood cost h2 two read calls
    /// per frame. What comes out does not depend on the read size.
    #[tokio::test]
    async fn small_frames_read_at_once_are_handed_on_together() {
        let ping = frame(0x6, 0, 0, &[7; 8]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(ping.repeat(100));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &block("/tmp/konnectivity.sock"),
        ));
        input.extend(ping.repeat(100));
        let (together, reads) = read_in(&input, 16 << 10).await;
        let (one_by_one, _) = read_in(&input, 1).await;
        assert_eq!(together, one_by_one);
        assert_eq!(decode_all(&together)[0][1].1, REPLACEMENT);
        // One read per READ_CHUNK taken from the socket, and a few more
        // where a header block is rewritten.
        assert!(
            reads <= input.len() / READ_CHUNK + 4,
            "{reads} reads for {} bytes in 202 frames",
            input.len()
        );
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

    /// grpc-go indexes `:authority` (Huffman-coded, incremental indexing)
    /// and refers to it afterwards. Replacing it must leave h2's table in
    /// step with the client's through evictions, for every later block.
    #[tokio::test]
    async fn an_indexing_encoder_stays_in_step_through_evictions() {
        let mut enc = super::super::hpack::testenc::IndexingEncoder::new();
        let path = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";
        let mut input = PREFACE.to_vec();
        let mut sent = Vec::new();
        for i in 0..60u32 {
            // Big values now and then make both tables evict.
            let filler = "v".repeat(if i % 7 == 3 { 1500 } else { 5 });
            let fields: Block = vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), b"/ProxyService/Proxy".to_vec()),
                (b":authority".to_vec(), path.as_bytes().to_vec()),
                (
                    b"x-filler".to_vec(),
                    format!("{}{filler}", i % 5).into_bytes(),
                ),
                (b"user-agent".to_vec(), b"grpc-go/1.72.0".to_vec()),
            ];
            input.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &enc.encode(&fields)));
            sent.push(fields);
        }
        let got = decode_all(&run(input).await);
        assert_eq!(got.len(), sent.len());
        let (mut added, mut referenced) = (0, 0);
        for (mut want, got) in sent.into_iter().zip(got) {
            let fixed = got.iter().find(|(n, _)| n == b":authority").cloned();
            let (_, value) = fixed.unwrap_or_else(|| panic!("no :authority in {got:?}"));
            assert!(
                valid_authority(&value),
                "{:?}",
                String::from_utf8_lossy(&value)
            );
            // A table entry keeps its length; a reference to one becomes a
            // plain literal.
            if value == REPLACEMENT {
                referenced += 1;
            } else {
                assert_eq!(value.len(), path.len(), "an added entry keeps its length");
                added += 1;
            }
            want[3].1 = value;
            assert_eq!(got, want);
        }
        assert!(
            added > 1 && referenced > 10,
            "{added} added, {referenced} referenced"
        );
    }

    /// The HPACK bomb: one 4 KB dynamic-table entry and thousands of
    /// one-byte references to it. Nothing it expands to is kept, and the
    /// block passes on unchanged for h2 to refuse under its own limits.
    #[tokio::test]
    async fn a_header_bomb_costs_no_more_than_its_compressed_block() {
        let mut bomb = vec![0x40];
        let _ = loona_hpack::encoder::encode_integer_into(4, 7, 0, &mut bomb);
        bomb.extend_from_slice(b"x-bb");
        let _ = loona_hpack::encoder::encode_integer_into(4000, 7, 0, &mut bomb);
        bomb.extend(std::iter::repeat_n(b'a', 4000));
        bomb.extend(std::iter::repeat_n(
            0x80 | 62,
            MAX_HEADER_BLOCK - bomb.len(),
        ));
        let mut input = PREFACE.to_vec();
        // Cut as a client would: HEADERS plus CONTINUATION frames.
        let pieces: Vec<&[u8]> = bomb.chunks(OUT_FRAME).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let last = i + 1 == pieces.len();
            input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 1, piece));
        }
        let (out, peak) = run_bounded(input.clone(), 1000).await;
        assert!(out == input, "passed on as it came");
        // The block itself (32 KiB) plus one read buffer: well under the
        // 64 KiB of decode state a connection may hold.
        assert!(peak <= MAX_HEADER_BLOCK + 2 * READ_CHUNK, "peak {peak}");

        // Twice as large: handed to h2 as it came once it outgrows the bound.
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &bomb[..OUT_FRAME]));
        for _ in 0..4 {
            input.extend(frame(CONTINUATION, 0, 1, &bomb[OUT_FRAME..2 * OUT_FRAME]));
        }
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x80 | 62]));
        let (out, peak) = run_bounded(input.clone(), 1000).await;
        assert!(out == input, "passed on as it came");
        assert!(peak <= MAX_HEADER_BLOCK + 2 * READ_CHUNK, "peak {peak}");
    }

    /// (kind, flags, stream, payload) of every frame after the preface.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        assert!(bytes.is_empty(), "a frame was cut");
        out
    }

    #[tokio::test]
    async fn a_continuation_flood_is_handed_on_not_buffered() {
        let mut input = PREFACE.to_vec();
        let first = block("/tmp/s.sock");
        input.extend(frame(HEADERS, 0, 1, &first));
        for _ in 0..10_000 {
            input.extend(frame(CONTINUATION, 0, 1, &[]));
        }
        let (out, peak) = run_bounded(input, 4096).await;
        let got = frames(&out);
        // The fragments gathered so far go on as one unterminated HEADERS
        // frame, unchanged; every frame after the bound as it came.
        assert_eq!(got[0], (HEADERS, 0, 1, first));
        assert_eq!(got.len(), 1 + 10_000 - MAX_CONTINUATIONS);
        assert!(got[1..].iter().all(|f| *f == (CONTINUATION, 0, 1, vec![])));
        assert!(peak <= 4 * READ_CHUNK, "peak {peak}");
    }

    #[tokio::test]
    async fn padding_and_priority_are_removed_and_kept() {
        let b = block("/tmp/s.sock");
        let mut payload = vec![3]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(&b);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM | PADDED | PRIORITY,
            1,
            &payload,
        ));
        let out = run(input).await;
        let head = &out[PREFACE.len()..PREFACE.len() + 9];
        assert_eq!(head[3], HEADERS);
        assert_eq!(head[4], END_HEADERS | END_STREAM | PRIORITY);
        assert_eq!(
            &out[PREFACE.len() + 9..PREFACE.len() + 14],
            &[0, 0, 0, 0, 16]
        );
        let blocks = decode_all(&out);
        assert!(blocks[0].contains(&(b":authority".to_vec(), b"localhost".to_vec())));
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_next_frame_holds_no_buffers() {
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
        assert!(r.pending.is_none());
    }

    #[tokio::test]
    async fn garbage_is_handed_on_for_h2_to_refuse() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        input.extend(frame(HEADERS, END_HEADERS, 3, &block("/tmp/s.sock")));
        // Undecodable: from there on everything goes to h2 as it came.
        assert_eq!(run(input.clone()).await, input);
        // Not HTTP/2 at all: passed on for h2 to refuse.
        let input = frame(CONTINUATION, 0, 1, b"x");
        assert_eq!(run(input.clone()).await, input);
        // Out of order, and a HEADERS frame whose padding exceeds it.
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b"x"));
        assert_eq!(run(input.clone()).await, input);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82]));
        assert_eq!(run(input.clone()).await, input);
    }
}
