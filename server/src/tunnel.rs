//! One frontend connection (a gRPC `Proxy` stream or an HTTP CONNECT socket)
//! and its place in the dial state machine.
//!
//! DATA for the frontend is admitted by the tunnel's [`RecvGate`]: with one of
//! our agents, per-connection flow control (the agent never sends more than
//! the frontend has room for, so nothing waits); with an upstream agent, a
//! bounded queue and a stall limit, after which only this tunnel is closed.
//! Either way one frontend that stops reading cannot stall the agent stream
//! it shares with other tunnels.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use konnectivity_proto::Packet;
use konnectivity_proto::PacketExt;
use konnectivity_proto::ids::{ConnectId, DialId};
use konnectivity_proto::packet::Payload;
use link::debug_connections::{CloseReason, Tracked};
use link::flow::{GateError, RecvGate, SendGate};
use parking_lot::Mutex;
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
        backend: Arc<Backend<Tunnel>>,
        deadline: Instant,
    },
    /// DIAL_RSP succeeded; packets flow.
    Established {
        backend: Arc<Backend<Tunnel>>,
        connect: ConnectId,
    },
    /// The frontend asked to close; waiting for the agent's CLOSE_RSP.
    Closing {
        backend: Arc<Backend<Tunnel>>,
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
    /// The agent sent past its flow-control window.
    AgentExceeded(i64),
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
            Abort::AgentExceeded(w) => {
                write!(f, "agent exceeded the flow-control window of {w} bytes")
            }
            Abort::Shutdown => f.write_str("proxy server is shutting down"),
            Abort::Frontend(_, why) => f.write_str(why),
        }
    }
}

/// Flow bookkeeping of an established tunnel.
pub struct Flow {
    /// Admits the agent's DATA for the frontend.
    pub recv: RecvGate,
    /// Credit for the frontend's DATA to the agent; `None` for upstream agents.
    pub send: Option<SendGate>,
    backend: Arc<Backend<Tunnel>>,
    connect: ConnectId,
}

pub struct Tunnel {
    /// Process-unique, for logs only.
    pub id: u64,
    /// futures' channel, not tokio's: tokio's allocates a 32-slot block (3 KiB
    /// of `Packet`s) and 0.5 KiB of state per channel up front and keeps
    /// them, and most tunnels are idle (P5 in BENCHMARKS.md, issue 39);
    /// futures' holds about 200 bytes and allocates per queued packet.
    to_frontend: UnboundedSender<Packet>,
    /// The same queue's receiving end, emptied on abort.
    queued: PacketRx,
    state: Mutex<TunnelState>,
    flow: OnceLock<Flow>,
    /// Cancelled when nothing more will be queued for the frontend.
    finished: CancellationToken,
    /// Cancelled only on abort, so writers stuck on a dead frontend give up.
    aborted: CancellationToken,
    abort: Mutex<Option<Abort>>,
    /// Its entry in `/debug/connections`; `None` in the fuzz harness.
    debug: Option<Tracked>,
    /// A close reason was recorded (the first one wins).
    reason_noted: AtomicBool,
    /// Its span, with `--otlp-traces-endpoint`; sent when the tunnel is
    /// dropped. Boxed: without tracing (the default) every tunnel would
    /// carry the span's 232 bytes unused.
    trace: OnceLock<Box<(Arc<crate::otlp::Exporter>, crate::otlp::DialTrace)>>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        if let Some((exporter, trace)) = self.trace.get().map(|b| &**b) {
            trace.finish(exporter);
        }
    }
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel").field("id", &self.id).finish()
    }
}

/// The frontend's end of a tunnel's queue.
pub struct FrontendQueue {
    pub rx: PacketRx,
    pub finished: CancellationToken,
}

/// The receiving end of a tunnel's queue, shared with the tunnel so that an
/// abort drops what is queued at once: the frontend of a stalled tunnel
/// never polls it again (hyper polls a response body only while its stream
/// has send window), and its queue is what the budget was needed back for.
#[derive(Clone)]
pub struct PacketRx(Arc<Mutex<RxInner>>);

struct RxInner {
    rx: UnboundedReceiver<Packet>,
    /// What is left of a DATA packet handed out in pieces: its connection
    /// id, the rest, and the packet's whole length.
    rest: Option<(i64, bytes::Bytes, usize)>,
}

/// One packet, or a piece of a DATA packet, for the frontend.
pub struct Piece {
    pub pkt: Packet,
    /// The first piece of a packet (count the packet once).
    pub starts: bool,
    /// The length of the DATA packet this piece completes: it has been
    /// passed on.
    pub ends: Option<usize>,
}

impl RxInner {
    /// Hands out `pkt`, or its first `max` bytes if it is larger DATA;
    /// `whole` is the length of the packet it is the rest of.
    fn split(&mut self, mut pkt: Packet, max: usize, whole: Option<usize>) -> Piece {
        let (mut ends, starts) = (None, whole.is_none());
        if let Some(Payload::Data(d)) = &mut pkt.payload {
            let whole = whole.unwrap_or(d.data.len());
            if d.data.len() > max {
                let rest = d.data.split_off(max);
                self.rest = Some((d.connect_id, rest, whole));
            } else {
                ends = Some(whole);
            }
        }
        Piece { pkt, starts, ends }
    }
}

impl PacketRx {
    pub fn poll_recv(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Packet>> {
        self.0.lock().rx.poll_next_unpin(cx)
    }

    pub async fn recv(&self) -> Option<Packet> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next packet if one is queued now.
    pub fn try_recv(&self) -> Option<Packet> {
        self.0.lock().rx.try_recv().ok()
    }

    /// The next packet, DATA in pieces of at most `max` bytes; the rest of
    /// a packet stays here (dropped on abort) until its next piece is asked
    /// for. `first` is a packet taken off the queue earlier.
    pub fn poll_piece(
        &self,
        cx: &mut std::task::Context<'_>,
        max: usize,
        first: Option<Packet>,
    ) -> std::task::Poll<Option<Piece>> {
        let mut inner = self.0.lock();
        if let Some(pkt) = first {
            return std::task::Poll::Ready(Some(inner.split(pkt, max, None)));
        }
        if let Some((id, rest, whole)) = inner.rest.take() {
            let pkt = Packet::data(id, rest);
            return std::task::Poll::Ready(Some(inner.split(pkt, max, Some(whole))));
        }
        inner
            .rx
            .poll_next_unpin(cx)
            .map(|p| p.map(|pkt| inner.split(pkt, max, None)))
    }

    /// The next piece if one is queued now, without waiting and whatever
    /// the task's cooperative budget: `None` means the queue is empty.
    pub fn try_piece(&self, max: usize) -> Option<Piece> {
        let mut inner = self.0.lock();
        if let Some((id, rest, whole)) = inner.rest.take() {
            let pkt = Packet::data(id, rest);
            return Some(inner.split(pkt, max, Some(whole)));
        }
        let pkt = inner.rx.try_recv().ok()?;
        Some(inner.split(pkt, max, None))
    }

    /// Closes the queue and drops what it holds.
    fn clear(&self) {
        let mut inner = self.0.lock();
        inner.rest = None;
        inner.rx.close();
        while inner.rx.try_recv().is_ok() {}
    }
}

/// What [`Tunnel::deliver`] did with a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    /// The tunnel is already finished; the packet was dropped.
    Gone,
    /// The tunnel was aborted instead (stalled frontend, or a window breach).
    Aborted,
}

impl Tunnel {
    /// A tunnel, listed in `/debug/connections` as `debug` when given.
    pub fn tracked(debug: Option<Tracked>) -> (Arc<Tunnel>, FrontendQueue) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Unbounded on purpose: DATA is bounded by the gate before it is
        // queued; the few control packets per tunnel need no bound.
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let rx = PacketRx(Arc::new(Mutex::new(RxInner { rx, rest: None })));
        let finished = CancellationToken::new();
        let t = Arc::new(Tunnel {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            to_frontend: tx,
            queued: rx.clone(),
            state: Mutex::new(TunnelState::Idle),
            flow: OnceLock::new(),
            finished: finished.clone(),
            aborted: CancellationToken::new(),
            abort: Mutex::new(None),
            debug,
            reason_noted: AtomicBool::new(false),
            trace: OnceLock::new(),
        });
        (t, FrontendQueue { rx, finished })
    }

    /// Its `/debug/connections` entry, to fill in.
    pub fn debug(&self) -> Option<&Tracked> {
        self.debug.as_ref()
    }

    /// Traces the tunnel's dial (`--otlp-traces-endpoint`).
    pub fn start_trace(&self, exporter: Arc<crate::otlp::Exporter>, trace: crate::otlp::DialTrace) {
        let _ = self.trace.set(Box::new((exporter, trace)));
    }

    /// Its span, when traced.
    pub fn trace(&self) -> Option<&crate::otlp::DialTrace> {
        self.trace.get().map(|b| &b.1)
    }

    /// Records why the tunnel ends, unless a reason was recorded already.
    pub fn note_close(&self, cause: CloseReason, reason: impl std::fmt::Display) {
        if let Some(t) = self.trace() {
            t.closing(cause, &reason.to_string());
        }
        if let Some(d) = &self.debug
            && !self.reason_noted.swap(true, Ordering::Relaxed)
        {
            d.set_close(cause, reason);
            d.set_state("closing");
        }
    }

    pub fn state(&self) -> TunnelState {
        self.state.lock().clone()
    }

    /// Runs `f` on the state under the lock.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut TunnelState) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// Sets up flow bookkeeping once the agent answered the dial.
    pub fn establish_flow(
        &self,
        backend: Arc<Backend<Tunnel>>,
        connect: ConnectId,
        recv: RecvGate,
        send: Option<SendGate>,
    ) {
        let _ = self.flow.set(Flow {
            recv,
            send,
            backend,
            connect,
        });
    }

    pub fn flow(&self) -> Option<&Flow> {
        self.flow.get()
    }

    /// How much the frontend should read next: it holds what it read while
    /// it waits for credit ([`link::flow::read_size`]).
    pub fn next_read(&self) -> usize {
        link::flow::read_size(self.flow().and_then(|f| f.send.as_ref()))
    }

    /// Queues a control packet (DIAL_RSP, CLOSE_RSP, DIAL_CLS) for the frontend.
    pub fn enqueue(&self, pkt: Packet) -> Delivery {
        if self.finished.is_cancelled() || self.to_frontend.unbounded_send(pkt).is_err() {
            return Delivery::Gone;
        }
        Delivery::Queued
    }

    /// Queues the agent's DATA for the frontend once its gate admits it.
    /// `waiting` is told when a legacy agent's DATA has to wait for room.
    pub async fn deliver(&self, pkt: Packet, waiting: impl Fn(bool)) -> Delivery {
        if self.finished.is_cancelled() {
            return Delivery::Gone;
        }
        let Some(flow) = self.flow.get() else {
            return Delivery::Gone;
        };
        let len = match &pkt.payload {
            Some(Payload::Data(d)) => d.data.len(),
            _ => 0,
        };
        let full = flow.recv.is_full();
        if full {
            waiting(true);
        }
        let admitted = tokio::select! {
            r = flow.recv.admit(len) => Some(r),
            _ = self.finished.cancelled() => None,
        };
        if full {
            waiting(false);
        }
        match admitted {
            None => Delivery::Gone,
            Some(Ok(())) => {
                if let Some(d) = &self.debug {
                    link::relay::Tally::upstream_bytes(d, len as u64);
                }
                self.enqueue(pkt)
            }
            Some(Err(GateError::Stalled(d))) => {
                self.abort(Abort::Stalled(d));
                Delivery::Aborted
            }
            Some(Err(GateError::Exceeded(w))) => {
                self.abort(Abort::AgentExceeded(w));
                Delivery::Aborted
            }
        }
    }

    /// The frontend took DATA of `len` bytes: free its room, and return
    /// credit to the agent when enough has built up.
    pub fn consumed(&self, len: usize) {
        if let Some(f) = self.flow.get()
            && let Some(credit) = f.recv.consumed(len)
        {
            f.backend
                .control(Packet::window_update(f.connect.0, credit));
        }
    }

    /// Queues `pkt` as the last packet, then finishes the tunnel.
    pub fn deliver_last(&self, pkt: Packet) {
        if self.debug.is_some()
            && let Some((cause, why)) = last_packet_reason(&pkt)
        {
            self.note_close(cause, why);
        }
        let _ = self.enqueue(pkt);
        self.finish();
    }

    /// No more packets will be queued; the frontend ends after the queued
    /// ones, and anyone waiting for send credit gives up.
    pub fn finish(&self) {
        self.finished.cancel();
        if let Some(send) = self.flow.get().and_then(|f| f.send.as_ref()) {
            send.close();
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished.is_cancelled()
    }

    pub async fn finished(&self) {
        self.finished.cancelled().await
    }

    /// Ends the tunnel with an error for the frontend; queued packets are
    /// dropped (and what they held in the budget given back) at once.
    pub fn abort(&self, why: Abort) {
        let cause = match why {
            Abort::Stalled(_) => CloseReason::Stalled,
            Abort::AgentExceeded(_) => CloseReason::ProtocolError,
            Abort::Shutdown => CloseReason::Shutdown,
            Abort::Frontend(..) => CloseReason::ClientLost,
        };
        self.note_close(cause, &why);
        self.abort.lock().get_or_insert(why);
        self.aborted.cancel();
        self.finish();
        self.queued.clear();
        if let Some(f) = self.flow.get() {
            f.recv.discard();
        }
    }

    pub async fn aborted_wait(&self) {
        self.aborted.cancelled().await
    }

    pub fn aborted(&self) -> Option<Abort> {
        self.abort.lock().clone()
    }
}

/// Why a tunnel ends, read from the last packet its frontend is sent (the
/// agent's answers; the server's own refusals note their reason first).
fn last_packet_reason(pkt: &Packet) -> Option<(CloseReason, String)> {
    Some(match &pkt.payload {
        Some(Payload::DialResponse(r)) if r.error == crate::core::AGENT_LOST_DIALING => (
            CloseReason::UpstreamLost,
            format!("dial failed: {}", r.error),
        ),
        Some(Payload::DialResponse(r)) if !r.error.is_empty() => {
            (CloseReason::DialFailed, format!("dial failed: {}", r.error))
        }
        Some(Payload::CloseResponse(c)) if c.error.is_empty() => {
            (CloseReason::UpstreamClosed, "closed by the agent".into())
        }
        Some(Payload::CloseResponse(c)) if c.error == crate::core::AGENT_LOST => {
            (CloseReason::UpstreamLost, format!("closed: {}", c.error))
        }
        Some(Payload::CloseResponse(c)) => {
            (CloseReason::UpstreamClosed, format!("closed: {}", c.error))
        }
        Some(Payload::CloseDial(_)) => (
            CloseReason::DialFailed,
            "dial cancelled by the agent".into(),
        ),
        _ => return None,
    })
}
