//! One HTTP/2 stream as a byte pipe (`AsyncRead + AsyncWrite`), for CONNECT
//! tunnels on either end. Reads hand out DATA frames and give the flow-control
//! window back as they are consumed, so the peer can never make us buffer more
//! than the window; writes wait for send capacity instead of queueing.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::h2window::{Meter, Registration};

pub struct H2Io {
    send: SendStream<Bytes>,
    recv: RecvStream,
    pending: Bytes,
    write_closed: bool,
    /// The connection's window controller learns what this stream takes and
    /// what it holds while its reader is stopped.
    meter: Option<(Arc<Meter>, Registration)>,
}

impl H2Io {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        H2Io {
            send,
            recv,
            pending: Bytes::new(),
            write_closed: false,
            meter: None,
        }
    }

    /// A stream of a connection whose windows follow the link
    /// ([`crate::h2window`]).
    pub fn metered(send: SendStream<Bytes>, mut recv: RecvStream, meter: &Arc<Meter>) -> Self {
        let registration = meter.register(recv.flow_control().clone());
        H2Io {
            meter: Some((meter.clone(), registration)),
            ..H2Io::new(send, recv)
        }
    }

    /// Resets the stream (RST_STREAM) instead of ending it cleanly, for a
    /// relay that ended with an error.
    pub fn reset(&mut self, reason: h2::Reason) {
        self.send.send_reset(reason);
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
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Ok(data)) => {
                    // The frame is now ours to hold; let the peer send more.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some((m, _)) = &self.meter {
                        m.record(data.len());
                    }
                    self.pending = data;
                }
                Some(Err(e)) => {
                    // The peer ending the stream with NO_ERROR after its data is an EOF.
                    if e.reason() == Some(h2::Reason::NO_ERROR) {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Ready(Err(h2_to_io(e)));
                }
            }
        }
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
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.send.reserve_capacity(buf.len());
        let cnt = loop {
            match self.send.poll_capacity(cx) {
                Poll::Ready(Some(Ok(0))) => continue,
                Poll::Ready(Some(Ok(n))) => break n,
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
        };
        let n = cnt.min(buf.len());
        self.send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_closed {
            return Poll::Ready(Ok(()));
        }
        self.write_closed = true;
        self.send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
        Poll::Ready(Ok(()))
    }
}
