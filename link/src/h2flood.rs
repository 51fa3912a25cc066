//! Bounds what an HTTP/2 client's control frames cost a server connection:
//! SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM, GOAWAY, DATA with
//! nothing in it and frames of unknown types are each cheap for the client
//! to send and cost the server a wake-up, a parse and often an answer (a
//! SETTINGS or PING ACK, a walk over every stream for a changed initial
//! window). Past a rate the connection ends with GOAWAY
//! `ENHANCE_YOUR_CALM`, as h2 ends a rapid-reset or CONTINUATION flood.
//!
//! Why a wrapper on the transport: the `h2` crate (under hyper too) limits
//! reset and CONTINUATION floods but none of these (it answers every PING
//! and SETTINGS and applies every WINDOW_UPDATE; its keepalive knobs only
//! concern PINGs it sends), and hyper exposes no frame hook. Frame headers
//! are 9 bytes at known offsets, so counting them as they pass costs little
//! and needs no second HTTP/2 parser: [`FloodGuard`] reads the client's
//! frame headers (skipping payloads), and the server's on the way out, to
//! credit what legitimate traffic causes. When the budget is spent it cuts
//! what it hands h2 at the offending frame, writes its own GOAWAY at a frame
//! boundary of the outgoing bytes (dropping whatever h2 writes after it),
//! and fails the read, so h2 closes the connection: abrupt, but the client
//! is told why.
//!
//! The budget ([`Limits`], from `crate::limits`): a burst of
//! [`FLOOD_BURST`] control frames, refilled at [`FLOOD_RATE`] per second and
//! by [`FLOOD_CREDIT`] for every
//! DATA frame with data or HEADERS frame either way (a peer's WINDOW_UPDATEs
//! and BDP PINGs follow the data), and by one for every PING or SETTINGS the
//! server sends (their ACKs). A SETTINGS frame costs [`SETTINGS_COST`],
//! and one more per 8 settings in it.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::limits::{
    H2_CONTROL_BURST as FLOOD_BURST, H2_CONTROL_CREDIT as FLOOD_CREDIT,
    H2_CONTROL_RATE as FLOOD_RATE, H2_SETTINGS_COST as SETTINGS_COST,
};
/// How long the GOAWAY may take to go out to a client that does not read.
const GOAWAY_PATIENCE: Duration = Duration::from_secs(1);

const PREFACE_LEN: usize = 24;
const HEADER_LEN: usize = 9;
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const CONTINUATION: u8 = 9;
const FLAG_ACK: u8 = 0x1;
const FLAG_PADDED: u8 = 0x8;
/// HTTP/2's error code for "the peer is generating excessive load".
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The budget of one connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub burst: f64,
    pub rate: f64,
    pub credit: f64,
    /// What a SETTINGS frame (not an ACK) spends.
    pub settings: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            burst: FLOOD_BURST,
            rate: FLOOD_RATE,
            credit: FLOOD_CREDIT,
            settings: SETTINGS_COST,
        }
    }
}

/// Where a parser is in a stream of frames.
#[derive(Debug, Default)]
struct Frames {
    /// Preface bytes still to skip (the client's, inbound only).
    preface: usize,
    header: [u8; HEADER_LEN],
    have: usize,
    /// Payload bytes still to skip.
    payload: usize,
    /// A padded DATA frame whose pad length (its first payload byte) is
    /// still to come, and its length.
    padded_data: Option<usize>,
}

/// A frame header as it was completed.
#[derive(Debug, Clone, Copy)]
struct Header {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

/// What [`Frames::feed`] found.
enum Event {
    Header(Header),
    /// The data length of a padded DATA frame, once its pad length is in.
    PaddedData(usize),
}

impl Frames {
    /// Feeds bytes; calls `on` for every frame header completed (with the
    /// offset in `bytes` where that header began, or 0 if earlier); stops
    /// and returns that offset when `on` says so.
    fn feed(&mut self, bytes: &[u8], mut on: impl FnMut(Event) -> bool) -> Option<usize> {
        let mut i = 0;
        // Where the frame whose payload comes next began in `bytes`.
        let mut frame_start = 0;
        while i < bytes.len() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len() - i);
                self.preface -= n;
                i += n;
                continue;
            }
            if let Some(len) = self.padded_data.take() {
                let pad = usize::from(bytes[i]);
                self.payload -= 1;
                i += 1;
                if on(Event::PaddedData(len.saturating_sub(1 + pad))) {
                    return Some(frame_start);
                }
                continue;
            }
            if self.payload > 0 {
                let n = self.payload.min(bytes.len() - i);
                self.payload -= n;
                i += n;
                continue;
            }
            let start = i.saturating_sub(self.have);
            let n = (HEADER_LEN - self.have).min(bytes.len() - i);
            self.header[self.have..self.have + n].copy_from_slice(&bytes[i..i + n]);
            self.have += n;
            i += n;
            if self.have < HEADER_LEN {
                continue;
            }
            self.have = 0;
            let h = &self.header;
            let header = Header {
                len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
                kind: h[3],
                flags: h[4],
                stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            };
            self.payload = header.len;
            if header.kind == DATA && header.flags & FLAG_PADDED != 0 && header.len > 0 {
                self.padded_data = Some(header.len);
            }
            frame_start = start;
            if on(Event::Header(header)) {
                return Some(start);
            }
        }
        None
    }
}

/// The connection's budget.
#[derive(Debug)]
struct Budget {
    limits: Limits,
    tokens: f64,
    refilled: Instant,
}

impl Budget {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.add(elapsed * self.limits.rate);
    }

    fn add(&mut self, n: f64) {
        self.tokens = (self.tokens + n).min(self.limits.burst);
    }

    /// Takes `n`; false once the budget is spent.
    fn spend(&mut self, n: f64) -> bool {
        self.tokens -= n;
        self.tokens >= 0.0
    }
}

/// What the client's frame costs (0: the work it asks for is the point).
fn cost(h: &Header, limits: &Limits) -> f64 {
    match h.kind {
        // A padded one's data length is known only with its pad length.
        DATA if h.len > 0 => 0.0,
        HEADERS | CONTINUATION => 0.0,
        // An ACK answers one of ours, which credited it.
        SETTINGS if h.flags & FLAG_ACK != 0 => 1.0,
        SETTINGS => limits.settings + (h.len / 6 / 8) as f64,
        _ => 1.0,
    }
}

/// The GOAWAY sent when the budget is spent.
struct Goaway {
    frame: Vec<u8>,
    written: usize,
    flushed: bool,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

fn goaway_frame(last_stream: u32) -> Vec<u8> {
    const DEBUG: &[u8] = b"control frame flood";
    let len = 8 + DEBUG.len();
    let mut f = Vec::with_capacity(HEADER_LEN + len);
    f.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[7, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&last_stream.to_be_bytes());
    f.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    f.extend_from_slice(DEBUG);
    f
}

/// An HTTP/2 server connection's transport, counting the client's control
/// frames (see the module's comment).
pub struct FloodGuard<IO> {
    io: IO,
    inbound: Frames,
    outbound: Frames,
    budget: Budget,
    /// The highest stream the client opened (the GOAWAY's last stream).
    last_stream: u32,
    /// Set once the budget is spent.
    goaway: Option<Goaway>,
    /// The GOAWAY could not go out at a frame boundary: the connection is
    /// just closed.
    abrupt: bool,
    /// Told once when the budget is spent (e.g. to slow the client's address).
    on_flood: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl<IO> FloodGuard<IO> {
    /// Guards a server connection whose client preface is still to be read.
    pub fn server(io: IO) -> Self {
        Self::with_limits(io, Limits::default())
    }

    pub fn with_limits(io: IO, limits: Limits) -> Self {
        FloodGuard {
            io,
            inbound: Frames {
                preface: PREFACE_LEN,
                ..Frames::default()
            },
            outbound: Frames::default(),
            budget: Budget {
                limits,
                tokens: limits.burst,
                refilled: Instant::now(),
            },
            last_stream: 0,
            goaway: None,
            abrupt: false,
            on_flood: None,
        }
    }

    /// Runs `f` when the connection is cut for a flood.
    pub fn on_flood(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_flood = Some(Box::new(f));
        self
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Whether the connection was cut for a flood.
    pub fn flooded(&self) -> bool {
        self.goaway.is_some() || self.abrupt
    }

    /// Counts what arrived; the offset of the frame that spent the budget.
    fn scan_in(&mut self, bytes: &[u8]) -> Option<usize> {
        self.budget.refill(Instant::now());
        let (budget, last_stream) = (&mut self.budget, &mut self.last_stream);
        self.inbound.feed(bytes, |e| match e {
            Event::Header(h) => {
                if h.kind == HEADERS {
                    *last_stream = (*last_stream).max(h.stream);
                    budget.add(budget.limits.credit);
                } else if h.kind == DATA && h.len > 0 && h.flags & FLAG_PADDED == 0 {
                    budget.add(budget.limits.credit);
                }
                let c = cost(&h, &budget.limits);
                !budget.spend(c)
            }
            Event::PaddedData(0) => !budget.spend(1.0),
            Event::PaddedData(_) => {
                budget.add(budget.limits.credit);
                false
            }
        })
    }

    /// Counts what the server wrote (answers the client's frames earn).
    fn scan_out(&mut self, bytes: &[u8]) {
        let budget = &mut self.budget;
        self.outbound.feed(bytes, |e| {
            if let Event::Header(h) = e {
                let earned = match h.kind {
                    DATA if h.len > 0 => budget.limits.credit,
                    HEADERS => budget.limits.credit,
                    PING | SETTINGS if h.flags & FLAG_ACK == 0 => 1.0,
                    _ => 0.0,
                };
                budget.add(earned);
            }
            false
        });
    }

    fn trip(&mut self) {
        if self.goaway.is_some() || self.abrupt {
            return;
        }
        note_flood();
        if let Some(f) = self.on_flood.take() {
            f();
        }
        let at_boundary = self.outbound.have == 0
            && self.outbound.payload == 0
            && self.outbound.padded_data.is_none();
        if !at_boundary {
            self.abrupt = true;
            return;
        }
        self.goaway = Some(Goaway {
            frame: goaway_frame(self.last_stream),
            written: 0,
            flushed: false,
            deadline: Box::pin(tokio::time::sleep(GOAWAY_PATIENCE)),
        });
    }
}

/// Logs floods at most every 10 s (a client that reconnects to flood again
/// must not flood the log), with how many there were.
fn note_flood() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SINCE_LOGGED: AtomicU64 = AtomicU64::new(0);
    static LOGGED_AT: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    let n = SINCE_LOGGED.fetch_add(1, Ordering::Relaxed) + 1;
    let Ok(mut at) = LOGGED_AT.lock() else {
        return;
    };
    let now = std::time::Instant::now();
    if at.is_some_and(|t| now.duration_since(t) < Duration::from_secs(10)) {
        return;
    }
    *at = Some(now);
    SINCE_LOGGED.store(0, Ordering::Relaxed);
    tracing::warn!(
        connections = n,
        "HTTP/2 control frame flood (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM or empty DATA past the rate): connection closed with GOAWAY ENHANCE_YOUR_CALM"
    );
}

fn flood_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "HTTP/2 control frame flood: GOAWAY ENHANCE_YOUR_CALM",
    )
}

impl<IO: AsyncWrite + Unpin> FloodGuard<IO> {
    /// Sends the GOAWAY; ready once it is out, or given up on.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(g) = &mut self.goaway else {
            return Poll::Ready(());
        };
        if g.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        while g.written < g.frame.len() {
            match Pin::new(&mut self.io).poll_write(cx, &g.frame[g.written..]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(n)) => g.written += n,
                Poll::Pending => return Poll::Pending,
            }
        }
        if !g.flushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(_) => g.flushed = true,
            }
        }
        Poll::Ready(())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FloodGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.flooded() {
            ready!(me.poll_goaway(cx));
            return Poll::Ready(Err(flood_error()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut me.io).poll_read(cx, buf))?;
        let Some(cut) = me.scan_in(&buf.filled()[before..]) else {
            return Poll::Ready(Ok(()));
        };
        buf.set_filled(before + cut);
        me.trip();
        if cut > 0 {
            // What came before the offending frame is h2's; the next read
            // fails.
            return Poll::Ready(Ok(()));
        }
        ready!(me.poll_goaway(cx));
        Poll::Ready(Err(flood_error()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FloodGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.flooded() {
            // Nothing of h2's goes out after the GOAWAY.
            ready!(me.poll_goaway(cx));
            return Poll::Ready(Ok(buf.len()));
        }
        let n = ready!(Pin::new(&mut me.io).poll_write(cx, buf))?;
        me.scan_out(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.flooded() {
            ready!(me.poll_goaway(cx));
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        let n = ready!(Pin::new(&mut me.io).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(b.len());
            me.scan_out(&b[..take]);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.flooded() {
            ready!(me.poll_goaway(cx));
        }
        Pin::new(&mut me.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.flooded() {
            ready!(me.poll_goaway(cx));
        }
        Pin::new(&mut me.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// Reads through the guard until it fails; returns what it passed on.
    async fn passed(input: Vec<u8>, limits: Limits) -> (Vec<u8>, Vec<u8>, io::Error) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client
            .write_all(&input)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut guard = FloodGuard::with_limits(server, limits);
        let mut got = Vec::new();
        let err = loop {
            let mut buf = [0u8; 4096];
            match guard.read(&mut buf).await {
                Ok(0) => panic!("end of stream before the flood was seen"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        drop(guard);
        let mut answer = Vec::new();
        let _ = client.read_to_end(&mut answer).await;
        (got, answer, err)
    }

    fn limits(burst: f64) -> Limits {
        Limits {
            burst,
            rate: 0.0,
            credit: 4.0,
            settings: 1.0,
        }
    }

    #[tokio::test]
    async fn each_control_frame_kind_is_cut_at_the_frame_that_spends_the_budget() {
        let floods: [(&str, Vec<u8>); 7] = [
            ("SETTINGS", frame(SETTINGS, 0, 0, &[])),
            ("PING", frame(PING, 0, 0, &[0; 8])),
            ("WINDOW_UPDATE", frame(8, 0, 0, &1u32.to_be_bytes())),
            ("PRIORITY", frame(2, 0, 3, &[0, 0, 0, 1, 16])),
            ("RST_STREAM", frame(3, 0, 1, &[0, 0, 0, 8])),
            ("empty DATA", frame(DATA, 0, 1, &[])),
            (
                "padding-only DATA",
                frame(DATA, FLAG_PADDED, 1, &[3, 0, 0, 0]),
            ),
        ];
        for (name, one) in floods {
            let mut input = PREFACE.to_vec();
            let headers = frame(HEADERS, 0x4, 1, &[0x82]);
            input.extend_from_slice(&headers);
            for _ in 0..20 {
                input.extend_from_slice(&one);
            }
            // A burst of 10 (what the HEADERS earns cannot raise it past).
            let (got, answer, err) = passed(input, limits(10.0)).await;
            assert_eq!(
                got.len(),
                PREFACE.len() + headers.len() + 10 * one.len(),
                "{name}: passed on up to the 11th frame, not past it"
            );
            assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted, "{name}");
            assert_eq!(answer[3], 7, "{name}: a GOAWAY");
            assert_eq!(&answer[9..13], &1u32.to_be_bytes(), "{name}: last stream");
            assert_eq!(
                &answer[13..17],
                &ENHANCE_YOUR_CALM.to_be_bytes(),
                "{name}: ENHANCE_YOUR_CALM"
            );
        }
    }

    /// The flood hook runs once, when the budget is spent, not before.
    #[tokio::test]
    async fn the_flood_hook_runs_once_when_the_budget_is_spent() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let c = calls.clone();
        let mut guard = FloodGuard::with_limits(server, limits(10.0)).on_flood(move || {
            c.fetch_add(1, Ordering::Relaxed);
        });
        let ping = frame(PING, 0, 0, &[0; 8]);
        let mut input = PREFACE.to_vec();
        for _ in 0..10 {
            input.extend_from_slice(&ping);
        }
        client
            .write_all(&input)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = vec![0u8; input.len()];
        guard
            .read_exact(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(calls.load(Ordering::Relaxed), 0, "within the burst");
        client
            .write_all(&ping)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..3 {
            assert!(guard.read(&mut buf).await.is_err());
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "once, however often it is read"
        );
    }

    #[tokio::test]
    async fn a_settings_frame_spends_its_weight_and_an_ack_spends_one() {
        let weighted = Limits {
            settings: 5.0,
            ..limits(22.0)
        };
        let one = frame(SETTINGS, 0, 0, &[]);
        let ack = frame(SETTINGS, FLAG_ACK, 0, &[]);
        let mut input = PREFACE.to_vec();
        // 2 ACKs (2) and 4 SETTINGS (20) spend 22: the fifth SETTINGS trips.
        input.extend_from_slice(&ack);
        input.extend_from_slice(&ack);
        for _ in 0..10 {
            input.extend_from_slice(&one);
        }
        let (got, answer, err) = passed(input, weighted).await;
        assert_eq!(got.len(), PREFACE.len() + 2 * ack.len() + 4 * one.len());
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(&answer[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        // The defaults: a SETTINGS flood is sent away after a tenth of the
        // frames of a PING flood.
        let d = Limits::default();
        assert_eq!((d.burst / d.settings) as usize, 100);
    }

    /// Data frames, headers, large SETTINGS split across reads, and what the
    /// server sends are all followed across arbitrary read boundaries.
    #[tokio::test]
    async fn data_earns_credit_and_frames_split_across_reads_are_followed() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut guard = FloodGuard::with_limits(server, limits(2.0));
        let feed = tokio::spawn(async move {
            let mut input = PREFACE.to_vec();
            for i in 0..50u32 {
                input.extend_from_slice(&frame(DATA, 0, 1, &[i as u8; 100]));
                input.extend_from_slice(&frame(8, 0, 0, &1u32.to_be_bytes()));
                input.extend_from_slice(&frame(PING, 0, 0, &[0; 8]));
            }
            // 48 settings: 7 frames' worth.
            input.extend_from_slice(&frame(SETTINGS, 0, 0, &[0; 6 * 48]));
            // The guard stops reading at the flood.
            let _ = client.write_all(&input).await;
        });
        let mut total = 0;
        let err = loop {
            let mut buf = [0u8; 7];
            match guard.read(&mut buf).await {
                Ok(0) => panic!("end of stream"),
                Ok(n) => total += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        // Up to the large SETTINGS, which spent what the data had earned
        // (its header's first bytes, read with the frame before, may have
        // gone to h2 already).
        let before = PREFACE.len() + 50 * (109 + 13 + 17);
        assert!(
            (before..before + HEADER_LEN).contains(&total),
            "{total} bytes passed on, want {before} and part of a header"
        );
        drop(feed);

        // The server's PINGs earn their ACKs.
        let (_client, server) = tokio::io::duplex(1 << 16);
        let mut guard = FloodGuard::with_limits(server, limits(0.0));
        guard
            .write_all(&frame(PING, 0, 0, &[0; 8]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(guard.budget.tokens, 0.0, "capped at the burst");
        let mut guard = FloodGuard::with_limits(guard.io, limits(5.0));
        guard.budget.tokens = 0.0;
        guard
            .write_all(&frame(PING, 0, 0, &[0; 8]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(guard.budget.tokens, 1.0);
    }
}
