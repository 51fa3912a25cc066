//! The demo's destinations: a TLS "apiserver" that answers any HTTP request
//! with a version document, and a TCP echo that, when it sees an HTTP request,
//! answers with the request as the body so `curl` shows something readable.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use daemon::drain::Drain;

const VERSION: &str =
    r#"{"major":"1","minor":"36","gitVersion":"v1.36.0-local-stack","platform":"linux/amd64"}"#;

/// Serves the fake apiserver over TLS until the drain starts.
pub async fn apiserver(listener: TcpListener, tls: Arc<rustls::ServerConfig>, drain: Drain) {
    let acceptor = TlsAcceptor::from(tls);
    daemon::listen::accept_loop(
        listener,
        "demo-apiserver",
        drain,
        Default::default(),
        move |io, _, _| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(Ok(mut tls)) =
                    tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(io))
                        .await
                {
                    answer_http(&mut tls, |_| VERSION.to_string(), "application/json").await;
                }
            }
        },
    )
    .await
}

/// Serves the echo until the drain starts.
pub async fn echo(listener: TcpListener, drain: Drain) {
    daemon::listen::accept_loop(
        listener,
        "demo-echo",
        drain,
        Default::default(),
        |mut io, _, _| async move {
            let mut first = vec![0u8; 64 * 1024];
            let Ok(n) = io.read(&mut first).await else {
                return;
            };
            let head = &first[..n];
            let is_http = [&b"GET "[..], b"POST ", b"PUT ", b"HEAD "]
                .iter()
                .any(|m| head.starts_with(m));
            if is_http {
                let req = String::from_utf8_lossy(head).to_string();
                let body = format!("echo: you sent\n{req}");
                let _ = respond(&mut io, &body, "text/plain; charset=utf-8").await;
                return;
            }
            if io.write_all(head).await.is_err() {
                return;
            }
            let (mut r, mut w) = tokio::io::split(io);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        },
    )
    .await
}

async fn answer_http<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    body: impl Fn(&str) -> String,
    content_type: &str,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        if len == buf.len() {
            return;
        }
    }
    let req = String::from_utf8_lossy(&buf[..len]).to_string();
    let _ = respond(io, &body(&req), content_type).await;
}

async fn respond<S: AsyncWrite + Unpin>(
    io: &mut S,
    body: &str,
    content_type: &str,
) -> std::io::Result<()> {
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    io.write_all(resp.as_bytes()).await?;
    io.shutdown().await
}

/// Where the demo destinations listen.
#[derive(Debug, Clone, Copy)]
pub struct DestinationAddrs {
    pub apiserver: SocketAddr,
    pub echo: SocketAddr,
}
