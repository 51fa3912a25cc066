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
    /// A packet taken off the queue before the response started. Boxed:
    /// tonic keeps this stream for the tunnel's life, and the packet is
    /// handed out at once (BENCHMARKS.md, P5).
    first: Option<Box<Packet>>,
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
            first: first.map(Box::new),
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
        let first = self.first.take().map(|p| *p);
        match self.queue.rx.poll_piece(cx, MAX_FRONTEND_PIECE, first) {
            Poll::Ready(Some(piece)) => return self.item(piece),
            Poll::Ready(None) => return self.end(),
            Poll::Pending => {}
        }
        if self.finished.as_mut().poll(cx).is_ready() {
            // Finished after the last packet was queued. `Pending` above
            // said the queue was empty when it was polled, not that it still
            // is: the last packets may have been queued since, just before
            // the tunnel finished. Only an empty `try_piece` says the stream
            // may end; otherwise hand out what is left.
            return match self.queue.rx.try_piece(MAX_FRONTEND_PIECE) {
                Some(piece) => self.item(piece),
                None => self.end(),
            };
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use konnectivity_proto::{PacketExt, PacketType};

    /// A tunnel whose agent closed with many packets still queued hands
    /// every one of them, then the CLOSE_RSP, to a frontend that reads them
    /// all in one go: the task runs out of tokio's cooperative budget on the
    /// way, which must not end the stream early (it did, and the client got
    /// a clean end-of-stream short of the data).
    #[tokio::test]
    async fn a_finished_tunnel_hands_out_everything_queued_past_the_coop_budget() {
        const PACKETS: usize = 1_000;
        let (tunnel, queue) = Tunnel::tracked(None);
        for i in 0..PACKETS {
            let pkt = Packet::data(1, bytes::Bytes::from(vec![(i % 251) as u8; 100]));
            assert_eq!(tunnel.enqueue(pkt), crate::tunnel::Delivery::Queued);
        }
        tunnel.deliver_last(Packet::close_response(1, String::new()));
        let stream = FrontendStream::new(queue, None, tunnel, Arc::new(Metrics::new()));
        let got: Vec<Result<Packet, Status>> = stream.collect().await;
        let got: Vec<Packet> = got.into_iter().filter_map(Result::ok).collect();
        assert_eq!(
            got.len(),
            PACKETS + 1,
            "every DATA packet and the CLOSE_RSP"
        );
        for (i, pkt) in got[..PACKETS].iter().enumerate() {
            assert_eq!(pkt.r#type, PacketType::Data as i32);
            match &pkt.payload {
                Some(konnectivity_proto::packet::Payload::Data(d)) => {
                    assert_eq!(d.data[0], (i % 251) as u8, "packet {i} in order")
                }
                other => panic!("packet {i} is not DATA: {other:?}"),
            }
        }
        assert_eq!(got[PACKETS].r#type, PacketType::CloseRsp as i32);
    }
}
