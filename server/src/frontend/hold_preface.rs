//! Holds what the server writes on a gRPC frontend connection (h2's
//! connection preface: its SETTINGS) until the client's connection preface
//! has been read, so that it leaves in one write with h2's answer to the
//! client's SETTINGS instead of in a write of its own.
//!
//! kube-apiserver opens a new HTTP/2 connection per dial, so every write
//! saved here is a syscall and a wake-up of the client saved per dial
//! (BENCHMARKS.md, P4). A client sends its preface without waiting for the
//! server's (RFC 9113 §3.4), so nothing waits on what is held; and h2
//! flushes whenever it has read all there is, so the held bytes go out at
//! the latest when h2 next waits for input after the client's preface.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client's connection preface: `PRI * HTTP/2.0…`, 24 bytes.
const CLIENT_PREFACE: usize = 24;

/// At most this much is held; a larger first write goes out at once. h2's
/// own preface (SETTINGS and a WINDOW_UPDATE) is well under 100 bytes.
const MAX_HELD: usize = 1024;

pub struct HoldPreface<S> {
    inner: S,
    /// Bytes of the client's preface not read yet; writes are held until 0.
    preface_left: usize,
    /// Written by h2 while holding, not sent yet from `sent` on.
    held: Vec<u8>,
    sent: usize,
}

impl<S> HoldPreface<S> {
    pub fn new(inner: S) -> Self {
        HoldPreface {
            inner,
            preface_left: CLIENT_PREFACE,
            held: Vec::new(),
            sent: 0,
        }
    }

    fn holding(&self) -> bool {
        self.preface_left > 0
    }
}

impl<S: AsyncWrite + Unpin> HoldPreface<S> {
    /// Sends what is held, together with `bufs`. Returns how many bytes of
    /// `bufs` went out with it (0 when nothing was held).
    fn poll_send_held(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        while self.sent < self.held.len() {
            let pending = &self.held[self.sent..];
            let mut iov = Vec::with_capacity(bufs.len() + 1);
            iov.push(IoSlice::new(pending));
            iov.extend(bufs.iter().map(|b| IoSlice::new(b)));
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &iov))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n > pending.len() {
                let with = n - pending.len();
                self.held = Vec::new();
                self.sent = 0;
                return Poll::Ready(Ok(with));
            }
            self.sent += n;
        }
        self.held = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(0))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HoldPreface<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.holding() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        let r = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
        let n = buf.filled().len() - before;
        // An error or the end of input ends the wait too: h2 answers or
        // closes, and whatever it writes then goes out.
        self.preface_left = match (&r, n) {
            (Ok(()), n) if n > 0 => self.preface_left.saturating_sub(n),
            _ => 0,
        };
        Poll::Ready(r)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HoldPreface<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if me.holding() && me.held.len() + total <= MAX_HELD {
            for b in bufs {
                me.held.extend_from_slice(b);
            }
            return Poll::Ready(Ok(total));
        }
        if me.sent < me.held.len() {
            let with = ready!(me.poll_send_held(cx, bufs))?;
            if with > 0 || total == 0 {
                return Poll::Ready(Ok(with));
            }
        }
        Pin::new(&mut me.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.holding() {
            // Held on purpose: see the module comment.
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_send_held(cx, &[]))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_held(cx, &[]))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A socket that records each write call's bytes.
    #[derive(Default)]
    struct Recorder {
        input: VecDeque<u8>,
        writes: Vec<Vec<u8>>,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = buf.remaining().min(self.input.len());
            let bytes: Vec<u8> = self.input.drain(..n).collect();
            buf.put_slice(&bytes);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len();
            self.writes.push(all);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn with_input(input: &[u8]) -> HoldPreface<Recorder> {
        HoldPreface::new(Recorder {
            input: input.iter().copied().collect(),
            writes: Vec::new(),
        })
    }

    #[tokio::test]
    async fn server_preface_leaves_with_the_first_write_after_the_client_preface() {
        let mut s = with_input(&[PREFACE, b"client settings"].concat());
        s.write_all(b"server settings")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            s.inner.writes.is_empty(),
            "nothing goes out before the client's preface"
        );
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&buf[..n], [PREFACE, b"client settings"].concat().as_slice());
        s.write_all(b"+ack").await.unwrap_or_else(|e| panic!("{e}"));
        s.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.inner.writes, vec![b"server settings+ack".to_vec()]);
        s.write_all(b"later")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.inner.writes.len(),
            2,
            "later writes pass straight through"
        );
        assert_eq!(s.inner.writes[1], b"later");
    }

    #[tokio::test]
    async fn a_flush_after_the_client_preface_sends_what_is_held() {
        let mut s = with_input(PREFACE);
        s.write_all(b"server settings")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = [0u8; 10];
        // Part of the preface: still holding.
        s.read_exact(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert!(s.inner.writes.is_empty());
        let mut rest = [0u8; 14];
        s.read_exact(&mut rest)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.inner.writes, vec![b"server settings".to_vec()]);
    }

    #[tokio::test]
    async fn the_end_of_input_ends_the_hold() {
        let mut s = with_input(b"PRI");
        s.write_all(b"server settings")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.inner.writes, vec![b"server settings".to_vec()]);
    }

    #[tokio::test]
    async fn a_write_over_the_bound_is_not_held() {
        let mut s = with_input(b"");
        s.write_all(b"small")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let big = vec![7u8; MAX_HELD];
        s.write_all(&big).await.unwrap_or_else(|e| panic!("{e}"));
        let sent: Vec<u8> = s.inner.writes.concat();
        assert_eq!(sent, [b"small".as_slice(), &big].concat());
        assert!(s.held.is_empty());
    }
}
