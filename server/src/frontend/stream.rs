//! The response half of a gRPC `Proxy` stream: the tunnel's queue, ending after
//! the last queued packet once the tunnel is finished, or with an error status
//! when it was aborted.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use konnectivity_proto::Packet;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::Status;

use crate::limits::MAX_FRONTEND_PIECE;
use crate::metrics::{Metrics, Segment};
use crate::tunnel::{Abort, FrontendQueue, Piece, Tunnel};

pub struct FrontendStream {
    /// A packet taken off the queue before the response started.
    first: Option<Packet>,
    queue: FrontendQueue,
    finished: Pin<Box<WaitForCancellationFutureOwned>>,
    tunnel: Arc<Tunnel>,
    metrics: Arc<Metrics>,
    done: bool,
}

impl FrontendStream {
    pub fn new(
        queue: FrontendQueue,
        first: Option<Packet>,
        tunnel: Arc<Tunnel>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let finished = Box::pin(queue.finished.clone().cancelled_owned());
        FrontendStream {
            first,
            queue,
            finished,
            tunnel,
            metrics,
            done: false,
        }
    }

    /// Hands out a packet, or a piece of a large DATA packet
    /// ([`MAX_FRONTEND_PIECE`]): the rest stays in the tunnel's queue,
    /// counted, until its next piece goes.
    fn item(&mut self, piece: Piece) -> Poll<Option<Result<Packet, Status>>> {
        if piece.starts {
            self.metrics.packet(Segment::ToClient, piece.pkt.r#type);
        }
        if let Some(len) = piece.ends {
            // Handed to HTTP/2, whose own flow control bounds what is buffered
            // from here on: the agent may send more.
            self.tunnel.consumed(len);
        }
        Poll::Ready(Some(Ok(piece.pkt)))
    }

    fn end(&mut self) -> Poll<Option<Result<Packet, Status>>> {
        self.done = true;
        match self.tunnel.aborted() {
            Some(why @ Abort::Stalled(_)) => {
                Poll::Ready(Some(Err(Status::resource_exhausted(why.to_string()))))
            }
            Some(Abort::Frontend(code, why)) => Poll::Ready(Some(Err(Status::new(code, why)))),
            Some(why) => Poll::Ready(Some(Err(Status::unavailable(why.to_string())))),
            None => Poll::Ready(None),
        }
    }
}

impl Stream for FrontendStream {
    type Item = Result<Packet, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.tunnel.aborted().is_some() {
            return self.end();
        }
        let first = self.first.take();
        match self.queue.rx.poll_piece(cx, MAX_FRONTEND_PIECE, first) {
            Poll::Ready(Some(piece)) => return self.item(piece),
            Poll::Ready(None) => return self.end(),
            Poll::Pending => {}
        }
        if self.finished.as_mut().poll(cx).is_ready() {
            // Finished after the last packet was queued: hand out what is left.
            return match self.queue.rx.poll_piece(cx, MAX_FRONTEND_PIECE, None) {
                Poll::Ready(Some(piece)) => self.item(piece),
                _ => self.end(),
            };
        }
        Poll::Pending
    }
}
