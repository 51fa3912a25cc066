//! One `Connect` stream to one proxy server: dials on DIAL_REQ without ever
//! blocking the stream, routes DATA and CLOSE_REQ by connectID, and answers
//! unknown ids the way upstream does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use konnectivity_proto::control::{ControlError, ControlTx};
use konnectivity_proto::ids::{ConnectId, DialId, ServerId};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt, PacketType};
use link::debug_connections::{CloseReason, Connections, Tracked};
use link::flow::{FlowPool, GateError, LegacyLink, LinkFlow, RecvGate, sweep_windows};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::Instrument;

use crate::dial::destination::Dialer;
use crate::dial::endpoint::{self, CloseSignal, ConnHandle, Link};
use crate::metrics::{Metrics, Segment};

/// Settings every session shares.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub dial_timeout: Duration,
    /// Packets queued per destination connection.
    pub conn_queue: usize,
    /// How long a destination may leave its queue full before only its
    /// connection is closed (the stream reader waits that long at most).
    pub stall_timeout: Duration,
    /// What may be dialed (`--allowed-destinations`).
    pub policy: Arc<crate::dial::policy::DestinationPolicy>,
    /// Flow-control settings, the process budget and the window totals.
    pub flow: Arc<FlowPool>,
    /// TCP, or in-memory pipes in the fuzz target.
    pub dialer: Dialer,
    /// `--otlp-traces-endpoint`: each dial's span goes there.
    pub otlp: Option<Arc<daemon::otlp::Exporter>>,
}

/// Where a session's packets to the server go.
pub(crate) struct Links {
    pub out: mpsc::Sender<Packet>,
    pub control: ControlTx,
    /// The largest window the server agreed to (`None`: no flow control).
    pub flow_max: Option<i64>,
    /// Where the session lists its connections (`/debug/connections`).
    pub debug: Connections,
}

pub struct Session {
    pub server_id: ServerId,
    out: mpsc::Sender<Packet>,
    control: ControlTx,
    /// Per-connection flow control; `None` with upstream servers.
    flow: Option<LinkFlow>,
    /// What connections without flow control may hold (upstream servers).
    legacy: LegacyLink,
    debug: Connections,
    conns: Mutex<HashMap<ConnectId, ConnHandle>>,
    dials: Mutex<HashMap<DialId, CancellationToken>>,
    next_id: AtomicI64,
    closed: CancellationToken,
    metrics: Arc<Metrics>,
    cfg: SessionConfig,
    drain: Drain,
}

impl Session {
    /// A session over an open `Connect` stream; returns it with the stream's
    /// inbound half for [`Session::serve`].
    pub fn new(
        conn: crate::connect::Connection,
        metrics: Arc<Metrics>,
        cfg: SessionConfig,
        drain: Drain,
        debug: Connections,
    ) -> (Arc<Session>, Streaming<Packet>) {
        let links = Links {
            out: conn.outbound,
            control: conn.control,
            flow_max: conn.flow_max,
            debug,
        };
        let session = Session::with_links(conn.server_id, links, metrics, cfg, drain);
        (session, conn.inbound)
    }

    /// A session whose packets to the server go to `links`.
    pub(crate) fn with_links(
        server_id: ServerId,
        links: Links,
        metrics: Arc<Metrics>,
        cfg: SessionConfig,
        drain: Drain,
    ) -> Arc<Session> {
        Arc::new(Session {
            server_id,
            out: links.out,
            control: links.control,
            flow: cfg.flow.link(links.flow_max),
            legacy: cfg.flow.legacy_link(cfg.conn_queue, cfg.stall_timeout),
            debug: links.debug,
            conns: Mutex::new(HashMap::new()),
            dials: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(0),
            closed: CancellationToken::new(),
            metrics,
            cfg,
            drain,
        })
    }

    /// The largest window agreed with the server (`None`: no flow control).
    pub fn flow_max(&self) -> Option<i64> {
        self.flow.as_ref().map(|f| f.cfg.max)
    }

    /// Sends a packet to the server, waiting while the stream is backed up.
    pub async fn send(&self, pkt: Packet) -> bool {
        let t = pkt.r#type;
        if self.out.send(pkt).await.is_err() {
            self.metrics.server_failure_to.increment(1);
            return false;
        }
        self.metrics.packet(Segment::FromAgent, t);
        true
    }

    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Queues a WINDOW_UPDATE ahead of DATA, without waiting. A server that
    /// leaves too many of them unread (it asks for credit back in a loop and
    /// does not read its stream) loses the stream.
    fn control(&self, pkt: Packet) {
        match self.control.send(pkt) {
            Ok(()) => self
                .metrics
                .packet(Segment::FromAgent, PacketType::WindowUpdate as i32),
            Err(e @ ControlError::Full) => {
                if !self.closed.is_cancelled() {
                    tracing::warn!(error = %e, "closing the stream to the server");
                }
                self.close();
            }
            Err(ControlError::Closed) => {}
        }
    }

    pub fn connections(&self) -> usize {
        self.conns.lock().len()
    }

    pub fn pending_dials(&self) -> usize {
        self.dials.lock().len()
    }

    /// Reads the server's packets until the stream ends or the session closes.
    pub async fn serve(self: &Arc<Self>, mut inbound: Streaming<Packet>) {
        let sweep = self.sweep_windows();
        tokio::pin!(sweep);
        loop {
            let msg = tokio::select! {
                m = inbound.message() => m,
                _ = &mut sweep => break,
                _ = self.closed.cancelled() => break,
                _ = self.drain.stopping() => break,
            };
            match msg {
                Ok(Some(pkt)) => {
                    self.metrics.packet(Segment::ToAgent, pkt.r#type);
                    self.handle(pkt).await;
                }
                Ok(None) => {
                    tracing::info!("server closed the stream");
                    break;
                }
                Err(status) => {
                    self.metrics.server_failure_from.increment(1);
                    self.metrics.stream_error(
                        Segment::ToAgent,
                        konnectivity_proto::code_name(status.code()),
                        "Unknown",
                    );
                    tracing::info!(%status, "stream from server failed");
                    break;
                }
            }
        }
        self.end();
    }

    /// The stream is over: every connection and dial of it ends.
    pub(crate) fn end(&self) {
        self.closed.cancel();
        // Connections of a dead stream cannot be reached by anyone any more.
        for (_, c) in self.conns.lock().drain() {
            c.close.close(None);
        }
        for (_, d) in self.dials.lock().drain() {
            d.cancel();
        }
    }

    pub(crate) async fn handle(self: &Arc<Self>, pkt: Packet) {
        match (PacketType::try_from(pkt.r#type), pkt.payload) {
            (Ok(PacketType::DialReq), Some(Payload::DialRequest(req))) => self.start_dial(req),
            (Ok(PacketType::Data), Some(Payload::Data(d))) => {
                if d.connect_id == 0 {
                    tracing::debug!("DATA without connectID; ignored");
                    return;
                }
                self.deliver(ConnectId(d.connect_id), d.data).await;
            }
            (Ok(PacketType::CloseReq), Some(Payload::CloseRequest(c))) => {
                let found = self
                    .conns
                    .lock()
                    .get(&ConnectId(c.connect_id))
                    .map(|h| h.close.clone());
                match found {
                    Some(close) => close.close(None),
                    None => {
                        tracing::debug!(
                            connection_id = c.connect_id,
                            "CLOSE_REQ for unknown connection"
                        );
                        self.send(Packet::close_response(
                            c.connect_id,
                            "Unknown connectID".into(),
                        ))
                        .await;
                    }
                }
            }
            (Ok(PacketType::WindowUpdate), Some(Payload::WindowUpdate(w))) => {
                let found = self
                    .conns
                    .lock()
                    .get(&ConnectId(w.connect_id))
                    .map(|h| (h.send.clone(), h.gate.clone()));
                let Some((send, gate)) = found else { return };
                match (w.bytes, send) {
                    (b, Some(send)) if b > 0 => send.grant(b),
                    (b, Some(send)) if b < 0 => {
                        let back = send.give_back(b.saturating_neg());
                        self.control(Packet::credit_returned(w.connect_id, back));
                    }
                    (0, _) => {
                        if let Some(credit) = gate.returned(w.returned) {
                            let _ = self
                                .control
                                .send(Packet::window_update(w.connect_id, credit));
                            self.metrics
                                .packet(Segment::FromAgent, PacketType::WindowUpdate as i32);
                        }
                    }
                    _ => {}
                }
            }
            (Ok(PacketType::DialCls), Some(Payload::CloseDial(c))) => {
                if let Some(cancel) = self.dials.lock().remove(&DialId(c.random)) {
                    tracing::debug!(dial_id = c.random, "dial cancelled by server");
                    cancel.cancel();
                }
            }
            (t, _) => tracing::debug!(packet_type = ?t, "ignoring unexpected packet from server"),
        }
    }

    /// Queues bytes for a destination. A destination that does not drain its
    /// queue within the stall limit is closed with an error; the stream
    /// reader never waits longer than that.
    async fn deliver(&self, id: ConnectId, data: Bytes) {
        let found = self
            .conns
            .lock()
            .get(&id)
            .map(|h| (h.to_remote.clone(), h.gate.clone(), h.close.clone()));
        let Some((tx, gate, close)) = found else {
            tracing::debug!(connection_id = id.0, "DATA for unknown connection");
            self.send(Packet::close_response(
                id.0,
                "unrecognized connectID".into(),
            ))
            .await;
            return;
        };
        let admitted = tokio::select! {
            r = gate.admit(data.len()) => r,
            _ = close.closed() => return,
        };
        match admitted {
            Ok(()) => {
                let _ = tx.unbounded_send(data);
            }
            Err(e) => {
                tracing::warn!(connection_id = id.0, error = %e, "closing the connection to protect the stream");
                let cause = match e {
                    GateError::Stalled(_) => CloseReason::Stalled,
                    GateError::Exceeded(_) => CloseReason::ProtocolError,
                };
                close.close(Some((
                    cause,
                    format!("{e}; connection closed to protect the stream"),
                )));
            }
        }
    }

    /// Shrinks the windows of connections whose data stands still and asks
    /// for their unused credit back (flow control only; never ends).
    async fn sweep_windows(&self) {
        if self.flow.is_none() {
            return std::future::pending().await;
        }
        let collect = |now, out: &mut Vec<_>| {
            for (id, h) in self.conns.lock().iter() {
                if let Some(sweep) = h.gate.sweep(now) {
                    out.push((*id, sweep));
                }
            }
        };
        let send = |id: ConnectId, bytes| self.control(Packet::window_update(id.0, bytes));
        sweep_windows(collect, send).await
    }

    fn start_dial(self: &Arc<Self>, req: konnectivity_proto::DialRequest) {
        let dial_id = DialId(req.random);
        let connect = ConnectId(self.next_id.fetch_add(1, Ordering::Relaxed) + 1);
        let cancel = self.closed.child_token();
        self.dials.lock().insert(dial_id, cancel.clone());
        let span = tracing::debug_span!("conn", dial_id = %dial_id, connection_id = %connect, address = %req.address);
        self.drain.spawn(
            self.clone()
                .run_connection(dial_id, connect, req, cancel)
                .instrument(span),
        );
    }

    /// Dials, then owns the connection until it ends. The task of every
    /// connection, idle ones included, is this future: an `async move`
    /// block rather than an `async fn`, which would keep its parameters
    /// twice (as passed and as moved into its body), so that the task fits
    /// tokio's 2 KiB cell (BENCHMARKS.md, P5;
    /// `a_connection_is_a_small_task`).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its parameters twice"
    )]
    fn run_connection(
        self: Arc<Self>,
        dial_id: DialId,
        connect: ConnectId,
        req: konnectivity_proto::DialRequest,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let started = Instant::now();
            let debug = self.debug.open("tunnel", None);
            let parent = crate::otlp::parent_of(&req.traceparent);
            if let Some(p) = &parent {
                p.record(&debug);
            }
            // Boxed: without tracing (the default) every connection would
            // carry the span's 152 bytes unused.
            let mut span = self.cfg.otlp.as_ref().map(|e| {
                Box::new(crate::otlp::DialSpan::new(
                    e.clone(),
                    parent,
                    dial_id.0,
                    &self.server_id.to_string(),
                    &req.address,
                ))
            });
            debug.set_target(&req.address);
            debug.set("server_id", &self.server_id);
            debug.set("dial_id", dial_id);
            debug.set_state("dialing");
            let dialed = tokio::select! {
                r = self.cfg.dialer.dial(&req.protocol, &req.address, self.cfg.dial_timeout, &self.cfg.policy) => Some(r),
                _ = cancel.cancelled() => None,
            };
            self.dials.lock().remove(&dial_id);
            // Only the dial could be cancelled: its token (a node in the
            // session's tree) is not kept for the connection's life.
            drop(cancel);
            let stream = match dialed {
                None => {
                    close_as(
                        &debug,
                        &mut span,
                        CloseReason::ClientClosed,
                        "dial cancelled by the server",
                    );
                    return;
                }
                Some(Err(e)) => {
                    let cause = if e.denied {
                        CloseReason::DialRefused
                    } else if e.timeout {
                        CloseReason::DialTimeout
                    } else {
                        CloseReason::DialFailed
                    };
                    close_as(
                        &debug,
                        &mut span,
                        cause,
                        &format!("dial failed: {}", e.text),
                    );
                    if e.denied {
                        self.metrics.dial_denied();
                        tracing::info!(address = %req.address, "dial refused by --allowed-destinations");
                    } else {
                        self.metrics.dial_failure(e.timeout);
                    }
                    tracing::debug!(error = %e, "dial failed");
                    self.send(Packet::dial_response(dial_id.0, 0, e.text)).await;
                    return;
                }
                Some(Ok(s)) => s,
            };
            self.metrics
                .dial_duration
                .record(started.elapsed().as_secs_f64());
            if let Some(peer) = stream.peer_addr() {
                debug.set_upstream(peer);
            }
            if let Some(s) = &mut span {
                s.dialed(stream.peer_addr());
            }
            debug.set("connect_id", connect);
            debug.set_state("established");
            let (tx, rx) = futures::channel::mpsc::unbounded();
            let close = CloseSignal::default();
            let gate = Arc::new(match &self.flow {
                Some(link) => link.open_recv(),
                None => {
                    // The process needs back what this connection holds: its
                    // destination has not read for the stall limit.
                    let (c, stalled) = (close.clone(), GateError::Stalled(self.cfg.stall_timeout));
                    RecvGate::Legacy(self.legacy.open(move || {
                        tracing::warn!(error = %stalled, "closing the connection to give its budget back");
                        c.close(Some((
                            CloseReason::Stalled,
                            format!("{stalled}; connection closed to protect the stream"),
                        )));
                    }))
                }
            });
            let send = self
                .flow
                .as_ref()
                .map(|link| Arc::new(link.open_send(req.flow_window)));
            self.conns.lock().insert(
                connect,
                ConnHandle {
                    to_remote: tx,
                    gate: gate.clone(),
                    send: send.clone(),
                    close: close.clone(),
                },
            );
            self.metrics.open_endpoint_connections.increment(1.0);
            // In a block of its own: a local of the function keeps its slot
            // (96 bytes) in the connection's future for the connection's life.
            let answered = {
                let mut rsp = Packet::dial_response(dial_id.0, connect.0, String::new());
                rsp.set_flow_window(gate.initial().unwrap_or(0));
                self.send(rsp).await
            };
            if answered {
                tracing::debug!("connection established");
                let established = Instant::now();
                let metrics = self.metrics.clone();
                let link = Link {
                    id: connect,
                    to_server: &self.out,
                    control: &self.control,
                    gate: &gate,
                    send: send.as_deref(),
                    tally: &debug,
                };
                tokio::select! {
                    _ = endpoint::pump(stream, link, rx, &close, |t| metrics.packet(Segment::FromAgent, t)) => {}
                    _ = self.closed.cancelled() => {}
                    _ = self.drain.stopping() => {}
                }
                // Its queue is gone with the pump: so is what it held.
                gate.discard();
                let (cause, why) =
                    note_close(&close, self.closed.is_cancelled(), self.drain.is_stopping());
                close_as(&debug, &mut span, cause, &why);
                self.metrics
                    .connection_duration
                    .record(established.elapsed().as_secs_f64());
            } else {
                close_as(
                    &debug,
                    &mut span,
                    CloseReason::ClientLost,
                    "the stream to the server ended before DIAL_RSP was sent",
                );
            }
            if let Some(s) = &send {
                s.close();
            }
            self.conns.lock().remove(&connect);
            self.metrics.open_endpoint_connections.decrement(1.0);
            if !self.closed.is_cancelled() {
                let reason = close.reason().unwrap_or_default();
                self.send(Packet::close_response(connect.0, reason)).await;
            }
            tracing::debug!("connection closed");
        }
    }

    /// Tells the server this agent is going away.
    pub async fn send_drain(&self) {
        self.send(Packet::drain()).await;
    }
}

/// Records why a dial or connection ended in `/debug/connections` and its
/// span.
fn close_as(
    debug: &Tracked,
    span: &mut Option<Box<crate::otlp::DialSpan>>,
    cause: CloseReason,
    why: &str,
) {
    debug.set_close(cause, why);
    if let Some(s) = span.take() {
        s.finish(cause, why);
    }
}

/// Why an established connection ended.
fn note_close(close: &CloseSignal, stream_gone: bool, stopping: bool) -> (CloseReason, String) {
    // The stream's end closes every connection's signal too: it is asked
    // before the signal.
    let (cause, why) = match close.cause() {
        Some(c) => return c,
        None if stream_gone => (CloseReason::ClientLost, "the stream to the server ended"),
        None if close.is_closed() => (
            CloseReason::ClientClosed,
            "closed by the server (CLOSE_REQ)",
        ),
        None if stopping => (CloseReason::Shutdown, "the agent is stopping"),
        None => (CloseReason::UpstreamClosed, "closed by the destination"),
    };
    (cause, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection's task, idle ones included, is `run_connection`'s
    /// future; at this size tokio's task cell around it (header, scheduler,
    /// span, trailer: 224 bytes) stays within 2 KiB (BENCHMARKS.md, P5).
    #[tokio::test]
    async fn a_connection_is_a_small_task() {
        let (out, _out_rx) = mpsc::channel(1);
        let (control, _ctl) = konnectivity_proto::control::channel();
        let session = Session::with_links(
            ServerId("size".into()),
            Links {
                out,
                control,
                flow_max: None,
                debug: Default::default(),
            },
            Arc::new(Metrics::new()),
            SessionConfig {
                dial_timeout: Duration::from_secs(1),
                conn_queue: 1,
                stall_timeout: Duration::from_secs(1),
                policy: Arc::new(crate::dial::policy::DestinationPolicy::default()),
                flow: link::flow::FlowPool::new(link::flow::FlowSettings::default()),
                dialer: crate::dial::destination::Dialer::default(),
                otlp: None,
            },
            Drain::new(),
        );
        let req = konnectivity_proto::DialRequest::default();
        let task = session.run_connection(DialId(1), ConnectId(1), req, CancellationToken::new());
        let size = size_of_val(&task);
        assert!(size <= 1_792, "a connection's future: {size} bytes");
    }
}
