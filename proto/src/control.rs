//! The queue of control packets (WINDOW_UPDATE) to the peer of an agent
//! stream: they are sent without waiting and ahead of DATA (credit must
//! never wait behind the data it would let through), so the queue cannot
//! make its writer wait; it is bounded in count instead. Every packet in it
//! is a few dozen bytes, so the count bounds the bytes.
//!
//! A peer of ours has at most a few of them outstanding per connection (one
//! answer to its request for credit back, a few grants per window). A peer
//! that asks for credit back in a loop and never reads its stream would make
//! the queue grow without end; past [`MAX_QUEUED`] the sender is told, and
//! ends the stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::Packet;

/// Control packets one stream may have queued for its peer (about 6 MiB);
/// a peer of ours reaches a few per open connection at most.
pub const MAX_QUEUED: usize = 65_536;

/// Why a control packet was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("the peer left {MAX_QUEUED} control packets unread")]
    Full,
    #[error("the stream is closed")]
    Closed,
}

pub fn channel() -> (ControlTx, ControlRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        ControlTx {
            tx,
            queued: queued.clone(),
        },
        ControlRx { rx, queued },
    )
}

#[derive(Debug, Clone)]
pub struct ControlTx {
    tx: mpsc::UnboundedSender<Packet>,
    queued: Arc<AtomicUsize>,
}

impl ControlTx {
    /// Queues `pkt` without waiting, unless [`MAX_QUEUED`] are queued.
    pub fn send(&self, pkt: Packet) -> Result<(), ControlError> {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ControlError::Full);
        }
        self.tx.send(pkt).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            ControlError::Closed
        })
    }

    /// Packets queued now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// The receiving end: a stream of the queued packets.
#[derive(Debug)]
pub struct ControlRx {
    rx: mpsc::UnboundedReceiver<Packet>,
    queued: Arc<AtomicUsize>,
}

impl ControlRx {
    pub fn try_recv(&mut self) -> Result<Packet, mpsc::error::TryRecvError> {
        let p = self.rx.try_recv()?;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        Ok(p)
    }

    pub async fn recv(&mut self) -> Option<Packet> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Packet>> {
        let p = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(_)) = &p {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PacketExt;

    #[test]
    fn the_queue_is_bounded_in_count_and_counts_what_is_taken() {
        let (tx, mut rx) = channel();
        for _ in 0..MAX_QUEUED {
            assert_eq!(tx.send(Packet::window_update(1, 1)), Ok(()));
        }
        assert_eq!(
            tx.send(Packet::window_update(1, 1)),
            Err(ControlError::Full)
        );
        assert!(rx.try_recv().is_ok());
        assert_eq!(tx.queued(), MAX_QUEUED - 1);
        assert_eq!(tx.send(Packet::window_update(1, 1)), Ok(()));
        let (tx, rx) = channel();
        drop(rx);
        assert_eq!(
            tx.send(Packet::window_update(1, 1)),
            Err(ControlError::Closed)
        );
    }
}
