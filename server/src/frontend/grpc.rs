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
use crate::tunnel::Tunnel;

pub struct ProxySvc {
    pub core: Arc<Core>,
    pub drain: Drain,
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
        let inbound = request.into_inner();
        let (tunnel, queue) = Tunnel::new(self.core.cfg.frontend_queue);
        let span = tracing::debug_span!("proxy", tunnel = tunnel.id, user_agent = %user_agent);
        let core = self.core.clone();
        let drain = self.drain.clone();
        let t = tunnel.clone();
        self.drain.spawn(
            async move {
                let gauge = core.metrics.grpc_connections(Service::Proxy);
                gauge.increment(1.0);
                serve(&core, &t, inbound, &drain).await;
                core.frontend_gone(&t).await;
                gauge.decrement(1.0);
            }
            .instrument(span),
        );
        Ok(Response::new(FrontendStream::new(
            queue,
            tunnel,
            self.core.metrics.clone(),
        )))
    }
}

/// Reads the frontend's packets until it ends, the tunnel finishes, the dial
/// deadline passes or the server stops.
async fn serve(core: &Core, tunnel: &Arc<Tunnel>, mut inbound: Streaming<Packet>, drain: &Drain) {
    loop {
        let deadline = Core::dial_deadline(tunnel);
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = tunnel.finished() => return,
            _ = drain.stopping() => {
                tunnel.abort(crate::tunnel::Abort::Shutdown);
                return;
            }
            _ = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } else { std::future::pending().await } } => {
                if let Some(dial) = core.expire_dial(tunnel).await {
                    let rsp = Packet::dial_response(dial.0, 0, crate::core::DialRefused::TimedOut.to_string());
                    tunnel.deliver_last(rsp, core.cfg.stall_timeout).await;
                    return;
                }
                continue;
            }
        };
        let pkt = match msg {
            Ok(Some(pkt)) => pkt,
            Ok(None) => {
                tracing::debug!("frontend closed its stream");
                return;
            }
            Err(status) => {
                core.metrics
                    .stream_error(Segment::FromClient, status.code(), "Unknown");
                tracing::debug!(%status, "frontend stream failed");
                // Tell the frontend why, if it is still listening.
                tunnel.abort(crate::tunnel::Abort::Frontend(
                    status.code(),
                    status.message().to_string(),
                ));
                return;
            }
        };
        core.metrics.packet(Segment::FromClient, pkt.r#type);
        if handle(core, tunnel, pkt).await == Flow::End {
            return;
        }
    }
}

async fn handle(core: &Core, tunnel: &Arc<Tunnel>, pkt: Packet) -> Flow {
    match (PacketType::try_from(pkt.r#type), &pkt.payload) {
        (Ok(PacketType::DialReq), Some(Payload::DialRequest(req))) => {
            let random = req.random;
            match core.dial(tunnel, pkt).await {
                Ok(()) => Flow::Continue,
                Err(why) => {
                    tracing::debug!(dial_id = random, error = %why, "dial refused");
                    let rsp = Packet::dial_response(random, 0, why.to_string());
                    tunnel.deliver_last(rsp, core.cfg.stall_timeout).await;
                    Flow::End
                }
            }
        }
        (Ok(PacketType::Data), _) => core.frontend_data(tunnel, pkt).await,
        (Ok(PacketType::CloseReq), Some(Payload::CloseRequest(c))) => {
            core.frontend_close(tunnel, c.connect_id).await
        }
        (Ok(PacketType::DialCls), Some(Payload::CloseDial(c))) => {
            core.frontend_dial_close(tunnel, c.random).await
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
