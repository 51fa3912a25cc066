//! Seeing that a client has gone while nothing is read from its connection.
//!
//! A tunnel whose destination stops reading stops reading its client (the
//! bytes wait in the client's socket, not in our memory). If the client then
//! goes away, its end of stream sits behind those unread bytes, so reading
//! would never find it: the tunnel, its window and its destination would be
//! held until the agent's connection ends. On a Unix socket the kernel tells
//! a full close (`EPOLLHUP`: the peer can neither send nor receive) from a
//! half close (`EPOLLRDHUP` only), so a tunnel that has waited a while can
//! watch for the hang-up without reading. Over TCP a FIN is all a full close
//! sends, the same as a half close, so there is nothing to watch for.
//!
//! The watch registers a duplicate of the socket's descriptor with the
//! reactor (the original is registered already, and its readiness belongs
//! to the tunnel's reader and writer), only while a tunnel is held back.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio::net::{TcpStream, UnixStream};

/// A connection split into a reader that can say whether its peer hung up,
/// and a writer.
pub trait SplitConn: AsyncRead + AsyncWrite + Unpin + Send {
    type Read<'a>: AsyncRead + Hangup + Unpin + Send
    where
        Self: 'a;
    type Write<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;
    fn split_conn(&mut self) -> (Self::Read<'_>, Self::Write<'_>);
}

/// The reading half of a connection.
pub trait Hangup {
    /// A descriptor to watch for the peer's full close with [`hung_up`];
    /// `None` where a full close cannot be told from a half close.
    fn hangup_watch(&self) -> Option<OwnedFd> {
        None
    }
}

impl SplitConn for UnixStream {
    type Read<'a> = tokio::net::unix::ReadHalf<'a>;
    type Write<'a> = tokio::net::unix::WriteHalf<'a>;
    fn split_conn(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        self.split()
    }
}

impl Hangup for tokio::net::unix::ReadHalf<'_> {
    fn hangup_watch(&self) -> Option<OwnedFd> {
        let stream: &UnixStream = self.as_ref();
        stream.as_fd().try_clone_to_owned().ok()
    }
}

impl SplitConn for TcpStream {
    type Read<'a> = tokio::net::tcp::ReadHalf<'a>;
    type Write<'a> = tokio::net::tcp::WriteHalf<'a>;
    fn split_conn(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        self.split()
    }
}

impl Hangup for tokio::net::tcp::ReadHalf<'_> {}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send> SplitConn for tokio_rustls::server::TlsStream<IO> {
    type Read<'a>
        = tokio::io::ReadHalf<&'a mut Self>
    where
        Self: 'a;
    type Write<'a>
        = tokio::io::WriteHalf<&'a mut Self>
    where
        Self: 'a;
    fn split_conn(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        tokio::io::split(self)
    }
}

impl<T> Hangup for tokio::io::ReadHalf<T> {}

/// Resolves once the peer of `fd` (a Unix socket) has closed both directions.
pub async fn hung_up(fd: OwnedFd) -> io::Result<()> {
    // The duplicate shares the original's non-blocking file description;
    // registered on its own, its readiness is this watch's alone. Write
    // readiness carries the hang-up (tokio's read direction does not report
    // it); each wake-up that is only "writable" is cleared, so the next edge
    // (the peer reading, or its close) wakes this again.
    let watch = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?;
    loop {
        if watch.ready(Interest::WRITABLE).await?.is_write_closed() {
            return Ok(());
        }
        let _ = watch.try_io(Interest::WRITABLE, || {
            Err::<(), _>(io::ErrorKind::WouldBlock.into())
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_full_close_is_seen_and_a_half_close_is_not() {
        let (mut ours, mut peer) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let (rd, _wr) = ours.split_conn();
        let watch = rd.hangup_watch().unwrap_or_else(|| panic!("no watch"));
        let mut waiting = Box::pin(hung_up(watch));
        // Unread bytes and a half close: still there.
        peer.write_all(b"unread")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        peer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut waiting)
                .await
                .is_err(),
            "a half close is not a hang-up"
        );
        drop(peer);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap_or_else(|_| panic!("the full close was not seen"))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test]
    async fn tcp_offers_no_watch() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut c = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (rd, _) = c.split_conn();
        assert!(rd.hangup_watch().is_none());
    }
}
