//! A frontend for the tests, dialing the way kube-apiserver does: a fresh
//! connection and one `Proxy` stream per dial (gRPC), or `CONNECT addr
//! HTTP/1.1` with `Host: 127.0.0.1` (HTTP-CONNECT). The Go client itself is
//! exercised by the interop suite.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::proxy_service_client::ProxyServiceClient;
use konnectivity_proto::{Packet, PacketExt, PacketType};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Where the server's frontend listens.
#[derive(Clone)]
pub enum Frontend {
    Uds(PathBuf),
    Tcp {
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
    },
}

/// Any byte stream to the frontend.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

impl Frontend {
    /// Opens a raw connection (Unix socket, or TLS over TCP).
    pub async fn connect(&self) -> std::io::Result<Box<dyn Io>> {
        match self {
            Frontend::Uds(p) => Ok(Box::new(tokio::net::UnixStream::connect(p).await?)),
            Frontend::Tcp { addr, tls } => {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
                let s = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(name, tcp)
                    .await?;
                Ok(Box::new(s))
            }
        }
    }

    /// A gRPC client on a new HTTP/2 connection, as kube-apiserver makes per
    /// dial. The connection's task is returned so a test can wait for the
    /// socket to be really closed.
    pub async fn grpc_client(&self) -> std::io::Result<(ProxyServiceClient<H2>, JoinHandle<()>)> {
        let io = self.connect().await?;
        let (send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(TokioIo::new(io))
                .await
                .map_err(std::io::Error::other)?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        let origin: http::Uri = "http://localhost".parse().map_err(std::io::Error::other)?;
        Ok((ProxyServiceClient::with_origin(H2(send), origin), task))
    }
}

/// One HTTP/2 connection as a tower service, for tonic's generated client.
#[derive(Clone)]
pub struct H2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// One dialed connection over a `Proxy` stream.
pub struct GrpcTunnel {
    pub tx: mpsc::Sender<Packet>,
    pub rx: Inbound,
    pub connect_id: i64,
    pub dial_id: i64,
    pending: BytesMut,
    conn: Option<JoinHandle<()>>,
}

/// The server or agent refused the dial.
#[derive(Debug)]
pub struct DialFailed(pub String);

/// Opens a stream, sends DIAL_REQ and waits for DIAL_RSP.
pub async fn grpc_dial(frontend: &Frontend, address: &str) -> Result<GrpcTunnel, DialFailed> {
    grpc_dial_with(frontend, address, &[]).await
}

/// [`grpc_dial`] with `metadata` on the `Proxy` call (a `traceparent`, say).
pub async fn grpc_dial_with(
    frontend: &Frontend,
    address: &str,
    metadata: &[(&'static str, &str)],
) -> Result<GrpcTunnel, DialFailed> {
    let (tx, rx, conn) = open_stream_with(frontend, metadata).await;
    let dial_id = konnectivity_proto::ids::DialId::random().0;
    tx.send(Packet::dial_request("tcp", address, dial_id))
        .await
        .unwrap();
    let t = GrpcTunnel {
        tx,
        rx,
        connect_id: 0,
        dial_id,
        pending: BytesMut::new(),
        conn: Some(conn),
    };
    answered(t).await
}

async fn answered(mut t: GrpcTunnel) -> Result<GrpcTunnel, DialFailed> {
    match t.rx.message().await {
        Ok(Some(Packet {
            payload: Some(Payload::DialResponse(r)),
            ..
        })) if r.error.is_empty() && r.random == t.dial_id => {
            t.connect_id = r.connect_id;
            Ok(t)
        }
        Ok(Some(Packet {
            payload: Some(Payload::DialResponse(r)),
            ..
        })) => {
            t.finish().await;
            Err(DialFailed(r.error))
        }
        other => Err(DialFailed(format!(
            "unexpected answer to DIAL_REQ: {other:?}"
        ))),
    }
}

/// Opens a stream and sends DIAL_REQ without waiting for the answer.
pub async fn start_dial(frontend: &Frontend, address: &str) -> GrpcTunnel {
    let (tx, rx, conn) = open_stream_owned(frontend).await;
    let dial_id = konnectivity_proto::ids::DialId::random().0;
    tx.send(Packet::dial_request("tcp", address, dial_id))
        .await
        .unwrap();
    GrpcTunnel {
        tx,
        rx,
        connect_id: 0,
        dial_id,
        pending: BytesMut::new(),
        conn: Some(conn),
    }
}

/// Opens a bare `Proxy` stream (for tests that send odd packets).
pub async fn open_stream(frontend: &Frontend) -> (mpsc::Sender<Packet>, Inbound) {
    let (tx, rx, _conn) = open_stream_owned(frontend).await;
    (tx, rx)
}

async fn open_stream_owned(frontend: &Frontend) -> (mpsc::Sender<Packet>, Inbound, JoinHandle<()>) {
    open_stream_with(frontend, &[]).await
}

async fn open_stream_with(
    frontend: &Frontend,
    metadata: &[(&'static str, &str)],
) -> (mpsc::Sender<Packet>, Inbound, JoinHandle<()>) {
    let (mut client, conn) = frontend.grpc_client().await.unwrap();
    let (tx, rx) = mpsc::channel(64);
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    for (k, v) in metadata {
        req.metadata_mut().insert(*k, v.parse().unwrap());
    }
    // The call runs on its own task: it sends the request and what `tx`
    // queues, and resolves only with the server's first packet.
    let call = tokio::spawn(async move { client.proxy(req).await });
    (tx, Inbound(InboundState::Pending(call)), conn)
}

/// The server's half of a `Proxy` stream. Like upstream's grpc-go server,
/// the server sends its response headers with its first packet, so the
/// response is awaited at the first read, not when the stream opens.
pub struct Inbound(InboundState);

type ProxyCall = JoinHandle<Result<tonic::Response<Streaming<Packet>>, tonic::Status>>;

enum InboundState {
    Pending(ProxyCall),
    Open(Box<Streaming<Packet>>),
}

impl Drop for Inbound {
    // Dropping the stream before its first packet cancels the call, as
    // dropping a tonic stream resets it.
    fn drop(&mut self) {
        if let InboundState::Pending(call) = &self.0 {
            call.abort();
        }
    }
}

impl Inbound {
    /// The next packet, as [`Streaming::message`].
    pub async fn message(&mut self) -> Result<Option<Packet>, tonic::Status> {
        if let InboundState::Pending(call) = &mut self.0 {
            let stream = call
                .await
                .map_err(|e| tonic::Status::internal(format!("proxy call task: {e}")))??
                .into_inner();
            self.0 = InboundState::Open(Box::new(stream));
        }
        match &mut self.0 {
            InboundState::Open(stream) => stream.message().await,
            InboundState::Pending(_) => unreachable!("resolved above"),
        }
    }
}

impl GrpcTunnel {
    /// Sends `data` as DATA packets of at most 32 KiB, like `conn.Write` chunks.
    pub async fn write(&self, data: &[u8]) {
        for chunk in data.chunks(32 * 1024) {
            self.tx
                .send(Packet::data(self.connect_id, Bytes::copy_from_slice(chunk)))
                .await
                .unwrap();
        }
    }

    /// The next DATA payload; `None` once the connection is closed.
    pub async fn read(&mut self) -> Option<Bytes> {
        if !self.pending.is_empty() {
            return Some(self.pending.split().freeze());
        }
        loop {
            match self.rx.message().await {
                Ok(Some(Packet {
                    payload: Some(Payload::Data(d)),
                    ..
                })) => return Some(d.data),
                Ok(Some(p)) if p.r#type == PacketType::CloseRsp as i32 => return None,
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Waits for the server to close the connection on its own; returns the
    /// CLOSE_RSP's error text (`None` if the stream ended without one).
    pub async fn closed_by_server(&mut self) -> Option<String> {
        loop {
            match self.rx.message().await {
                Ok(Some(Packet {
                    payload: Some(Payload::CloseResponse(c)),
                    ..
                })) => return Some(c.error),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Reads until the connection is closed; returns how many bytes came.
    pub async fn read_to_end_len(&mut self) -> usize {
        let mut total = 0;
        while let Some(d) = self.read().await {
            total += d.len();
        }
        total
    }

    /// Reads exactly `n` bytes (panics if the connection closes first).
    pub async fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let chunk = self
                .read()
                .await
                .unwrap_or_else(|| panic!("closed after {} of {n} bytes", out.len()));
            let take = (n - out.len()).min(chunk.len());
            out.extend_from_slice(&chunk[..take]);
            if take < chunk.len() {
                self.pending.extend_from_slice(&chunk[take..]);
            }
        }
        out
    }

    /// Sends CLOSE_REQ and waits for CLOSE_RSP; returns its error text.
    pub async fn close(mut self) -> Option<String> {
        self.tx
            .send(Packet::close_request(self.connect_id))
            .await
            .ok()?;
        let error = loop {
            match self.rx.message().await {
                Ok(Some(Packet {
                    payload: Some(Payload::CloseResponse(c)),
                    ..
                })) => break Some(c.error),
                Ok(Some(_)) => continue,
                _ => break None,
            }
        };
        self.finish().await;
        error
    }

    /// Drops the stream and waits until the HTTP/2 connection is closed.
    pub async fn finish(mut self) {
        let conn = self.conn.take();
        drop(self);
        if let Some(c) = conn {
            let _ = c.await;
        }
    }
}

/// The server's answer to a CONNECT: status, the raw head, and (for 200) the stream.
pub struct ConnectReply {
    pub status: u16,
    pub head: String,
    pub body: String,
    pub stream: Box<dyn Io>,
}

/// Sends CONNECT exactly as kube-apiserver does and reads the reply head.
/// For errors the body is read to EOF.
pub async fn http_connect(frontend: &Frontend, address: &str) -> ConnectReply {
    let s = frontend.connect().await.unwrap();
    http_connect_on(s, address, b"").await
}

/// Like [`http_connect`] on an open stream, with `early` bytes sent right
/// after the request head (before the 200).
pub async fn http_connect_on(s: Box<dyn Io>, address: &str, early: &[u8]) -> ConnectReply {
    http_connect_headers(s, address, "", early).await
}

/// [`http_connect_on`] with `headers` (each line ending in CRLF) after Host.
pub async fn http_connect_headers(
    mut s: Box<dyn Io>,
    address: &str,
    headers: &str,
    early: &[u8],
) -> ConnectReply {
    let mut req =
        format!("CONNECT {address} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").into_bytes();
    req.extend_from_slice(early);
    s.write_all(&req).await.unwrap();
    // Read one byte at a time up to the blank line, so no tunnel byte is consumed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        match s.read(&mut b).await {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut body = String::new();
    if status != 200 {
        let _ = s.read_to_string(&mut body).await;
    }
    ConnectReply {
        status,
        head,
        body,
        stream: s,
    }
}
