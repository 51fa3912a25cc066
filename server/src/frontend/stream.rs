//! The response half of a gRPC `Proxy` stream: the tunnel's queue, ending after
//! the last queued packet once the tunnel is finished, or with an error status
//! when it was aborted.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use konnectivity_proto::Packet;
use konnectivity_proto::packet::Payload;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::Status;

use crate::metrics::{Metrics, Segment};
use crate::tunnel::{Abort, FrontendQueue, Tunnel};

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

    fn item(&mut self, pkt: Packet) -> Poll<Option<Result<Packet, Status>>> {
        self.metrics.packet(Segment::ToClient, pkt.r#type);
        if let Some(Payload::Data(d)) = &pkt.payload {
            // Handed to HTTP/2, whose own flow control bounds what is buffered
            // from here on: the agent may send more.
            self.tunnel.consumed(d.data.len());
        }
        Poll::Ready(Some(Ok(pkt)))
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
        if let Some(pkt) = self.first.take() {
            return self.item(pkt);
        }
        match self.queue.rx.poll_recv(cx) {
            Poll::Ready(Some(pkt)) => return self.item(pkt),
            Poll::Ready(None) => return self.end(),
            Poll::Pending => {}
        }
        if self.finished.as_mut().poll(cx).is_ready() {
            // Finished after the last packet was queued: hand out what is left.
            return match self.queue.rx.try_recv() {
                Ok(pkt) => self.item(pkt),
                Err(_) => self.end(),
            };
        }
        Poll::Pending
    }
}
