//! One HTTP/2 stream as a byte pipe (`AsyncRead + AsyncWrite`, or a relay's
//! [`Duplex`] that passes frames on uncopied), for CONNECT tunnels on either
//! end. Reads hand out DATA frames and give the flow-control
//! window back as they are consumed, so the peer can never make us buffer more
//! than the window; writes wait for send capacity instead of queueing.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::duplex::{ChunkRead, ChunkWrite, Duplex};
use crate::h2window::{Meter, Registration};

pub struct H2Io {
    read: H2Read,
    write: H2Write,
}

/// The receiving half of a stream: its DATA frames as h2 decoded them.
pub struct H2Read {
    recv: RecvStream,
    /// What of the last frame a byte reader has not yet taken.
    pending: Bytes,
    /// The connection's window controller learns what this stream takes and
    /// what it holds while its reader is stopped.
    meter: Option<(Arc<Meter>, Registration)>,
}

/// The sending half of a stream.
pub struct H2Write {
    send: SendStream<Bytes>,
    closed: bool,
}

impl H2Io {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        H2Io {
            read: H2Read {
                recv,
                pending: Bytes::new(),
                meter: None,
            },
            write: H2Write {
                send,
                closed: false,
            },
        }
    }

    /// A stream of a connection whose windows follow the link
    /// ([`crate::h2window`]).
    pub fn metered(send: SendStream<Bytes>, mut recv: RecvStream, meter: &Arc<Meter>) -> Self {
        let registration = meter.register(recv.flow_control().clone());
        let mut io = H2Io::new(send, recv);
        io.read.meter = Some((meter.clone(), registration));
        io
    }
}

impl Duplex for H2Io {
    type Read = H2Read;
    type Write = H2Write;

    /// Frames are handed out as they came (at most the max frame size we
    /// advertise), whatever `max_chunk`.
    fn split(self, _max_chunk: usize) -> (H2Read, H2Write) {
        (self.read, self.write)
    }
}

impl ChunkRead for H2Read {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        if !self.pending.is_empty() {
            return Poll::Ready(Ok(std::mem::take(&mut self.pending)));
        }
        loop {
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(Bytes::new())),
                Some(Ok(data)) => {
                    // The frame is now ours to hold; let the peer send more.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some((m, _)) = &self.meter {
                        m.record(data.len());
                    }
                    // h2 hands out an empty frame only with END_STREAM:
                    // the end is the next poll's.
                    if !data.is_empty() {
                        return Poll::Ready(Ok(data));
                    }
                }
                Some(Err(e)) => {
                    // The peer ending the stream with NO_ERROR after its data is an EOF.
                    if e.reason() == Some(h2::Reason::NO_ERROR) {
                        return Poll::Ready(Ok(Bytes::new()));
                    }
                    return Poll::Ready(Err(h2_to_io(e)));
                }
            }
        }
    }
}

impl H2Write {
    /// Waits until the stream may send some of `want` bytes; how many.
    fn poll_capacity(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.send.reserve_capacity(want);
        loop {
            match self.send.poll_capacity(cx) {
                Poll::Ready(Some(Ok(0))) => continue,
                Poll::Ready(Some(Ok(n))) => return Poll::Ready(Ok(n.min(want))),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_to_io(e))),
                Poll::Ready(None) => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                Poll::Pending => {
                    // No capacity may be coming because the peer reset the stream.
                    if let Poll::Ready(r) = self.send.poll_reset(cx) {
                        let err = match r {
                            Ok(reason) => io::Error::new(
                                io::ErrorKind::ConnectionReset,
                                format!("stream reset by peer: {reason}"),
                            ),
                            Err(e) => h2_to_io(e),
                        };
                        return Poll::Ready(Err(err));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl ChunkWrite for H2Write {
    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        while !chunk.is_empty() {
            let n = ready!(self.poll_capacity(cx, chunk.len()))?;
            self.send
                .send_data(chunk.split_to(n), false)
                .map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_finish(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        self.closed = true;
        self.send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
        Poll::Ready(Ok(()))
    }
}

fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 i/o error"));
    }
    let kind = match e.reason() {
        Some(h2::Reason::NO_ERROR) | Some(h2::Reason::CANCEL) => io::ErrorKind::ConnectionReset,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl AsyncRead for H2Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = &mut self.read;
        if read.pending.is_empty() {
            // Empty at EOF: nothing put in `buf` says so.
            read.pending = ready!(read.poll_chunk(cx))?;
        }
        let n = read.pending.len().min(buf.remaining());
        buf.put_slice(&read.pending[..n]);
        read.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let write = &mut self.write;
        let n = ready!(write.poll_capacity(cx, buf.len()))?;
        write
            .send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write.poll_finish(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duplex::Plain;
    use crate::relay::{RelayBytes, RelayEnd, RelayOptions, relay};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A CONNECT-like stream relayed to a socket, its frames passed on as
    /// they came: every byte arrives in order, the client's END_STREAM
    /// reaches the destination as EOF while the answer still flows back, and
    /// the destination's EOF ends the stream.
    #[tokio::test]
    async fn a_relayed_stream_keeps_its_bytes_and_its_half_close() {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let (dest, mut dest_peer) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let Some(Ok((req, mut respond))) = conn.accept().await else {
                panic!("no stream");
            };
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let send = respond
                .send_response(http::Response::new(()), false)
                .unwrap_or_else(|e| panic!("{e}"));
            let io = H2Io::new(send, req.into_body());
            relay(
                io,
                Plain(dest),
                RelayOptions::default(),
                &(),
                std::future::pending(),
            )
            .await
        });
        let (mut client, conn) = h2::client::handshake(client_io)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(conn);
        let req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("dest.example:443")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        let (answer, mut up) = client
            .send_request(req, false)
            .unwrap_or_else(|e| panic!("{e}"));
        let sent: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        for piece in sent.chunks(7_000) {
            up.send_data(Bytes::copy_from_slice(piece), false)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        up.send_data(Bytes::new(), true)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut got = Vec::new();
        dest_peer
            .read_to_end(&mut got)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, sent, "what the destination read before EOF");
        dest_peer
            .write_all(b"answer")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(dest_peer);
        let mut down = answer.await.unwrap_or_else(|e| panic!("{e}")).into_body();
        let mut back = Vec::new();
        while let Some(d) = down.data().await {
            let d = d.unwrap_or_else(|e| panic!("{e}"));
            let _ = down.flow_control().release_capacity(d.len());
            back.extend_from_slice(&d);
        }
        assert_eq!(back, b"answer");
        let (end, bytes) = server.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(end, RelayEnd::Closed), "{end:?}");
        assert_eq!(
            bytes,
            RelayBytes {
                from_client: sent.len() as u64,
                from_upstream: 6
            }
        );
    }
}
