//! A connection as a relay sees it: a reading half that hands out chunks and
//! a writing half that takes them. A byte stream (socket, TLS session) is read
//! through a [`ChunkReader`]; an HTTP/2 stream ([`crate::h2io`]) hands out the
//! DATA frames h2 already holds and sends the chunks it is given, so a relay
//! to or from one copies no byte in user space.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};

use crate::chunks::ChunkReader;

/// The reading half.
pub trait ChunkRead: Unpin {
    /// The next chunk the peer sent; empty at EOF.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>>;
}

/// The writing half.
pub trait ChunkWrite: Unpin {
    /// Passes on all of `chunk` and flushes it. `chunk` is advanced past what
    /// has been passed on, so a call that returned `Pending` is repeated with
    /// the same chunk.
    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>>;

    /// Ends this direction: the peer reads EOF.
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// What a relay connects.
pub trait Duplex {
    type Read: ChunkRead;
    type Write: ChunkWrite;

    /// The two halves; where the reader picks its chunks' size, none is
    /// larger than `max_chunk`.
    fn split(self, max_chunk: usize) -> (Self::Read, Self::Write);
}

/// A byte stream to relay.
pub struct Plain<T>(pub T);

pub struct PlainRead<T> {
    half: ReadHalf<T>,
    reader: ChunkReader,
}

pub struct PlainWrite<T> {
    half: WriteHalf<T>,
}

impl<T: AsyncRead + AsyncWrite> Duplex for Plain<T> {
    type Read = PlainRead<T>;
    type Write = PlainWrite<T>;

    fn split(self, max_chunk: usize) -> (PlainRead<T>, PlainWrite<T>) {
        let (half, w) = tokio::io::split(self.0);
        let reader = ChunkReader::with_max(max_chunk);
        (PlainRead { half, reader }, PlainWrite { half: w })
    }
}

impl<T: AsyncRead> ChunkRead for PlainRead<T> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        self.reader.poll_read(cx, Pin::new(&mut self.half))
    }
}

impl<T: AsyncWrite> ChunkWrite for PlainWrite<T> {
    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        while chunk.has_remaining() {
            let n = ready!(Pin::new(&mut self.half).poll_write(cx, chunk))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            chunk.advance(n);
        }
        Pin::new(&mut self.half).poll_flush(cx)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.half).poll_shutdown(cx)
    }
}
