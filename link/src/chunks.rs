//! Reads a byte stream in chunks whose buffers exist only while data is in
//! flight: a connection that waits for its peer holds no read buffer.
//!
//! A read that must wait (`Pending`) is attempted with a per-thread scratch
//! buffer and its bytes copied out into a chunk of their exact size; once
//! reads come back full, they go straight into a chunk of their own (no
//! copy), grown while they keep filling it. A chunk handed out never holds
//! more than twice its length, so what it costs while queued is what it
//! carries.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

/// Largest chunk read at once.
pub const MAX_CHUNK: usize = 64 << 10;
/// Smallest buffer a direct read starts with.
const MIN_CHUNK: usize = 4 << 10;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Adaptive chunk sizing for one stream.
#[derive(Debug)]
pub struct ChunkReader {
    /// Size of the next direct read; 0 while reads go through the scratch.
    direct: usize,
    /// Largest chunk this reader hands out.
    max: usize,
}

impl Default for ChunkReader {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkReader {
    pub fn new() -> Self {
        Self::with_max(MAX_CHUNK)
    }

    /// A reader whose chunks are at most `max` bytes (1 KiB to [`MAX_CHUNK`]).
    pub fn with_max(max: usize) -> Self {
        ChunkReader {
            direct: 0,
            max: max.clamp(1024, MAX_CHUNK),
        }
    }

    /// The next chunk of `rd`; empty at EOF.
    pub async fn read<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> io::Result<Bytes> {
        poll_fn(|cx| self.poll_read(cx, Pin::new(&mut *rd))).await
    }

    /// The next chunk of `rd`, of at most `limit` bytes (at least 1 KiB):
    /// for a caller that will hold the chunk while it waits to pass it on,
    /// and so reads no more than it can soon pass on.
    pub async fn read_at_most<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        limit: usize,
    ) -> io::Result<Bytes> {
        poll_fn(|cx| self.poll_read_at_most(cx, Pin::new(&mut *rd), limit)).await
    }

    pub fn poll_read<R: AsyncRead>(
        &mut self,
        cx: &mut Context<'_>,
        rd: Pin<&mut R>,
    ) -> Poll<io::Result<Bytes>> {
        self.poll_read_at_most(cx, rd, MAX_CHUNK)
    }

    pub fn poll_read_at_most<R: AsyncRead>(
        &mut self,
        cx: &mut Context<'_>,
        rd: Pin<&mut R>,
        limit: usize,
    ) -> Poll<io::Result<Bytes>> {
        let cap = limit.clamp(1024, self.max);
        if self.direct > 0 {
            let want = self.direct.min(cap);
            let mut buf = BytesMut::with_capacity(want);
            match tokio_util::io::poll_read_buf(rd, cx, &mut buf) {
                Poll::Ready(Ok(n)) => {
                    if n >= want {
                        // A read capped below its size says nothing about
                        // the size to read next.
                        if want == self.direct {
                            self.direct = (want * 2).min(self.max);
                        }
                    } else if n < want / 2 {
                        self.direct = if n < MIN_CHUNK.min(self.max) {
                            0
                        } else {
                            want / 2
                        };
                        // Do not let a few bytes keep a large buffer alive.
                        return Poll::Ready(Ok(Bytes::copy_from_slice(&buf)));
                    }
                    Poll::Ready(Ok(buf.freeze()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => {
                    // The peer went quiet: wait without a buffer.
                    self.direct = 0;
                    Poll::Pending
                }
            }
        } else {
            let chunk = ready!(SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < MAX_CHUNK {
                    s.resize(MAX_CHUNK, 0);
                }
                let mut rb = ReadBuf::new(&mut s[..cap]);
                match rd.poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => Poll::Ready(Ok(Bytes::copy_from_slice(rb.filled()))),
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }))?;
            // Data that was there at once and filled a good part of the
            // scratch: a transfer is under way, read directly from now on.
            if chunk.len() >= cap / 2 {
                self.direct = self.max;
            }
            Poll::Ready(Ok(chunk))
        }
    }

    /// Whether the next read goes straight into a buffer of its own.
    pub fn is_direct(&self) -> bool {
        self.direct > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn bulk_reads_go_direct_and_a_quiet_peer_holds_nothing() {
        let (mut w, mut r) = tokio::io::duplex(1 << 20);
        let mut cr = ChunkReader::new();
        w.write_all(&vec![7u8; 1 << 20])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut total = 0;
        let mut direct_reads = 0;
        while total < 1 << 20 {
            let was_direct = cr.is_direct();
            let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.is_empty());
            direct_reads += usize::from(was_direct);
            total += c.len();
        }
        assert!(direct_reads >= 8, "{direct_reads} direct reads");
        // Nothing more to read: the pending read leaves no buffer behind and
        // the next read goes through the scratch.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(cr.poll_read(&mut cx, Pin::new(&mut r)).is_pending());
        assert!(!cr.is_direct());
        // A few bytes come back in a chunk of their size.
        w.write_all(b"hi").await.unwrap_or_else(|e| panic!("{e}"));
        let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&c[..], b"hi");
        drop(w);
        let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(c.is_empty(), "EOF");
    }

    #[tokio::test]
    async fn a_capped_read_takes_no_more_than_its_cap_and_keeps_the_pace() {
        let (mut w, mut r) = tokio::io::duplex(1 << 20);
        let mut cr = ChunkReader::new();
        w.write_all(&vec![3u8; 4 * MAX_CHUNK])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Through the scratch: the cap holds, and a full capped read still
        // shows a transfer under way.
        let c = cr
            .read_at_most(&mut r, 16 << 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.len(), 16 << 10);
        assert!(cr.is_direct());
        // Direct: the buffer is no larger than the cap either.
        let c = cr
            .read_at_most(&mut r, 8 << 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.len(), 8 << 10);
        assert!(Vec::from(c).capacity() <= 8 << 10);
        // Below 1 KiB the cap is 1 KiB (a read must make progress).
        let c = cr
            .read_at_most(&mut r, 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.len(), 1024);
        // Uncapped again, reads grow back to full chunks.
        let mut largest = 0;
        for _ in 0..4 {
            let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
            largest = largest.max(c.len());
        }
        assert_eq!(largest, MAX_CHUNK);
    }

    #[tokio::test]
    async fn a_short_direct_read_is_copied_out_of_its_large_buffer() {
        let (mut w, mut r) = tokio::io::duplex(1 << 20);
        let mut cr = ChunkReader::new();
        w.write_all(&vec![1u8; MAX_CHUNK])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.len(), MAX_CHUNK);
        assert!(cr.is_direct());
        w.write_all(b"tail").await.unwrap_or_else(|e| panic!("{e}"));
        let c = cr.read(&mut r).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&c[..], b"tail");
        // `Bytes` from a short read owns exactly its bytes: converting it
        // back to a `Vec` keeps the capacity it was allocated with.
        assert!(Vec::from(c).capacity() < 64);
    }
}
