//! Binding and the one accept loop every listener in the workspace uses: a
//! task and a `tracing` span per connection, tracked by the drain, with back-off
//! on accept errors (EMFILE must not spin) and an optional connection limit.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::drain::Drain;

/// Binds `host:port`. An empty host means every interface, both families when
/// the machine has IPv6 (Go's `:port`).
pub async fn bind_tcp(host: &str, port: u16) -> io::Result<TcpListener> {
    if host.is_empty() {
        let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        if let Ok(l) = bind_socket(any6, true) {
            return Ok(l);
        }
        return TcpListener::bind(("0.0.0.0", port)).await;
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
        .await?
        .collect();
    let mut last = io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!("no address for {host}"),
    );
    for addr in addrs {
        match bind_socket(addr, false) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn bind_socket(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Binds a Unix socket with mode `srwxrwx---`, removing a stale socket first
/// when `delete_existing` is set.
pub fn bind_unix(path: &Path, delete_existing: bool) -> io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if delete_existing {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; refusing to delete it",
                        path.display()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o770))?;
    Ok(listener)
}

/// Something that accepts connections.
pub trait Listener: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, String)>> + Send;
    /// The bound address, for logs.
    fn local(&self) -> String;
}

impl Listener for TcpListener {
    type Io = TcpStream;

    async fn accept(&self) -> io::Result<(TcpStream, String)> {
        let (io, peer) = TcpListener::accept(self).await?;
        let _ = io.set_nodelay(true);
        Ok((io, peer.to_string()))
    }

    fn local(&self) -> String {
        self.local_addr().map(|a| a.to_string()).unwrap_or_default()
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;

    async fn accept(&self) -> io::Result<(UnixStream, String)> {
        let (io, _) = UnixListener::accept(self).await?;
        Ok((io, "unix".to_string()))
    }

    fn local(&self) -> String {
        self.local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            .unwrap_or_default()
    }
}

/// Optional limits for [`accept_loop`].
#[derive(Clone, Default)]
pub struct AcceptOptions {
    /// At most this many connections at once; further ones wait in the backlog.
    pub max_connections: Option<Arc<Semaphore>>,
}

/// Accepts until the drain starts; each connection runs `handle` in its own
/// tracked task inside a span named `name` with the peer address.
pub async fn accept_loop<L, F, Fut>(
    listener: L,
    name: &'static str,
    drain: Drain,
    options: AcceptOptions,
    handle: F,
) where
    L: Listener,
    F: Fn(L::Io, String, Option<OwnedSemaphorePermit>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = Duration::from_millis(5);
    loop {
        let permit = match &options.max_connections {
            Some(sem) => tokio::select! {
                _ = drain.draining() => break,
                p = sem.clone().acquire_owned() => p.ok(),
            },
            None => None,
        };
        let accepted = tokio::select! {
            _ = drain.draining() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((io, peer)) => {
                backoff = Duration::from_millis(5);
                let span = tracing::debug_span!("conn", listener = name, peer = %peer);
                drain.spawn(handle(io, peer, permit).instrument(span));
            }
            Err(e) => {
                // Out of descriptors or memory: wait for connections to end
                // instead of spinning on a listener that stays readable.
                tracing::warn!(listener = name, error = %e, ?backoff, "accept failed");
                tokio::select! {
                    _ = drain.draining() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
    tracing::debug!(listener = name, "stopped accepting");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unix_socket_mode_and_stale_removal() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.sock");
        let first = bind_unix(&path, true).unwrap_or_else(|e| panic!("{e}"));
        drop(first);
        // The socket file is still there; a second bind must replace it.
        let _second = bind_unix(&path, true).unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o770));
        assert!(
            bind_unix(&path, false).is_err(),
            "without deletion the bind must fail"
        );
        let regular = dir.path().join("file");
        std::fs::write(&regular, b"x").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            bind_unix(&regular, true).is_err(),
            "never delete a non-socket"
        );
    }

    #[tokio::test]
    async fn accept_loop_serves_and_stops_on_drain() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = bind_tcp("127.0.0.1", 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let drain = Drain::new();
        let looped = tokio::spawn(accept_loop(
            l,
            "test",
            drain.clone(),
            AcceptOptions::default(),
            |mut io: TcpStream, _, _| async move {
                let _ = io.write_all(b"hi").await;
            },
        ));
        let mut c = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf).await;
        assert_eq!(buf, b"hi");
        drain.start();
        assert!(looped.await.is_ok());
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "listener must be closed after drain"
        );
    }
}
