//! One connection attempt to a proxy server: TCP (directly, or through an
//! HTTP CONNECT egress proxy: `daemon::egress_proxy`), TLS (with our ALPN
//! list plus `h2`), HTTP/2 (`link::h2grpc`: windows that grow with the link, bounded
//! by the process budget), and the `Connect` stream with the agent's
//! metadata. The server's `serverid`/`servercount` response headers come
//! back with it.

use crate::limits::MAX_GRPC_MESSAGE;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use daemon::egress_proxy::ProxiedIo;
use konnectivity_proto::Packet;
use konnectivity_proto::agent_service_client::AgentServiceClient;
use konnectivity_proto::control::ControlTx;
use konnectivity_proto::header;
use konnectivity_proto::ids::{AgentId, ServerId};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::either::Either;
use tonic::Streaming;
use tonic::metadata::MetadataValue;

/// How long one attempt (TCP, TLS, HTTP/2, response headers) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid proxy server address {0:?}")]
    Address(String),
    #[error("connecting to the proxy server: {0}")]
    Transport(String),
    /// The egress HTTP proxy failed or refused; the text names the proxy.
    #[error(transparent)]
    Proxy(#[from] daemon::egress_proxy::ProxyError),
    #[error("TLS handshake with the proxy server failed: {0}")]
    Tls(String),
    #[error("proxy server refused the stream: {0}")]
    Refused(String),
    #[error("reading the service account token {path}: {source}")]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("expected one server ID in the response headers, got {0}")]
    ServerId(usize),
    #[error("expected one server count in the response headers, got {0:?}")]
    ServerCount(Vec<String>),
    #[error("connection attempt timed out after {0:?}")]
    TimedOut(Duration),
}

/// What an agent presents to every server.
#[derive(Clone)]
pub struct Connector {
    /// The server's name: dialled (unless `addr` is set) and verified.
    pub host: String,
    pub port: u16,
    /// Connect to this address instead of resolving `host` (one address of
    /// a name resolved by [`crate::servers`]).
    pub addr: Option<std::net::SocketAddr>,
    /// Reloaded when its files change; each attempt takes the current one.
    pub tls: daemon::tls::reload::Reloading<rustls::ClientConfig>,
    pub agent_id: AgentId,
    pub identifiers: String,
    pub token_path: Option<PathBuf>,
    pub keepalive: Duration,
    pub keepalive_timeout: Duration,
    /// The least time between two keepalive PINGs (`--keepalive-min-interval`).
    pub keepalive_min_interval: Duration,
    /// Flow-control settings (offered to the server unless off: then the
    /// agent behaves exactly as upstream's), the budget and window totals.
    pub flow: Arc<link::flow::FlowPool>,
    /// The HTTP proxy servers are reached through, if any
    /// (`--proxy-server-http-proxy`, `HTTPS_PROXY`).
    pub egress: Arc<daemon::egress_proxy::EgressProxy>,
}

/// An open `Connect` stream.
pub struct Connection {
    pub server_id: ServerId,
    pub server_count: u32,
    pub inbound: Streaming<Packet>,
    /// DATA and everything whose order matters.
    pub outbound: mpsc::Sender<Packet>,
    /// WINDOW_UPDATEs, sent ahead of DATA.
    pub control: ControlTx,
    /// The largest window the server agreed to; `None` when it is not one of
    /// ours (or flow control is off here).
    pub flow_max: Option<i64>,
}

impl Connector {
    pub async fn connect(&self, queue: usize) -> Result<Connection, ConnectError> {
        tokio::time::timeout(ATTEMPT_TIMEOUT, self.attempt(queue))
            .await
            .map_err(|_| ConnectError::TimedOut(ATTEMPT_TIMEOUT))?
    }

    /// `host:port` of the proxy server (`[v6]:port`).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    async fn attempt(&self, queue: usize) -> Result<Connection, ConnectError> {
        let authority = self.authority();
        // TLS is done here; the URI only names the server for HTTP/2.
        let origin = http::Uri::try_from(format!("https://{authority}"))
            .map_err(|_| ConnectError::Address(authority.clone()))?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|_| ConnectError::Address(self.host.clone()))?;
        let tls = TlsConnector::from(self.tls.current());
        let tcp = self.open().await?;
        let stream = tls
            .connect(name, daemon::tls::read_buffered(tcp))
            .await
            .map_err(|e| match daemon::tls::find_rustls_error(&e) {
                Some(t) => ConnectError::Tls(daemon::tls::explain(t)),
                None => ConnectError::Transport(source_chain(&e)),
            })?;
        let tls_error = Arc::new(std::sync::OnceLock::new());
        let stream = daemon::tls::NoteTlsError::new(stream, tls_error.clone());
        let channel = link::h2grpc::connect(stream, &self.h2_config())
            .await
            .map_err(|e| match tls_error.get() {
                Some(t) => ConnectError::Tls(t.clone()),
                None => ConnectError::Transport(source_chain(&e)),
            })?;

        let (tx, rx) = mpsc::channel(queue);
        let (control_tx, mut control_rx) = konnectivity_proto::control::channel();
        let outbound = futures::stream::select_with_strategy(
            futures::stream::poll_fn(move |cx| control_rx.poll_recv(cx)),
            ReceiverStream::new(rx),
            // Credit first: the server must not wait for it behind our data.
            |_: &mut ()| futures::stream::PollNext::Left,
        );
        let mut request = tonic::Request::new(outbound);
        let md = request.metadata_mut();
        let id = MetadataValue::try_from(self.agent_id.0.as_str())
            .map_err(|_| ConnectError::Address("agent id is not valid header text".into()))?;
        md.insert(header::AGENT_ID, id);
        let idents = MetadataValue::try_from(self.identifiers.as_str()).map_err(|_| {
            ConnectError::Address("agent identifiers are not valid header text".into())
        })?;
        md.insert(header::AGENT_IDENTIFIERS, idents);
        if let Some(max) = self.flow.offer() {
            let offer = MetadataValue::try_from(link::flow::offer(max)).map_err(|_| {
                ConnectError::Address("flow-control offer is not header text".into())
            })?;
            md.insert(header::FLOW_CONTROL, offer);
        }
        if let Some(path) = &self.token_path {
            // Re-read on every connection so a rotated token is picked up.
            let token = std::fs::read_to_string(path).map_err(|source| ConnectError::Token {
                path: path.clone(),
                source,
            })?;
            let v = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| ConnectError::Address("token is not valid header text".into()))?;
            md.insert(header::AUTHORIZATION, v);
        }

        let mut client = AgentServiceClient::with_origin(channel, origin)
            .max_decoding_message_size(MAX_GRPC_MESSAGE)
            .max_encoding_message_size(MAX_GRPC_MESSAGE);
        let response = client
            .connect(request)
            .await
            .map_err(|s| match tls_error.get() {
                Some(t) => ConnectError::Tls(t.clone()),
                None => refused(&s),
            })?;
        let md = response.metadata();
        let ids: Vec<_> = md
            .get_all(header::SERVER_ID)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let [server_id] = ids.as_slice() else {
            return Err(ConnectError::ServerId(ids.len()));
        };
        let server_id = ServerId((*server_id).to_string());
        let counts: Vec<String> = md
            .get_all(header::SERVER_COUNT)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let server_count = match counts.as_slice() {
            [one] => one
                .parse::<u32>()
                .map_err(|_| ConnectError::ServerCount(counts.clone()))?,
            _ => return Err(ConnectError::ServerCount(counts)),
        };
        // Only a server of ours answers the offer; take no more than we offered.
        let flow_max = self.flow.offer().and_then(|ours| {
            link::flow::parse_offer(md.get(header::FLOW_CONTROL).and_then(|v| v.to_str().ok()))
                .map(|theirs| theirs.min(ours))
        });
        Ok(Connection {
            server_id,
            server_count,
            inbound: response.into_inner(),
            outbound: tx,
            control: control_tx,
            flow_max,
        })
    }
}

impl Connector {
    /// The byte stream TLS runs on: a TCP connection to the server, or a
    /// CONNECT tunnel through the egress proxy. Through the proxy the
    /// tunnel's target is the address resolved here (with
    /// `--resolve-proxy-server-host`) or else the name, which the proxy
    /// resolves; TLS still verifies the name.
    async fn open(&self) -> Result<Either<TcpStream, ProxiedIo>, ConnectError> {
        let ip = self.addr.map(|a| a.ip());
        let Some(proxy) = self.egress.proxy_for(&self.host, ip, self.port) else {
            let tcp = match self.addr {
                Some(a) => TcpStream::connect(a).await,
                None => TcpStream::connect((self.host.as_str(), self.port)).await,
            }
            .map_err(|e| ConnectError::Transport(source_chain(&e)))?;
            let _ = tcp.set_nodelay(true);
            return Ok(Either::Left(tcp));
        };
        let target = ip.map_or_else(|| self.host.clone(), |ip| ip.to_string());
        let io = proxy.connect(&target, self.port).await?;
        tracing::info!(server = %self.authority(), %proxy, "tunnel to the proxy server opened through the HTTP proxy");
        Ok(Either::Right(io))
    }
}

/// Why the `Connect` call failed. With TLS 1.3 a server that refuses our
/// client certificate says so only after the handshake, so the TLS alert
/// arrives here, inside the status.
fn refused(s: &tonic::Status) -> ConnectError {
    use std::error::Error as _;
    if let Some(t) = daemon::tls::find_rustls_error(s) {
        return ConnectError::Tls(daemon::tls::explain(t));
    }
    match s.source() {
        Some(transport) => ConnectError::Transport(source_chain(transport)),
        None => ConnectError::Refused(format!(
            "{}: {}",
            konnectivity_proto::code_name(s.code()),
            s.message()
        )),
    }
}

impl Connector {
    /// The server link's HTTP/2: one stream carries every connection, so
    /// the connection window is the stream window; it grows from 1 MiB with
    /// the link up to `--http2-max-window`, reserved from the process budget.
    fn h2_config(&self) -> link::h2grpc::H2Config {
        let max = self.flow.settings.http2_max_window;
        link::h2grpc::H2Config {
            window: link::h2window::WindowSettings {
                initial: link::flow::HTTP2_INITIAL_WINDOW.min(max),
                max,
                connection_budget: i64::from(max),
                idle: WINDOW_IDLE,
                single_stream: true,
            },
            keepalive: Some(link::h2window::Keepalive {
                interval: self.keepalive,
                timeout: self.keepalive_timeout,
                min_gap: self.keepalive_min_interval,
            }),
            max_frame_size: crate::limits::MAX_FRAME_SIZE,
            max_header_list_size: 64 << 10,
            max_concurrent_streams: 100,
            max_send_buffer: 1 << 20,
            process_budget: self.flow.budget.clone(),
            stats: self.flow.http2.clone(),
            // A client: the server's control frames are not budgeted.
            control_frames: link::h2flood::Limits::default(),
        }
    }
}

/// The least time between two PINGs to a server by default
/// (`--keepalive-min-interval`). Upstream's server answers
/// PINGs that arrive less than 30 s apart with GOAWAY `too_many_pings`
/// (grpc-go's enforcement policy, MinTime 30 s, timed on arrival, three
/// strikes); one second more absorbs the network's jitter. Servers of this
/// project PING an idle agent every 15 s themselves, which keeps the agent's
/// own PINGs from being needed at all.
pub const MIN_PING_GAP: Duration = Duration::from_secs(31);

/// How long the server link's data may stop before its window shrinks.
/// grpc-go's windows never shrink; growing again costs a round trip per
/// doubling, so only a link idle for half a minute gives its budget back.
const WINDOW_IDLE: Duration = Duration::from_secs(30);

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
