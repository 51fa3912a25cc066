//! `/ProxyService/Proxy`: one stream per dial, as kube-apiserver's
//! konnectivity-client opens them.

use std::sync::Arc;

use daemon::drain::Drain;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::proxy_service_server::ProxyService;
use konnectivity_proto::{Packet, PacketExt, PacketType};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::core::{Core, Flow};
use crate::frontend::FrontendStream;
use crate::metrics::{Segment, Service};
use crate::tunnel::{FrontendQueue, Tunnel};

pub struct ProxySvc {
    pub core: Arc<Core>,
    pub drain: Drain,
    /// The frontend's address (TCP); `None` on the Unix socket.
    pub source: Option<std::net::SocketAddr>,
}

#[tonic::async_trait]
impl ProxyService for ProxySvc {
    type ProxyStream = FrontendStream;

    async fn proxy(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<FrontendStream>, Status> {
        let user_agent = request
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|v| crate::traceparent::TraceParent::parse(v.as_bytes()));
        let inbound = request.into_inner();
        let (tunnel, queue) = Tunnel::tracked(Some(self.core.debug.open("grpc", self.source)));
        if let (Some(tp), Some(d)) = (traceparent, tunnel.debug()) {
            tp.record(d);
        }
        self.core.start_trace(&tunnel, "grpc", traceparent);
        let span = tracing::debug_span!("proxy", tunnel = tunnel.id, user_agent = %user_agent);
        let task = tunnel_task(
            self.core.clone(),
            tunnel.clone(),
            inbound,
            self.drain.clone(),
        );
        self.drain.spawn(task.instrument(span));
        // The response headers go out with the first packet (the DIAL_RSP),
        // as grpc-go sends them with the first message in upstream's server:
        // one write to the frontend instead of two, and one wake-up of the
        // client less per dial (BENCHMARKS.md, P4).
        let first = first_packet(&queue).await;
        Ok(Response::new(FrontendStream::new(
            queue,
            first,
            tunnel,
            self.core.metrics.clone(),
        )))
    }
}

/// Waits for the first packet queued for the frontend, or for the tunnel to
/// finish without one (aborts finish it too). The tunnel's task serves the
/// frontend's stream meanwhile; if the frontend goes away first, hyper drops
/// this wait.
async fn first_packet(queue: &FrontendQueue) -> Option<Packet> {
    tokio::select! {
        biased;
        p = queue.rx.recv() => p,
        _ = queue.finished.cancelled() => queue.rx.try_recv(),
    }
}

/// The tunnel's task: serves the frontend's stream, then lingers on it.
/// Every tunnel, idle ones included, is this future, so it keeps `inbound`
/// (232 bytes) once: an `async move` block rather than an `async fn`, which
/// would keep its parameters twice, and `inbound` lent to `serve` rather
/// than moved into it (`a_tunnel_is_a_small_task`; BENCHMARKS.md, P5).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its parameters twice"
)]
fn tunnel_task(
    core: Arc<Core>,
    t: Arc<Tunnel>,
    mut inbound: Streaming<Packet>,
    drain: Drain,
) -> impl Future<Output = ()> + Send + 'static {
    async move {
        let gauge = core.metrics.grpc_connections(Service::Proxy);
        gauge.increment(1.0);
        if serve(&core, &t, &mut inbound, &drain).await {
            core.frontend_gone(&t).await;
            linger(&core, inbound, &drain).await;
        } else {
            // Gone before the tunnel ends, as it would be inside `serve`.
            drop(inbound);
            core.frontend_gone(&t).await;
        }
        gauge.decrement(1.0);
    }
}

/// Reads the frontend's packets until it ends, the tunnel finishes, the dial
/// deadline passes or the server stops. Returns whether the frontend's
/// stream is still open.
async fn serve(
    core: &Core,
    tunnel: &Arc<Tunnel>,
    inbound: &mut Streaming<Packet>,
    drain: &Drain,
) -> bool {
    loop {
        let deadline = Core::dial_deadline(tunnel);
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = tunnel.finished() => return true,
            _ = drain.stopping() => {
                tunnel.abort(crate::tunnel::Abort::Shutdown);
                return false;
            }
            _ = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } else { std::future::pending().await } } => {
                // Boxed, as the rare packets in `handle` are.
                if let Some(dial) = Box::pin(core.expire_dial(tunnel)).await {
                    let rsp = Packet::dial_response(dial.0, 0, crate::core::DialRefused::TimedOut.to_string());
                    tunnel.deliver_last(rsp);
                    return true;
                }
                continue;
            }
        };
        let pkt = match msg {
            Ok(Some(pkt)) => pkt,
            Ok(None) => {
                // See `linger`: grpc-go reports a client going away as Canceled.
                core.metrics
                    .stream_error(Segment::FromClient, tonic::Code::Cancelled, "Unknown");
                tracing::debug!("frontend closed its stream");
                return false;
            }
            Err(status) => {
                core.metrics
                    .stream_error(Segment::FromClient, client_code(&status), "Unknown");
                tracing::debug!(code = konnectivity_proto::code_name(status.code()), error = %status.message(), "frontend stream failed");
                // Tell the frontend why, if it is still listening.
                tunnel.abort(crate::tunnel::Abort::Frontend(
                    status.code(),
                    status.message().to_string(),
                ));
                return false;
            }
        };
        core.metrics.packet(Segment::FromClient, pkt.r#type);
        if handle(core, tunnel, pkt).await == Flow::End {
            return true;
        }
    }
}

/// After the tunnel is over, reads (and drops) what the frontend still sends
/// until it goes away, as upstream does, and counts its going away in
/// `stream_errors_total` as upstream's grpc-go sees it: `Canceled` (the
/// konnectivity-client never half-closes; it closes its connection, and
/// hyper may already have ended the request stream itself once the response
/// was complete). Bounded by the client's own close timeout.
async fn linger(core: &Core, mut inbound: Streaming<Packet>, drain: &Drain) {
    let until = tokio::time::sleep(LINGER);
    tokio::pin!(until);
    loop {
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = &mut until => return,
            _ = drain.draining() => return,
        };
        match msg {
            Ok(Some(pkt)) => core.metrics.packet(Segment::FromClient, pkt.r#type),
            Ok(None) | Err(_) => {
                core.metrics
                    .stream_error(Segment::FromClient, tonic::Code::Cancelled, "Unknown");
                return;
            }
        }
    }
}

/// The code grpc-go would report for a failed read of the client's stream:
/// a client that reset its stream or dropped its connection surfaces in
/// tonic as `Unknown`, in grpc-go as `Canceled`; decode errors keep theirs.
fn client_code(status: &tonic::Status) -> tonic::Code {
    match status.code() {
        tonic::Code::Unknown => tonic::Code::Cancelled,
        other => other,
    }
}

/// konnectivity-client waits this long for CLOSE_RSP before it gives up.
const LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// One packet from the frontend. What comes once per tunnel (the dial, its
/// close) is boxed: inline, every idle tunnel's task would be as large as
/// the dial's future (1.9 KiB) for its whole life, when only DATA, which is
/// kept inline, comes often (BENCHMARKS.md, P5).
pub(crate) async fn handle(core: &Core, tunnel: &Arc<Tunnel>, pkt: Packet) -> Flow {
    match (PacketType::try_from(pkt.r#type), &pkt.payload) {
        (Ok(PacketType::DialReq), Some(Payload::DialRequest(req))) => {
            let random = req.random;
            match Box::pin(core.dial(tunnel, pkt)).await {
                Ok(()) => Flow::Continue,
                Err(why) => {
                    tracing::debug!(dial_id = random, error = %why, "dial refused");
                    let rsp = Packet::dial_response(random, 0, why.to_string());
                    tunnel.deliver_last(rsp);
                    Flow::End
                }
            }
        }
        (Ok(PacketType::Data), _) => core.frontend_data(tunnel, pkt).await,
        (Ok(PacketType::CloseReq), Some(Payload::CloseRequest(c))) => {
            Box::pin(core.frontend_close(tunnel, c.connect_id)).await
        }
        (Ok(PacketType::DialCls), Some(Payload::CloseDial(c))) => {
            Box::pin(core.frontend_dial_close(tunnel, c.random)).await
        }
        _ => {
            tracing::debug!(
                packet_type = pkt.r#type,
                "ignoring unexpected packet from frontend"
            );
            Flow::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backends, Strategy};
    use crate::metrics::Metrics;

    /// What an idle tunnel's task waits in holds `handle` inline: the
    /// once-per-tunnel packets (the dial and its close) are boxed, so it is
    /// sized by DATA's handling, well below the dial's (BENCHMARKS.md, P5).
    /// The bounds are relative, so they hold whatever the build profile.
    #[test]
    fn handling_a_packet_is_sized_by_data_not_by_the_dial() {
        let metrics = Arc::new(Metrics::new());
        let core = Core::new(
            Backends::new(vec![Strategy::Default], metrics.clone()),
            metrics,
            crate::fuzzing::small_config(),
        );
        let (tunnel, _queue) = Tunnel::tracked(None);
        let dial = size_of_val(&core.dial(&tunnel, Packet::close_request(1)));
        let handled = size_of_val(&handle(&core, &tunnel, Packet::close_request(1)));
        let data = size_of_val(&core.frontend_data(&tunnel, Packet::close_request(1)));
        assert!(
            handled <= data + 512 && handled + 512 <= dial,
            "handle: {handled} bytes; the dial {dial}, DATA {data}"
        );
    }

    /// At this size tokio's task cell around the tunnel's future (header,
    /// scheduler, span, drain tracking, trailer: 256 bytes) stays within
    /// 2 KiB (BENCHMARKS.md, P5).
    #[tokio::test]
    async fn a_tunnel_is_a_small_task() {
        use tonic::codec::Codec;
        let metrics = Arc::new(Metrics::new());
        let core = Arc::new(Core::new(
            Backends::new(vec![Strategy::Default], metrics.clone()),
            metrics,
            crate::fuzzing::small_config(),
        ));
        let (tunnel, _queue) = Tunnel::tracked(None);
        let mut codec = konnectivity_proto::codec::PacketCodec::<Packet, Packet>::default();
        let inbound =
            Streaming::new_request(codec.decoder(), tonic::body::Body::empty(), None, None);
        let task = tunnel_task(core, tunnel, inbound, Drain::new());
        let size = size_of_val(&task);
        assert!(size <= 1_792, "a tunnel's future: {size} bytes");
    }
}
