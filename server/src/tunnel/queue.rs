//! A tunnel's queue of packets for its frontend: one sender (the tunnel), a
//! receiver shared by the frontend and the tunnel's abort.
//!
//! Not tokio's `mpsc`: its channel allocates a block of 32 slots (about
//! 3 KiB with a `Packet`) and the channel's own state (0.5 KiB) when it is
//! made, and keeps the block for the channel's life. Most tunnels are idle
//! with nothing queued (P5 in BENCHMARKS.md, issue 39), so this queue
//! allocates on its first packet and gives its memory back each time it
//! empties. It has no lock of its own: its owner holds it in the mutex it
//! already takes for the receiving side, and wakes the receiver after
//! letting go of that mutex.
//!
//! No bound here, as before: DATA is admitted by the tunnel's gate before
//! it is queued, and control packets are a few per tunnel.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use konnectivity_proto::Packet;

#[derive(Default)]
pub(super) struct Fifo {
    items: VecDeque<Packet>,
    /// No more packets are taken: the sender is gone or the receiver closed.
    closed: bool,
    /// The receiver waiting for a packet.
    waker: Option<Waker>,
}

impl Fifo {
    /// Queues `pkt`, or gives it back if the queue is closed. The waker
    /// returned is to be woken once the owner's lock is released.
    pub(super) fn push(&mut self, pkt: Packet) -> Result<Option<Waker>, Packet> {
        if self.closed {
            return Err(pkt);
        }
        self.items.push_back(pkt);
        Ok(self.waker.take())
    }

    /// Takes no more packets; those queued can still be taken. Returns the
    /// waker to wake, as [`Fifo::push`] does.
    pub(super) fn close(&mut self) -> Option<Waker> {
        self.closed = true;
        self.waker.take()
    }

    /// The next packet if one is queued now.
    pub(super) fn try_pop(&mut self) -> Option<Packet> {
        let pkt = self.items.pop_front()?;
        if self.items.is_empty() {
            // An idle tunnel keeps no allocation; a busy one pays one per
            // burst, not per packet.
            self.items = VecDeque::new();
        }
        Some(pkt)
    }

    /// The next packet; `None` once the queue is closed and empty. Spends
    /// the task's cooperative budget as tokio's channels do, so a frontend
    /// whose queue never empties still lets other tasks run.
    pub(super) fn poll_pop(&mut self, cx: &mut Context<'_>) -> Poll<Option<Packet>> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        if let Some(pkt) = self.try_pop() {
            coop.made_progress();
            return Poll::Ready(Some(pkt));
        }
        if self.closed {
            coop.made_progress();
            return Poll::Ready(None);
        }
        match &mut self.waker {
            Some(w) => w.clone_from(cx.waker()),
            None => self.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Drops what is queued (and its allocation).
    pub(super) fn clear(&mut self) {
        self.items = VecDeque::new();
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.items.capacity()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;
    use konnectivity_proto::PacketExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn data(n: usize) -> Packet {
        Packet::data(1, bytes::Bytes::from(vec![7u8; n]))
    }

    fn len(p: &Packet) -> usize {
        match &p.payload {
            Some(konnectivity_proto::packet::Payload::Data(d)) => d.data.len(),
            _ => 0,
        }
    }

    #[test]
    fn an_empty_queue_holds_no_allocation_and_gives_it_back_when_emptied() {
        let mut q = Fifo::default();
        assert_eq!(q.capacity(), 0);
        for n in 1..=20 {
            assert!(q.push(data(n)).is_ok());
        }
        assert!(q.capacity() >= 20);
        for n in 1..=20 {
            let p = q.try_pop().expect("queued");
            assert_eq!(len(&p), n, "first in, first out");
        }
        assert_eq!(q.capacity(), 0, "emptied: its memory is given back");
        assert!(q.try_pop().is_none());
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_packet_and_by_the_close() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut q = Fifo::default();
        assert!(q.poll_pop(&mut cx).is_pending());
        let w = q.push(data(3)).expect("open");
        w.expect("the waiting receiver is handed back").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(q.poll_pop(&mut cx), Poll::Ready(Some(_))));
        assert!(q.poll_pop(&mut cx).is_pending());
        q.close().expect("the waiting receiver").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(matches!(q.poll_pop(&mut cx), Poll::Ready(None)));
    }

    #[tokio::test]
    async fn a_closed_queue_refuses_packets_but_hands_out_those_it_holds() {
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut q = Fifo::default();
        assert!(q.push(data(1)).is_ok());
        assert!(q.close().is_none(), "nobody was waiting");
        assert!(q.push(data(2)).is_err());
        assert!(matches!(q.poll_pop(&mut cx), Poll::Ready(Some(p)) if len(&p) == 1));
        assert!(matches!(q.poll_pop(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn clear_drops_what_is_queued() {
        let mut q = Fifo::default();
        for n in 1..=5 {
            assert!(q.push(data(n)).is_ok());
        }
        q.clear();
        assert_eq!(q.capacity(), 0);
        assert!(q.try_pop().is_none());
    }
}
