//! `/AgentService/Connect`: agents connect out to the server; each stream
//! becomes a backend that dials can be routed to.

use std::pin::Pin;
use std::sync::Arc;

use daemon::drain::Drain;
use futures::{Stream, StreamExt};
use konnectivity_proto::Packet;
use konnectivity_proto::agent_service_server::AgentService;
use konnectivity_proto::header::{self, AgentIdentifiers};
use konnectivity_proto::ids::{AgentId, ConnectId, ServerId};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::backend::{AgentLinks, Backend};
use crate::core::Core;
use crate::metrics::{Segment, Service};
use crate::tunnel::Tunnel;

pub struct AgentSvc {
    pub core: Arc<Core>,
    pub drain: Drain,
    pub server_id: ServerId,
    pub server_count: u32,
    /// Token authentication (`--agent-namespace` …), checked before the
    /// response headers are sent.
    pub auth: Option<Arc<crate::auth::TokenAuthenticator>>,
}

pub type AgentStream = Pin<Box<dyn Stream<Item = Result<Packet, Status>> + Send>>;

/// Metadata values as Go's `%v` prints a `[]string`: `[a b]`.
fn go_list(values: &[&tonic::metadata::MetadataValue<tonic::metadata::Ascii>]) -> String {
    let shown: Vec<String> = values
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    format!("[{}]", shown.join(" "))
}

/// Reads the agent's identity from the request metadata, as upstream does:
/// exactly one `agentid`, at most one `agentidentifiers`.
pub fn agent_identity(
    md: &tonic::metadata::MetadataMap,
) -> Result<(AgentId, AgentIdentifiers), Status> {
    let ids: Vec<_> = md.get_all(header::AGENT_ID).iter().collect();
    let [id] = ids.as_slice() else {
        return Err(Status::unknown(format!(
            "expected one agent ID in the context, got {}",
            go_list(&ids)
        )));
    };
    let id = id
        .to_str()
        .map_err(|_| Status::unknown("agent ID is not valid text"))?
        .to_string();
    let idents: Vec<_> = md.get_all(header::AGENT_IDENTIFIERS).iter().collect();
    let identifiers = match idents.as_slice() {
        [] => AgentIdentifiers::default(),
        [one] => {
            let text = one
                .to_str()
                .map_err(|_| Status::unknown("agent identifiers are not valid text"))?;
            AgentIdentifiers::parse_lenient(text)
                .map_err(|e| Status::unknown(format!("fail to parse url encoded string: {e}")))?
        }
        many => {
            return Err(Status::unknown(format!(
                "expected at most one set of agent identifiers in the context, got {}",
                go_list(many)
            )));
        }
    };
    Ok((AgentId(id), identifiers))
}

#[tonic::async_trait]
impl AgentService for AgentSvc {
    type ConnectStream = AgentStream;

    async fn connect(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<AgentStream>, Status> {
        let (agent_id, identifiers) = agent_identity(request.metadata()).inspect_err(|e| {
            tracing::warn!(error = %e.message(), "rejecting agent stream");
        })?;
        if let Some(auth) = &self.auth {
            auth.authenticate(request.metadata())
                .await
                .inspect_err(|e| {
                    tracing::warn!(agent_id = %agent_id, error = %e.message(), "client authentication failed");
                })?;
        }
        // Flow control when the agent announces it and we have it on, with
        // the smaller of the two largest windows. Upstream agents never do.
        let offered = link::flow::parse_offer(
            request
                .metadata()
                .get(header::FLOW_CONTROL)
                .and_then(|v| v.to_str().ok()),
        );
        let flow = self.core.flow.link(offered);
        let legacy = self
            .core
            .flow
            .legacy_link(self.core.cfg.frontend_queue, self.core.cfg.stall_timeout);
        let flow_max = flow.as_ref().map(|f| f.cfg.max);
        let inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(self.core.cfg.agent_queue);
        let (control_tx, mut control_rx) = konnectivity_proto::control::channel();
        let backend = Backend::new(
            agent_id.clone(),
            identifiers,
            AgentLinks {
                data: tx,
                control: control_tx,
                flow,
                legacy,
            },
            self.core.metrics.clone(),
            self.core.backends.changes(),
        );
        tracing::info!(agent_id = %agent_id, stream = backend.id, flow_max, "agent connected");
        self.core.backends.add(backend.clone());

        let span = tracing::info_span!("agent", agent_id = %agent_id, stream = backend.id);
        let core = self.core.clone();
        let drain = self.drain.clone();
        let b = backend.clone();
        self.drain.spawn(
            async move {
                let gauge = core.metrics.grpc_connections(Service::Connect);
                gauge.increment(1.0);
                tokio::select! {
                    _ = serve(&core, &b, inbound, &drain) => {}
                    _ = sweep_windows(&b) => {}
                }
                core.agent_gone(&b).await;
                gauge.decrement(1.0);
                tracing::info!("agent stream closed");
            }
            .instrument(span),
        );

        // The stream to the agent ends as soon as the backend is retired, even
        // while tunnels still hold a sender.
        let retired = backend.clone();
        let queue = backend.clone();
        let outbound = futures::stream::select_with_strategy(
            futures::stream::poll_fn(move |cx| control_rx.poll_recv(cx)),
            ReceiverStream::new(rx).inspect(move |p| queue.taken(p)),
            // Credit first: an agent waiting for credit must not wait behind data.
            |_: &mut ()| futures::stream::PollNext::Left,
        )
        .take_until(async move { retired.retired().await })
        .map(Ok);
        let mut response = Response::new(Box::pin(outbound) as AgentStream);
        let md = response.metadata_mut();
        if let Ok(v) = MetadataValue::try_from(self.server_id.0.as_str()) {
            md.insert(header::SERVER_ID, v);
        }
        md.insert(header::SERVER_COUNT, MetadataValue::from(self.server_count));
        if let Some(max) = flow_max
            && let Ok(v) = MetadataValue::try_from(link::flow::offer(max))
        {
            md.insert(header::FLOW_CONTROL, v);
        }
        Ok(response)
    }
}

/// Shrinks the windows of this agent's connections whose data stands still
/// and asks for their unused credit back (flow control only; never ends).
async fn sweep_windows(backend: &Backend<Tunnel>) {
    use konnectivity_proto::PacketExt;
    if backend.flow().is_none() {
        return std::future::pending().await;
    }
    let collect = |now, out: &mut Vec<_>| {
        backend.for_each_conn(|id, t| {
            if let Some(sweep) = t.flow().and_then(|f| f.recv.sweep(now)) {
                out.push((id, sweep));
            }
        })
    };
    let send = |id: ConnectId, bytes| backend.control(Packet::window_update(id.0, bytes));
    link::flow::sweep_windows(collect, send).await
}

async fn serve(
    core: &Core,
    backend: &Arc<Backend<Tunnel>>,
    mut inbound: Streaming<Packet>,
    drain: &Drain,
) {
    loop {
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = backend.retired() => return,
            _ = drain.stopping() => return,
        };
        match msg {
            Ok(Some(pkt)) => core.agent_packet(backend, pkt).await,
            Ok(None) => return,
            Err(status) => {
                core.metrics
                    .stream_error(Segment::FromAgent, status.code(), "Unknown");
                tracing::info!(code = konnectivity_proto::code_name(status.code()), error = %status.message(), "agent stream failed");
                return;
            }
        }
    }
}
