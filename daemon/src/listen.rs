//! Binding and the one accept loop every listener in the workspace uses: a
//! task and a `tracing` span per connection, tracked by the drain, with back-off
//! on accept errors (EMFILE must not spin) and an optional connection limit:
//! either newcomers wait while the listener is full, or the oldest connection
//! not yet settled (routed, past its request head) is shed for each newcomer;
//! and an optional cap on new connections a second ([`crate::accept_rate`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use futures::FutureExt as _;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::future::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::drain::Drain;

/// A listener that could not be bound: one sentence naming the address, the
/// flags that chose it and the cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (set by {flags}): {}", go_compat::errors::io_reason(.source))]
pub struct BindError {
    pub addr: String,
    pub flags: String,
    #[source]
    pub source: io::Error,
}

/// [`bind_tcp`] with an error that names `flags` (e.g. `--agent-bind-address,
/// --agent-port`) and the address.
pub async fn bind_tcp_for(host: &str, port: u16, flags: &str) -> Result<TcpListener, BindError> {
    bind_tcp(host, port).await.map_err(|source| BindError {
        addr: if host.is_empty() || matches!(host, "::" | "[::]") {
            format!("port {port} of every interface")
        } else if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        },
        flags: flags.to_string(),
        source,
    })
}

/// [`bind_unix`] with an error that names `flag` and the path.
pub fn bind_unix_for(
    path: &Path,
    delete_existing: bool,
    flag: &str,
) -> Result<UnixListener, BindError> {
    bind_unix(path, delete_existing).map_err(|source| BindError {
        addr: path.display().to_string(),
        flags: flag.to_string(),
        source,
    })
}

/// Binds `host:port`. An empty host means every interface, both families when
/// the machine has IPv6 (Go's `:port`).
pub async fn bind_tcp(host: &str, port: u16) -> io::Result<TcpListener> {
    bind_tcp_opts(host, port, false).await
}

/// [`bind_tcp`] with `SO_REUSEPORT` set, so that a slow lane
/// ([`crate::slow_lane`]) can join it; nothing else of ours binds it twice.
pub(crate) async fn bind_tcp_reuse_port(host: &str, port: u16) -> io::Result<TcpListener> {
    bind_tcp_opts(host, port, true).await
}

async fn bind_tcp_opts(host: &str, port: u16, reuse_port: bool) -> io::Result<TcpListener> {
    // `::` is every interface too: both families where IPv6 exists, IPv4
    // alone where it does not.
    if host.is_empty() || matches!(host, "::" | "[::]") {
        let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        if let Ok(l) = bind_socket(any6, true, reuse_port) {
            return Ok(l);
        }
        let any4 = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), port);
        return bind_socket(any4, false, reuse_port);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
        .await?
        .collect();
    let mut last = io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!("no address for {host}"),
    );
    for addr in addrs {
        match bind_socket(addr, false, reuse_port) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    // Loopback-only defaults (upstream's admin ports say 127.0.0.1) must
    // still work where the loopback has no IPv4 address (IPv6-only pods).
    if host == "127.0.0.1" && last.kind() == io::ErrorKind::AddrNotAvailable {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port);
        if let Ok(l) = bind_socket(v6, false, reuse_port) {
            tracing::info!(
                port,
                "no IPv4 loopback address here; bound [::1] instead of 127.0.0.1"
            );
            return Ok(l);
        }
    }
    Err(last)
}

fn bind_socket(addr: SocketAddr, dual_stack: bool, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
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

/// A connection that can be ended abortively: the peer reads an error
/// (`ECONNRESET`) instead of a clean end of stream, so a tunnel cut short
/// (its agent lost) is not mistaken for one that finished.
pub trait Reset {
    /// Makes the coming close a reset; call it, then drop without shutdown.
    fn reset_on_close(&self);
}

impl Reset for TcpStream {
    fn reset_on_close(&self) {
        // SO_LINGER 0: close sends RST at once (and never blocks).
        let _ = socket2::SockRef::from(self).set_linger(Some(Duration::ZERO));
    }
}

/// Unix sockets have no reset: the peer sees the end of stream.
impl Reset for UnixStream {
    fn reset_on_close(&self) {}
}

impl<IO: Reset> Reset for tokio_rustls::server::TlsStream<IO> {
    fn reset_on_close(&self) {
        self.get_ref().0.reset_on_close();
    }
}

/// Something that accepts connections.
pub trait Listener: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Reset + crate::hangup::SplitConn + Send + Unpin + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, String)>> + Send;
    /// The bound address, for logs.
    fn local(&self) -> String;
    /// Who a flood penalty charges for this connection: the peer's address,
    /// or on a Unix socket the peer process (`SO_PEERCRED`).
    fn penalty_source(io: &Self::Io) -> Option<crate::flood_penalty::Source>;
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

    fn penalty_source(io: &TcpStream) -> Option<crate::flood_penalty::Source> {
        io.peer_addr().ok().map(|a| a.ip().into())
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

    fn penalty_source(io: &UnixStream) -> Option<crate::flood_penalty::Source> {
        let pid = io.peer_cred().ok()?.pid()?;
        Some(crate::flood_penalty::Source::Process(
            u32::try_from(pid).ok()?,
        ))
    }
}

/// Optional limits for [`accept_loop`].
#[derive(Clone, Default)]
pub struct AcceptOptions {
    /// At most this many connections at once; further ones wait in the backlog.
    pub max_connections: Option<Arc<Semaphore>>,
    /// At most this many connections at once; each newcomer past that sheds
    /// the oldest connection that has not settled (see [`settle`]). Only when
    /// every connection has settled do newcomers wait.
    pub shed_oldest: Option<Arc<Slots>>,
    /// Connections name their client themselves (a PROXY protocol header,
    /// with a load balancer as the peer): the per-source limit of
    /// `shed_oldest` counts a connection only once [`attribute`] names its
    /// source, not the peer address.
    pub source_named_later: bool,
    /// At most this many new connections a second; past it the loop holds
    /// the newcomer it accepted, and those behind it wait in the backlog.
    pub rate: Option<Arc<crate::accept_rate::AcceptRate>>,
}

/// The connections of one listener, oldest first, for [`AcceptOptions::shed_oldest`].
pub struct Slots {
    limit: usize,
    /// Unsettled connections one source address may hold; past it, that
    /// source's own oldest is shed.
    per_source: Option<usize>,
    state: parking_lot::Mutex<SlotsState>,
    freed: Notify,
    shed: AtomicU64,
    on_shed: Option<Box<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct SlotsState {
    next: u64,
    /// Connections that may still be shed, by admission order.
    unsettled: BTreeMap<u64, (CancellationToken, Option<IpAddr>)>,
    settled: usize,
    /// Unsettled connections per source, oldest first (only with a
    /// per-source limit).
    by_source: HashMap<IpAddr, VecDeque<u64>>,
}

impl SlotsState {
    fn forget(&mut self, id: u64, source: Option<IpAddr>) {
        if let Some(src) = source
            && let Some(ids) = self.by_source.get_mut(&src)
        {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.by_source.remove(&src);
            }
        }
    }
}

impl Slots {
    pub fn new(limit: usize) -> Arc<Slots> {
        Self::build(limit, None, None)
    }

    /// Like [`Slots::new`], and each source address may hold at most
    /// `per_source` unsettled connections (its own oldest is shed for its
    /// newcomer, whoever else is waiting); `on_shed` runs for every
    /// connection shed.
    pub fn with(
        limit: usize,
        per_source: Option<usize>,
        on_shed: Option<Box<dyn Fn() + Send + Sync>>,
    ) -> Arc<Slots> {
        Self::build(limit, per_source.filter(|n| *n > 0), on_shed)
    }

    fn build(
        limit: usize,
        per_source: Option<usize>,
        on_shed: Option<Box<dyn Fn() + Send + Sync>>,
    ) -> Arc<Slots> {
        Arc::new(Slots {
            limit: limit.max(1),
            per_source,
            state: parking_lot::Mutex::new(SlotsState::default()),
            freed: Notify::new(),
            shed: AtomicU64::new(0),
            on_shed,
        })
    }

    /// Connections shed so far to admit newer ones.
    pub fn shed_total(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Connections held now.
    pub fn live(&self) -> usize {
        let s = self.state.lock();
        s.unsettled.len() + s.settled
    }

    fn shed_one(&self, token: CancellationToken) {
        token.cancel();
        self.shed.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &self.on_shed {
            f();
        }
    }

    /// Sheds `src`'s oldest unsettled connection if it holds its limit.
    fn make_room_for(&self, s: &mut SlotsState, src: IpAddr) {
        if let Some(max) = self.per_source
            && let Some(ids) = s.by_source.get(&src)
            && ids.len() >= max
            && let Some(&oldest) = ids.front()
        {
            s.forget(oldest, Some(src));
            if let Some((token, _)) = s.unsettled.remove(&oldest) {
                self.shed_one(token);
            }
        }
    }

    /// Admits a connection from `source`, shedding the oldest unsettled one
    /// (of that source, if it is over its own limit) if full; waits while
    /// every held connection has settled.
    async fn admit(self: &Arc<Self>, source: Option<IpAddr>) -> Slot {
        let source = source.filter(|_| self.per_source.is_some());
        loop {
            let freed = self.freed.notified();
            {
                let mut s = self.state.lock();
                if let Some(src) = source {
                    self.make_room_for(&mut s, src);
                }
                if s.unsettled.len() + s.settled >= self.limit
                    && let Some((id, (oldest, src))) = s.unsettled.pop_first()
                {
                    s.forget(id, src);
                    self.shed_one(oldest);
                }
                if s.unsettled.len() + s.settled < self.limit {
                    let id = s.next;
                    s.next += 1;
                    let token = CancellationToken::new();
                    s.unsettled.insert(id, (token.clone(), source));
                    if let Some(src) = source {
                        s.by_source.entry(src).or_default().push_back(id);
                    }
                    return Slot {
                        slots: self.clone(),
                        id,
                        source: parking_lot::Mutex::new(source),
                        token,
                        settled: std::sync::atomic::AtomicBool::new(false),
                    };
                }
            }
            freed.await;
        }
    }
}

/// One admitted connection's place in its listener's [`Slots`].
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// What the per-source limit counts it against.
    source: parking_lot::Mutex<Option<IpAddr>>,
    token: CancellationToken,
    settled: std::sync::atomic::AtomicBool,
}

impl Slot {
    /// Counts the connection against `source` from now on (shedding that
    /// source's oldest unsettled connection if it is at its limit).
    fn attribute(&self, source: IpAddr) {
        if self.slots.per_source.is_none() {
            return;
        }
        let mut s = self.slots.state.lock();
        let mut mine = self.source.lock();
        // Not there: settled, or shed and on its way out.
        if !s.unsettled.contains_key(&self.id) || *mine == Some(source) {
            return;
        }
        s.forget(self.id, *mine);
        self.slots.make_room_for(&mut s, source);
        s.by_source.entry(source).or_default().push_back(self.id);
        if let Some(entry) = s.unsettled.get_mut(&self.id) {
            entry.1 = Some(source);
        }
        *mine = Some(source);
    }

    fn settle(&self) {
        let mut s = self.slots.state.lock();
        // Not there: settled before, or shed and on its way out.
        if s.unsettled.remove(&self.id).is_some() {
            s.forget(self.id, *self.source.lock());
            s.settled += 1;
            self.settled.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut s = self.slots.state.lock();
            if s.unsettled.remove(&self.id).is_some() {
                s.forget(self.id, *self.source.lock());
            } else if *self.settled.get_mut() {
                s.settled -= 1;
            }
        }
        self.slots.freed.notify_one();
    }
}

tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// Marks the calling connection as settled: it is past the point where a
/// flood of half-open connections could be holding its place (its request
/// head is read, its route chosen), so it is no longer shed when its
/// listener is full. Call it from the connection's own task; elsewhere (or
/// on a listener without [`AcceptOptions::shed_oldest`]) it does nothing.
pub fn settle() {
    let _ = SLOT.try_with(|s| s.settle());
}

/// The calling connection's place in its listener's limit
/// ([`AcceptOptions::shed_oldest`]), for a task of its own that carries the
/// connection on once the one the accept loop spawned ends: the place is
/// given back when the returned handle drops. Empty outside a connection's
/// task or on a listener without such a limit.
pub fn hand_off() -> SlotHandle {
    SlotHandle(SLOT.try_with(|s| s.clone()).ok())
}

/// See [`hand_off`].
pub struct SlotHandle(#[allow(dead_code, reason = "held for its Drop")] Option<Arc<Slot>>);

/// Names the calling connection's client (from its PROXY protocol header)
/// for its listener's per-source limit ([`AcceptOptions::source_named_later`]);
/// without such a limit, or outside a connection's task, it does nothing.
pub fn attribute(source: IpAddr) {
    let _ = SLOT.try_with(|s| s.attribute(source));
}

/// `conn`, ended when `token` is cancelled (shed). A combinator, not an
/// async block with `select!`, which would hold `conn` twice (its capture and
/// the future it polls; rust-lang/rust#62958) for the connection's life.
fn sheddable<F: Future<Output = ()>>(
    conn: F,
    token: CancellationToken,
) -> impl Future<Output = ()> {
    conn.with_cancellation_token_owned(token).map(|done| {
        if done.is_none() {
            tracing::debug!("connection shed: the listener is full and a newer one came");
        }
    })
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
        // Taken after the accept, so that only a connection that is there
        // waits (and is counted): the loop holds it, and the rest queue in
        // the backlog behind it.
        if let (Some(rate), Ok(_)) = (&options.rate, &accepted) {
            tokio::select! {
                _ = drain.draining() => break,
                _ = rate.take() => {}
            }
        }
        match accepted {
            Ok((io, peer)) => {
                backoff = Duration::from_millis(5);
                let span = tracing::debug_span!("conn", listener = name, peer = %peer);
                let source = peer
                    .parse::<SocketAddr>()
                    .ok()
                    .map(|a| a.ip())
                    .filter(|_| !options.source_named_later);
                let conn = handle(io, peer, permit);
                match &options.shed_oldest {
                    None => {
                        drain.spawn(conn.instrument(span));
                    }
                    Some(slots) => {
                        let slot = tokio::select! {
                            _ = drain.draining() => break,
                            s = slots.admit(source) => Arc::new(s),
                        };
                        let token = slot.token.clone();
                        let conn = SLOT.scope(slot, sheddable(conn, token));
                        drain.spawn(conn.instrument(span));
                    }
                }
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

    /// A shed-able connection's task holds the connection's state once.
    #[test]
    fn a_sheddable_connection_holds_its_future_once() {
        let big = [7u8; 4096];
        let conn = async move {
            std::future::ready(()).await;
            assert_eq!(big[0], 7);
        };
        let alone = size_of_val(&conn);
        let wrapped = size_of_val(&sheddable(conn, CancellationToken::new()));
        assert!(alone >= 4096, "{alone}");
        assert!(
            wrapped <= alone + 256,
            "{wrapped} bytes for a {alone}-byte future"
        );
    }

    /// A flood penalty charges a TCP peer's address and a Unix socket's
    /// peer process (this test's own).
    #[tokio::test]
    async fn the_penalty_source_is_the_peer_address_or_process() {
        use crate::flood_penalty::Source;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.sock");
        let unix = bind_unix(&path, true).unwrap_or_else(|e| panic!("{e}"));
        let (_client, accepted) = tokio::join!(UnixStream::connect(&path), unix.accept());
        let (io, _) = accepted.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            UnixListener::penalty_source(&io),
            Some(Source::Process(std::process::id()))
        );

        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = tcp.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let socket = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
        socket
            .bind("127.0.0.2:0".parse().unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
        let (_client, accepted) = tokio::join!(socket.connect(addr), Listener::accept(&tcp));
        let (io, _) = accepted.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            TcpListener::penalty_source(&io),
            Some(Source::from(std::net::IpAddr::from([127, 0, 0, 2])))
        );
    }

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

    /// A listener full of connections that never settle still admits every
    /// newcomer by closing the oldest; settled ones are never shed, and when
    /// all are settled a newcomer waits for one to end.
    #[tokio::test]
    async fn a_full_listener_sheds_its_oldest_unsettled_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = bind_tcp("127.0.0.1", 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let drain = Drain::new();
        let slots = Slots::new(4);
        let options = AcceptOptions {
            shed_oldest: Some(slots.clone()),
            ..AcceptOptions::default()
        };
        // A client that sends "s" settles; every connection echoes one byte
        // per byte it reads, so a client sees its connection is served.
        tokio::spawn(accept_loop(
            l,
            "test",
            drain.clone(),
            options,
            |mut io: TcpStream, _, _| async move {
                let mut b = [0u8; 1];
                while let Ok(1) = io.read(&mut b).await {
                    if b[0] == b's' {
                        settle();
                    }
                    let _ = io.write_all(&b).await;
                }
            },
        ));
        async fn open(addr: SocketAddr, byte: u8) -> TcpStream {
            let mut c = TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            c.write_all(&[byte]).await.unwrap_or_else(|e| panic!("{e}"));
            let mut b = [0u8; 1];
            c.read_exact(&mut b).await.unwrap_or_else(|e| panic!("{e}"));
            c
        }
        async fn closed(c: &mut TcpStream) -> bool {
            let mut b = [0u8; 1];
            matches!(c.read(&mut b).await, Ok(0) | Err(_))
        }
        let mut settled = open(addr, b's').await;
        let (mut idle, mut kept) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            idle.push(open(addr, b'x').await);
        }
        // Three newcomers shed the three idle ones, oldest first.
        for (i, conn) in idle.iter_mut().enumerate() {
            kept.push(open(addr, b's').await);
            assert!(closed(conn).await, "idle connection {i} not shed");
        }
        assert_eq!(slots.shed_total(), 3);
        settled
            .write_all(b"x")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut b = [0u8; 1];
        settled
            .read_exact(&mut b)
            .await
            .unwrap_or_else(|e| panic!("the settled connection was shed: {e}"));
        // All four settled now: the next one waits until one ends.
        let mut waiting = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        waiting
            .write_all(b"x")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(slots.live(), 4);
        drop(settled);
        waiting
            .read_exact(&mut b)
            .await
            .unwrap_or_else(|e| panic!("not served after a place freed up: {e}"));
        assert_eq!(slots.shed_total(), 3, "nothing settled was shed");
        drain.start();
    }

    /// With a per-source limit, a source over it sheds its own oldest
    /// unsettled connection, not the listener's oldest (another source's).
    #[tokio::test]
    async fn a_source_over_its_limit_sheds_its_own_oldest() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = bind_tcp("127.0.0.1", 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let drain = Drain::new();
        let hook_count = Arc::new(AtomicUsize::new(0));
        let hc = hook_count.clone();
        let slots = Slots::with(
            8,
            Some(2),
            Some(Box::new(move || {
                hc.fetch_add(1, Ordering::Relaxed);
            })),
        );
        let options = AcceptOptions {
            shed_oldest: Some(slots.clone()),
            ..AcceptOptions::default()
        };
        tokio::spawn(accept_loop(
            l,
            "test",
            drain.clone(),
            options,
            |mut io: TcpStream, _, _| async move {
                let mut b = [0u8; 1];
                while let Ok(1) = io.read(&mut b).await {
                    let _ = io.write_all(&b).await;
                }
            },
        ));
        async fn from(src: [u8; 4], addr: SocketAddr) -> TcpStream {
            let sock = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
            sock.bind(SocketAddr::from((src, 0)))
                .unwrap_or_else(|e| panic!("{e}"));
            let mut c = sock.connect(addr).await.unwrap_or_else(|e| panic!("{e}"));
            // Served: the accept loop has admitted it.
            c.write_all(b"x").await.unwrap_or_else(|e| panic!("{e}"));
            let mut b = [0u8; 1];
            c.read_exact(&mut b).await.unwrap_or_else(|e| panic!("{e}"));
            c
        }
        async fn alive(c: &mut TcpStream) -> bool {
            let mut b = [0u8; 1];
            c.write_all(b"y").await.is_ok() && matches!(c.read(&mut b).await, Ok(1))
        }
        let mut others = [
            from([127, 0, 0, 3], addr).await,
            from([127, 0, 0, 3], addr).await,
        ];
        let mut first = from([127, 0, 0, 2], addr).await;
        let _second = from([127, 0, 0, 2], addr).await;
        let _third = from([127, 0, 0, 2], addr).await;
        assert!(!alive(&mut first).await, "the source's oldest was not shed");
        for (i, c) in others.iter_mut().enumerate() {
            assert!(alive(c).await, "another source's connection {i} was shed");
        }
        assert_eq!(slots.shed_total(), 1);
        assert_eq!(hook_count.load(Ordering::Relaxed), 1);
        assert_eq!(slots.live(), 4);
        drain.start();
    }
}
