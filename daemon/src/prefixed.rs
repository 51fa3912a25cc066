//! An I/O object that first replays bytes already read from it. Protocol
//! detection (h2 preface, ClientHello, CONNECT head) has to read before it
//! knows who should handle the connection; the handler must still see those
//! bytes first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};

#[derive(Debug)]
pub struct PrefixedIo<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> PrefixedIo<T> {
    pub fn new(prefix: Bytes, inner: T) -> Self {
        PrefixedIo { prefix, inner }
    }

    /// Bytes not yet replayed.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    pub fn into_inner(self) -> (Bytes, T) {
        (self.prefix, self.inner)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PrefixedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

crate::forward_async_write!(PrefixedIo);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn replays_prefix_then_reads_inner() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut io = PrefixedIo::new(Bytes::from_static(b"hello "), a);
        b.write_all(b"world")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(b);
        let mut out = String::new();
        io.read_to_string(&mut out)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, "hello world");
    }

    #[tokio::test]
    async fn small_reads_split_the_prefix() {
        let (a, _b) = tokio::io::duplex(64);
        let mut io = PrefixedIo::new(Bytes::from_static(b"abc"), a);
        let mut one = [0u8; 2];
        let n = io.read(&mut one).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&one[..n], b"ab");
        assert_eq!(io.prefix(), b"c");
    }
}
