//! One frontend connection (a gRPC `Proxy` stream or an HTTP CONNECT socket)
//! and its place in the dial state machine.
//!
//! Packets for the frontend go through a bounded per-tunnel queue, so one
//! frontend that stops reading cannot stall the agent stream it shares with
//! other tunnels for longer than the stall limit: after that only this tunnel
//! is closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use konnectivity_proto::Packet;
use konnectivity_proto::ids::{ConnectId, DialId};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::{SendTimeoutError, TrySendError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;

/// Where a tunnel is in its life.
#[derive(Debug, Clone, Default)]
pub enum TunnelState {
    /// No DIAL_REQ seen yet.
    #[default]
    Idle,
    /// DIAL_REQ sent to `backend`, waiting for DIAL_RSP.
    Dialing {
        dial: DialId,
        backend: Arc<Backend>,
        deadline: Instant,
    },
    /// DIAL_RSP succeeded; packets flow.
    Established {
        backend: Arc<Backend>,
        connect: ConnectId,
    },
    /// The frontend asked to close; waiting for the agent's CLOSE_RSP.
    Closing {
        backend: Arc<Backend>,
        connect: ConnectId,
    },
    /// Nothing more will be sent either way.
    Closed,
}

/// Why a tunnel was cut short, reported to its frontend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The frontend did not read for the whole stall limit.
    Stalled(Duration),
    /// The agent stream went away and the final packet did not fit the queue.
    AgentGone,
    /// The server is shutting down.
    Shutdown,
    /// The frontend's own stream failed (e.g. an oversize message); it is
    /// told why with this status code.
    Frontend(tonic::Code, String),
}

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abort::Stalled(d) => write!(
                f,
                "frontend did not read for {d:?}; connection closed to protect the agent stream"
            ),
            Abort::AgentGone => f.write_str("agent stream closed"),
            Abort::Shutdown => f.write_str("proxy server is shutting down"),
            Abort::Frontend(_, why) => f.write_str(why),
        }
    }
}

pub struct Tunnel {
    /// Process-unique, for logs only.
    pub id: u64,
    to_frontend: mpsc::Sender<Packet>,
    state: Mutex<TunnelState>,
    /// Cancelled when nothing more will be queued for the frontend.
    finished: CancellationToken,
    /// Cancelled only on abort, so writers stuck on a dead frontend give up.
    aborted: CancellationToken,
    abort: Mutex<Option<Abort>>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel").field("id", &self.id).finish()
    }
}

/// The frontend's end of a tunnel's queue.
pub struct FrontendQueue {
    pub rx: mpsc::Receiver<Packet>,
    pub finished: CancellationToken,
}

/// What [`Tunnel::deliver`] did with a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    /// The tunnel is already finished; the packet was dropped.
    Gone,
    /// The frontend stalled past the limit; the tunnel was aborted.
    Stalled,
}

impl Tunnel {
    pub fn new(queue_len: usize) -> (Arc<Tunnel>, FrontendQueue) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let (tx, rx) = mpsc::channel(queue_len.max(1));
        let finished = CancellationToken::new();
        let t = Arc::new(Tunnel {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            to_frontend: tx,
            state: Mutex::new(TunnelState::Idle),
            finished: finished.clone(),
            aborted: CancellationToken::new(),
            abort: Mutex::new(None),
        });
        (t, FrontendQueue { rx, finished })
    }

    pub fn state(&self) -> TunnelState {
        self.state.lock().clone()
    }

    /// Runs `f` on the state under the lock.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut TunnelState) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// Queues a packet for the frontend. If the queue is full, waits at most
    /// `stall` for room (the caller's agent stream waits with it), then aborts
    /// this tunnel only.
    pub async fn deliver(&self, pkt: Packet, stall: Duration, on_full: impl Fn(bool)) -> Delivery {
        if self.finished.is_cancelled() {
            return Delivery::Gone;
        }
        match self.to_frontend.try_send(pkt) {
            Ok(()) => Delivery::Queued,
            Err(TrySendError::Closed(_)) => Delivery::Gone,
            Err(TrySendError::Full(pkt)) => {
                on_full(true);
                let r = tokio::select! {
                    r = self.to_frontend.send_timeout(pkt, stall) => Some(r),
                    _ = self.finished.cancelled() => None,
                };
                on_full(false);
                match r {
                    Some(Ok(())) => Delivery::Queued,
                    Some(Err(SendTimeoutError::Timeout(_))) => {
                        self.abort(Abort::Stalled(stall));
                        Delivery::Stalled
                    }
                    Some(Err(SendTimeoutError::Closed(_))) | None => Delivery::Gone,
                }
            }
        }
    }

    /// Queues `pkt` as the last packet, then finishes the tunnel.
    pub async fn deliver_last(&self, pkt: Packet, stall: Duration) {
        let _ = self.deliver(pkt, stall, |_| {}).await;
        self.finish();
    }

    /// Queues `pkt` as the last packet without waiting; if there is no room,
    /// aborts with `otherwise` instead.
    pub fn close_now(&self, pkt: Packet, otherwise: Abort) {
        if self.to_frontend.try_send(pkt).is_err() {
            self.abort(otherwise);
        }
        self.finish();
    }

    /// No more packets will be queued; the frontend ends after the queued ones.
    pub fn finish(&self) {
        self.finished.cancel();
    }

    pub async fn finished(&self) {
        self.finished.cancelled().await
    }

    /// Ends the tunnel with an error for the frontend; queued packets are dropped.
    pub fn abort(&self, why: Abort) {
        self.abort.lock().get_or_insert(why);
        self.aborted.cancel();
        self.finished.cancel();
    }

    pub async fn aborted_wait(&self) {
        self.aborted.cancelled().await
    }

    pub fn aborted(&self) -> Option<Abort> {
        self.abort.lock().clone()
    }
}
