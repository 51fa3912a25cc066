//! The relay for two plain TCP sockets, with the bytes moved kernel to
//! kernel: `splice(2)` from one socket into a pipe and from the pipe into the
//! other, so a payload the proxy never looks at is never copied into user
//! space (NodePort connections, and SNI connections once their ClientHello
//! is routed). It keeps [`crate::relay::relay`]'s contract: half-closes, an
//! idle timeout, the caller's stop future, byte counts as they move, which
//! side failed.
//!
//! Back-pressure: a direction reads from its source only once the pipe is
//! empty again, so what it holds is at most one pipe's capacity (64 KiB,
//! pages taken only while they hold data) and a slow reader stalls its
//! writer's socket as in the copying relay.
//!
//! Small exchanges and idle cost: a direction copies through a per-thread
//! buffer until one read fills it ([`COPY_CHUNK`]); only then does it make
//! its pipe (two descriptors), so a request and its answer cost no pipe.
//! The relay gives both pipes back once nothing has moved for
//! [`PIPE_IDLE`] (the direction copies again until the next bulk read), so
//! a quiet connection holds its two sockets and no pipe. When no pipe can
//! be made (descriptor limit), a direction copies instead of failing the
//! connection.
//!
//! Why our own code: no well-kept crate splices between tokio sockets;
//! `rustix` gives safe `splice`/`pipe2` (this workspace forbids `unsafe`)
//! and tokio's readiness API (`readable`/`try_io`) does the rest.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::duplex::Plain;
use crate::relay::{Activity, ErrorOf, RelayBytes, RelayEnd, RelayOptions, Side, Tally};

/// A pipe is given back after this long without a byte moving either way.
pub const PIPE_IDLE: Duration = Duration::from_secs(2);

/// Most bytes one `splice` call moves into a pipe (its default capacity).
const PIPE_CHUNK: usize = 64 << 10;

/// A direction copies through a per-thread buffer of this size until one
/// read fills it: a request and its answer then cost no pipe (making and
/// closing two pipes is most of a short connection's CPU), bulk data moves
/// kernel to kernel.
const COPY_CHUNK: usize = 16 << 10;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Counts the pipes relays hold right now (two descriptors each).
#[derive(Debug, Default)]
pub struct PipeCount(AtomicUsize);

impl PipeCount {
    pub const fn new() -> Self {
        PipeCount(AtomicUsize::new(0))
    }

    /// Pipes held now.
    pub fn open(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// The process's count, for callers that keep no count of their own.
pub static PIPES: PipeCount = PipeCount::new();

/// One direction's pipe and how many bytes it holds.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
    count: &'static PipeCount,
}

impl Pipe {
    fn new(count: &'static PipeCount) -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
        count.0.fetch_add(1, Ordering::Relaxed);
        Ok(Pipe {
            read,
            write,
            held: 0,
            count,
        })
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.count.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a direction keeps its pipe while it waits for its source: an empty
/// pipe parked here may be given back by the idle release at any time.
type Parked = Mutex<Option<Pipe>>;

/// The stream inside `io` when it is a plain TCP connection (`None` leaves
/// `io` as it was), so a caller holding any [`crate::duplex::Duplex`] can
/// pick this relay for exactly the connections it can serve.
pub fn take_tcp<C: 'static>(io: &mut Option<C>) -> Option<TcpStream> {
    let any: &mut dyn std::any::Any = io;
    any.downcast_mut::<Option<Plain<TcpStream>>>()
        .and_then(Option::take)
        .map(|Plain(tcp)| tcp)
}

/// Relays two TCP sockets through pipes until both directions end, one
/// side fails, the idle timeout passes or `stop` resolves.
/// `options.buffer_size` is not used: the pipe is the buffer.
///
/// Not an `async fn`: one would keep its arguments beside the `Link` they
/// are moved into for the connection's whole life, and a held idle
/// connection's task is mostly this future (BENCHMARKS.md, "Idle held
/// connections"). Pass `stop` pinned where it lives (`pin!(fut)`, then
/// `stop.as_mut()`) so that it is not kept twice either.
pub fn relay<'a, S>(
    client: TcpStream,
    upstream: TcpStream,
    options: RelayOptions,
    tally: &'a dyn Tally,
    pipes: &'static PipeCount,
    stop: S,
) -> impl Future<Output = (RelayEnd, RelayBytes)> + 'a
where
    S: Future<Output = ()> + 'a,
{
    let link = Link {
        sockets: [client, upstream],
        parked: [Mutex::new(None), Mutex::new(None)],
        moved: [AtomicU64::new(0), AtomicU64::new(0)],
        alive: AtomicUsize::new(0),
        bulk: [AtomicBool::new(false), AtomicBool::new(false)],
        made: Notify::new(),
        activity: Activity::new(),
        pipes,
        tally,
    };
    let idle = options.idle_timeout;
    // A block, not an `async fn`, for the same reason: a function's
    // parameters are moved into locals and kept twice.
    //
    // Unconstrained: `poll_read_ready`/`poll_write_ready` (below) charge
    // tokio's cooperative budget, which `readable()`/`writable()` did not,
    // and with the budget charged the relay spent a few per cent more CPU
    // per GiB (BENCHMARKS.md, "Idle held connections"). A direction still
    // yields at every `WouldBlock`, as it did before.
    tokio::task::unconstrained(async move {
        let end = tokio::select! {
            r = async { tokio::try_join!(link.pump(Side::Client), link.pump(Side::Upstream)) } => {
                match r {
                    Ok(_) => RelayEnd::Closed,
                    Err(e) => e,
                }
            }
            _ = link.watch(idle) => RelayEnd::Idle,
            _ = stop => RelayEnd::Stopped,
        };
        let bytes = RelayBytes {
            from_client: link.moved[0].load(Ordering::Relaxed),
            from_upstream: link.moved[1].load(Ordering::Relaxed),
        };
        (end, bytes)
    })
}

/// What both directions and the watch share; index 0 is the client's
/// side (the direction it sends), 1 the upstream's.
struct Link<'a> {
    sockets: [TcpStream; 2],
    parked: [Parked; 2],
    moved: [AtomicU64; 2],
    /// Pipes this relay holds, parked or busy.
    alive: AtomicUsize,
    /// Per direction: a read filled [`COPY_CHUNK`], so it splices (until
    /// its pipe is given back for idleness); until then it copies.
    bulk: [AtomicBool; 2],
    /// Told when a pipe is made, so the watch starts its release timer.
    made: Notify,
    activity: Activity,
    pipes: &'static PipeCount,
    tally: &'a dyn Tally,
}

impl Link<'_> {
    /// Returns once nothing has moved for `idle`; meanwhile gives back the
    /// parked (so empty) pipes once nothing has moved for [`PIPE_IDLE`]. It
    /// sleeps on one timer, and on none while neither applies.
    ///
    /// Not an `async fn`, and the timer arithmetic in [`Link::due`]: what it
    /// keeps while it waits is the timer, `release_at` and the wake-up
    /// futures, for a held connection's whole life.
    fn watch(&self, idle: Option<Duration>) -> impl Future<Output = ()> + '_ {
        let idle = idle.filter(|d| !d.is_zero());
        async move {
            let mut sleep = std::pin::pin!(tokio::time::sleep_until(Instant::now()));
            let mut release_at: Option<Instant> = None;
            loop {
                match self.due(idle, &mut release_at) {
                    None => return,
                    Some(Some(at)) => {
                        sleep.as_mut().reset(at);
                        tokio::select! {
                            _ = &mut sleep => {}
                            _ = self.made.notified() => {}
                        }
                    }
                    Some(None) => self.made.notified().await,
                }
            }
        }
    }

    /// For [`Link::watch`]: `None` once nothing has moved for `idle`;
    /// otherwise gives back the parked pipes if their time has come and
    /// says when to look again (`Some(None)`: only once a pipe is made).
    fn due(
        &self,
        idle: Option<Duration>,
        release_at: &mut Option<Instant>,
    ) -> Option<Option<Instant>> {
        loop {
            let now = Instant::now();
            let last = self.activity.last();
            let idle_at = idle.map(|d| last + d);
            if idle_at.is_some_and(|at| now >= at) {
                return None;
            }
            if self.alive.load(Ordering::Relaxed) == 0 {
                *release_at = None;
            } else {
                let due = release_at.map_or(last + PIPE_IDLE, |r| r.max(last + PIPE_IDLE));
                if now >= due {
                    for (p, bulk) in self.parked.iter().zip(&self.bulk) {
                        if p.lock().take().is_some() {
                            self.alive.fetch_sub(1, Ordering::Relaxed);
                            bulk.store(false, Ordering::Relaxed);
                        }
                    }
                    // A pipe still alive is busy with a stalled writer.
                    *release_at = Some(now + PIPE_IDLE);
                    continue;
                }
                *release_at = Some(due);
            }
            return Some([idle_at, *release_at].into_iter().flatten().min());
        }
    }

    /// One direction, from `source`'s socket to the other.
    async fn pump(&self, source: Side) -> Result<(), RelayEnd> {
        let (i, read_err, write_err): (usize, ErrorOf, ErrorOf) = match source {
            Side::Client => (0, RelayEnd::ClientError, RelayEnd::UpstreamError),
            Side::Upstream => (1, RelayEnd::UpstreamError, RelayEnd::ClientError),
        };
        let (src, dst) = (&self.sockets[i], &self.sockets[1 - i]);
        let parked = &self.parked[i];
        loop {
            // poll_*_ready, not readable()/writable(): each socket has one
            // reader (this pump) and one writer (the other), so the slot
            // tokio keeps per direction is enough, and an idle pump holds
            // no 150-byte waiter future.
            std::future::poll_fn(|cx| src.poll_read_ready(cx))
                .await
                .map_err(read_err)?;
            let (mut pipe, fresh) = match self.next(i, read_err, write_err)? {
                Next::Eof => {
                    finish(dst);
                    return Ok(());
                }
                Next::Again => continue,
                Next::Rest(rest) => {
                    // Boxed: only a write the peer did not take whole waits
                    // here; kept out of every relay's future.
                    Box::pin(self.send_rest(i, rest, write_err)).await?;
                    continue;
                }
                Next::Splice(pipe, fresh) => (pipe, fresh),
            };
            let got = src.try_io(Interest::READABLE, || {
                rustix::pipe::splice(
                    src,
                    None,
                    &pipe.write,
                    None,
                    PIPE_CHUNK,
                    SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                )
                .map_err(io::Error::from)
            });
            match got {
                Ok(0) => {
                    if !fresh {
                        self.alive.fetch_sub(1, Ordering::Relaxed);
                    }
                    drop(pipe);
                    finish(dst);
                    return Ok(());
                }
                Ok(n) => pipe.held = n,
                // A pipe made for a wake-up that brought no data is not kept.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !fresh {
                        *parked.lock() = Some(pipe);
                    }
                    continue;
                }
                Err(e) => return Err(read_err(e)),
            }
            if fresh {
                self.alive.fetch_add(1, Ordering::Relaxed);
                self.made.notify_one();
            }
            while pipe.held > 0 {
                std::future::poll_fn(|cx| dst.poll_write_ready(cx))
                    .await
                    .map_err(write_err)?;
                let put = dst.try_io(Interest::WRITABLE, || {
                    rustix::pipe::splice(
                        &pipe.read,
                        None,
                        dst,
                        None,
                        pipe.held,
                        SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                    )
                    .map_err(io::Error::from)
                });
                match put {
                    Ok(0) => return Err(write_err(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        pipe.held = pipe.held.saturating_sub(n);
                        self.moved(i, n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(write_err(e)),
                }
            }
            *parked.lock() = Some(pipe);
        }
    }

    /// What direction `i` does now that its source is readable: splice
    /// through its parked pipe or a new one, or (no bulk data yet, or no
    /// pipe to be had) copy a chunk. Synchronous, so that none of it is
    /// kept in the pump's future while it waits.
    fn next(&self, i: usize, read_err: ErrorOf, write_err: ErrorOf) -> Result<Next, RelayEnd> {
        let taken = self.parked[i].lock().take();
        let fresh = taken.is_none();
        let made = match taken {
            Some(p) => Ok(p),
            None if !self.bulk[i].load(Ordering::Relaxed) => Err(None),
            None => Pipe::new(self.pipes).map_err(Some),
        };
        let no_pipe = match made {
            Ok(p) => return Ok(Next::Splice(p, fresh)),
            Err(no_pipe) => no_pipe,
        };
        if let Some(e) = no_pipe {
            tracing::debug!(error = %e, "no pipe for splicing; copying this chunk");
        }
        Ok(match self.copy(i, read_err, write_err)? {
            Copied::Eof => Next::Eof,
            Copied::Nothing => Next::Again,
            Copied::Moved { full, rest } => {
                if full {
                    self.bulk[i].store(true, Ordering::Relaxed);
                }
                if rest.is_empty() {
                    Next::Again
                } else {
                    Next::Rest(rest)
                }
            }
        })
    }

    fn moved(&self, i: usize, n: usize) {
        let n = n as u64;
        self.activity.touch();
        self.moved[i].fetch_add(n, Ordering::Relaxed);
        if i == 0 {
            self.tally.client_bytes(n);
        } else {
            self.tally.upstream_bytes(n);
        }
    }

    /// Reads what side `i` has into the thread's scratch buffer and writes
    /// it on at once; what the peer does not take is handed back to send.
    fn copy(&self, i: usize, read_err: ErrorOf, write_err: ErrorOf) -> Result<Copied, RelayEnd> {
        let (src, dst) = (&self.sockets[i], &self.sockets[1 - i]);
        SCRATCH.with(|scratch| {
            let mut buf = scratch.borrow_mut();
            if buf.len() < COPY_CHUNK {
                buf.resize(COPY_CHUNK, 0);
            }
            // A read that comes back short has taken everything the socket
            // held: it reports WouldBlock to `try_io` with the count kept
            // aside, so that tokio clears the socket's readiness, as its own
            // `poll_read` does after a short read, and the pump waits for
            // the next edge instead of reading once more for EAGAIN (one
            // syscall per wake-up; tokio's tick keeps an edge that came in
            // between from being lost).
            let mut short = None;
            let read = src.try_io(Interest::READABLE, || {
                let n =
                    rustix::net::recv(src, &mut buf[..COPY_CHUNK], rustix::net::RecvFlags::empty())
                        .map_err(io::Error::from)?
                        .0;
                if n > 0 && n < COPY_CHUNK {
                    short = Some(n);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            let n = match (read, short) {
                (_, Some(n)) => n,
                (Ok(0), None) => return Ok(Copied::Eof),
                (Ok(n), None) => n,
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Copied::Nothing);
                }
                (Err(e), None) => return Err(read_err(e)),
            };
            let sent = match dst.try_write(&buf[..n]) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(write_err(e)),
            };
            if sent > 0 {
                self.moved(i, sent);
            }
            Ok(Copied::Moved {
                full: n == COPY_CHUNK,
                rest: buf[sent..n].to_vec(),
            })
        })
    }

    /// Sends the rest of a copied chunk as the peer takes it.
    async fn send_rest(&self, i: usize, rest: Vec<u8>, write_err: ErrorOf) -> Result<(), RelayEnd> {
        let dst = &self.sockets[1 - i];
        let mut sent = 0;
        while sent < rest.len() {
            dst.writable().await.map_err(write_err)?;
            match dst.try_write(&rest[sent..]) {
                Ok(0) => return Err(write_err(io::ErrorKind::WriteZero.into())),
                Ok(m) => {
                    sent += m;
                    self.moved(i, m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(write_err(e)),
            }
        }
        Ok(())
    }
}

/// What a direction does next ([`Link::next`]).
enum Next {
    /// Its source ended.
    Eof,
    /// Nothing to do until the source is readable again.
    Again,
    /// A copied chunk's rest, which the peer has not taken yet.
    Rest(Vec<u8>),
    /// Splice through this pipe (`true`: made for this read).
    Splice(Pipe, bool),
}

/// What one copy did.
enum Copied {
    Eof,
    /// The source had nothing after all.
    Nothing,
    /// `full`: the read filled the scratch buffer (bulk data: splice from
    /// now on); `rest`: what the peer has not taken yet.
    Moved {
        full: bool,
        rest: Vec<u8>,
    },
}

/// Half-close: the peer sees EOF, the other direction goes on.
fn finish(dst: &TcpStream) {
    let _ = rustix::net::shutdown(dst, rustix::net::Shutdown::Write);
}

/// The relay's contract, run on both paths: the copying relay of
/// [`crate::relay`] and this one, over real loopback TCP.
#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[derive(Clone, Copy, Debug)]
    enum Path {
        Copy,
        Splice,
    }

    const PATHS: [Path; 2] = [Path::Copy, Path::Splice];

    /// A connected pair: (the end the relay gets, the peer's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let (peer, accepted) = tokio::join!(TcpStream::connect(addr), l.accept());
        let peer = peer.unwrap_or_else(|e| panic!("{e}"));
        let (mine, _) = accepted.unwrap_or_else(|e| panic!("{e}"));
        (mine, peer)
    }

    /// Counts what the tally hears.
    #[derive(Default)]
    struct Heard {
        client: AtomicU64,
        upstream: AtomicU64,
    }

    impl Tally for Heard {
        fn client_bytes(&self, n: u64) {
            self.client.fetch_add(n, Ordering::Relaxed);
        }
        fn upstream_bytes(&self, n: u64) {
            self.upstream.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn leaked_count() -> &'static PipeCount {
        Box::leak(Box::new(PipeCount::new()))
    }

    /// `run` with default options and no tally, in a task of its own,
    /// until both sides end.
    fn spawn_relay(
        path: Path,
        client: TcpStream,
        upstream: TcpStream,
        pipes: &'static PipeCount,
    ) -> tokio::task::JoinHandle<(RelayEnd, RelayBytes)> {
        let opts = RelayOptions::default();
        tokio::spawn(run(
            path,
            client,
            upstream,
            opts,
            &(),
            pipes,
            std::future::pending(),
        ))
    }

    async fn run(
        path: Path,
        client: TcpStream,
        upstream: TcpStream,
        options: RelayOptions,
        tally: &dyn Tally,
        pipes: &'static PipeCount,
        stop: impl Future<Output = ()>,
    ) -> (RelayEnd, RelayBytes) {
        match path {
            Path::Copy => {
                crate::relay::relay(Plain(client), Plain(upstream), options, tally, stop).await
            }
            Path::Splice => relay(client, upstream, options, tally, pipes, stop).await,
        }
    }

    #[tokio::test]
    async fn copies_both_ways_and_keeps_half_close() {
        for path in PATHS {
            let (client, mut client_peer) = pair().await;
            let (upstream, mut upstream_peer) = pair().await;
            let heard = std::sync::Arc::new(Heard::default());
            let h = heard.clone();
            let task = tokio::spawn(async move {
                let opts = RelayOptions::default();
                let pipes = leaked_count();
                run(
                    path,
                    client,
                    upstream,
                    opts,
                    &*h,
                    pipes,
                    std::future::pending(),
                )
                .await
            });
            client_peer
                .write_all(b"ping")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            client_peer
                .shutdown()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut got = Vec::new();
            upstream_peer
                .read_to_end(&mut got)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, b"ping", "{path:?}");
            // After the client's half-close the upstream can still answer.
            upstream_peer
                .write_all(b"pong")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            drop(upstream_peer);
            let mut back = Vec::new();
            client_peer
                .read_to_end(&mut back)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, b"pong", "{path:?}");
            let (end, bytes) = task.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(end, RelayEnd::Closed), "{path:?}: {end:?}");
            let want = RelayBytes {
                from_client: 4,
                from_upstream: 4,
            };
            assert_eq!(bytes, want, "{path:?}");
            assert_eq!(heard.client.load(Ordering::Relaxed), 4, "{path:?}");
            assert_eq!(heard.upstream.load(Ordering::Relaxed), 4, "{path:?}");
        }
    }

    /// Short exchanges one after another, and bursts of two writes, all
    /// arrive: a direction that copies clears its socket's readiness after
    /// a short read (no read for EAGAIN) and must still wake for every
    /// later byte, including bytes that come while it is reading.
    #[tokio::test]
    async fn every_short_exchange_arrives_after_a_short_read() {
        for path in PATHS {
            let (client, mut client_peer) = pair().await;
            let (upstream, mut upstream_peer) = pair().await;
            // Without Nagle, so that a write right behind another is not
            // held for the first one's delayed ACK.
            for s in [&client, &client_peer, &upstream, &upstream_peer] {
                s.set_nodelay(true).unwrap_or_else(|e| panic!("{e}"));
            }
            let task = spawn_relay(path, client, upstream, leaked_count());
            let exchanges = async {
                let mut sent = 0u64;
                for i in 0..300usize {
                    let msg = vec![(i % 251) as u8; 1 + i % 700];
                    client_peer.write_all(&msg).await?;
                    if i % 3 == 0 {
                        // A second write right behind the first.
                        client_peer.write_all(&msg).await?;
                    }
                    let want = if i % 3 == 0 { 2 * msg.len() } else { msg.len() };
                    let mut got = vec![0; want];
                    upstream_peer.read_exact(&mut got).await?;
                    assert!(got.iter().all(|b| *b == msg[0]), "{path:?}: exchange {i}");
                    upstream_peer.write_all(&got).await?;
                    let mut back = vec![0; want];
                    client_peer.read_exact(&mut back).await?;
                    assert_eq!(back, got, "{path:?}: exchange {i}");
                    sent += want as u64;
                }
                io::Result::Ok(sent)
            };
            let sent = tokio::time::timeout(Duration::from_secs(60), exchanges)
                .await
                .unwrap_or_else(|_| panic!("{path:?}: an exchange was not relayed"))
                .unwrap_or_else(|e| panic!("{path:?}: {e}"));
            drop(client_peer);
            drop(upstream_peer);
            let (_, bytes) = task.await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(bytes.from_client, sent, "{path:?}");
            assert_eq!(bytes.from_upstream, sent, "{path:?}");
        }
    }

    /// Megabytes both ways at once arrive whole and in order, and are counted.
    #[tokio::test]
    async fn bulk_both_ways_arrives_intact() {
        const LEN: usize = 3 << 20;
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4099) as u8).collect();
        let data = std::sync::Arc::new(data);
        for path in PATHS {
            let (client, client_peer) = pair().await;
            let (upstream, upstream_peer) = pair().await;
            let pipes = leaked_count();
            let task = spawn_relay(path, client, upstream, pipes);
            let send_recv = |peer: TcpStream| {
                let data = data.clone();
                async move {
                    let (mut r, mut w) = peer.into_split();
                    let writer = async {
                        w.write_all(&data).await.unwrap_or_else(|e| panic!("{e}"));
                        w.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
                    };
                    let mut got = Vec::new();
                    let reader = r.read_to_end(&mut got);
                    let (_, read) = tokio::join!(writer, reader);
                    read.unwrap_or_else(|e| panic!("{e}"));
                    got
                }
            };
            let (a, b) = tokio::join!(send_recv(client_peer), send_recv(upstream_peer));
            assert!(a == *data && b == *data, "{path:?}: bytes differ");
            let (end, bytes) = task.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(end, RelayEnd::Closed), "{path:?}: {end:?}");
            let n = LEN as u64;
            let want = RelayBytes {
                from_client: n,
                from_upstream: n,
            };
            assert_eq!(bytes, want, "{path:?}");
            assert_eq!(pipes.open(), 0, "{path:?}: pipes outlive the relay");
        }
    }

    #[tokio::test]
    async fn idle_timeout_ends_relay() {
        for path in PATHS {
            let (client, _c) = pair().await;
            let (upstream, _u) = pair().await;
            let opts = RelayOptions {
                idle_timeout: Some(Duration::from_millis(50)),
                ..Default::default()
            };
            let pipes = leaked_count();
            let (end, _) = run(
                path,
                client,
                upstream,
                opts,
                &(),
                pipes,
                std::future::pending(),
            )
            .await;
            assert!(matches!(end, RelayEnd::Idle), "{path:?}: {end:?}");
        }
    }

    #[tokio::test]
    async fn stop_future_ends_relay() {
        for path in PATHS {
            let (client, _c) = pair().await;
            let (upstream, _u) = pair().await;
            let opts = RelayOptions::default();
            let (end, _) = run(path, client, upstream, opts, &(), leaked_count(), async {}).await;
            assert!(matches!(end, RelayEnd::Stopped), "{path:?}: {end:?}");
        }
    }

    /// A reset peer ends the relay as that side's error.
    #[tokio::test]
    async fn a_reset_upstream_is_an_upstream_error() {
        for path in PATHS {
            let (client, mut client_peer) = pair().await;
            let (upstream, upstream_peer) = pair().await;
            let task = spawn_relay(path, client, upstream, leaked_count());
            rustix::net::sockopt::set_socket_linger(&upstream_peer, Some(Duration::ZERO))
                .unwrap_or_else(|e| panic!("{e}"));
            drop(upstream_peer);
            // Writing towards the reset upstream (or reading its RST) fails.
            let _ = client_peer.write_all(&[0u8; 1024]).await;
            let (end, _) = task.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(
                matches!(end, RelayEnd::UpstreamError(_)),
                "{path:?}: {end:?}"
            );
        }
    }

    /// Pipes exist only while bulk data moves: none before the first byte
    /// or for small exchanges, one per direction with a read that filled
    /// the copy buffer, none again once the connection idles.
    #[tokio::test(start_paused = true)]
    async fn pipes_are_made_for_bulk_data_and_given_back_when_idle() {
        let (client, mut client_peer) = pair().await;
        let (upstream, mut upstream_peer) = pair().await;
        let pipes = leaked_count();
        let task = tokio::spawn(async move {
            let opts = RelayOptions::default();
            relay(client, upstream, opts, &(), pipes, std::future::pending()).await
        });
        tokio::task::yield_now().await;
        assert_eq!(pipes.open(), 0);
        let bulk = vec![5u8; 1 << 20];
        let mut moved = 0;
        for round in 0..2 {
            client_peer
                .write_all(b"ping")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut got = [0u8; 4];
            upstream_peer
                .read_exact(&mut got)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&got, b"ping");
            assert_eq!(
                pipes.open(),
                0,
                "round {round}: a small exchange makes no pipe"
            );
            let mut got = vec![0u8; bulk.len()];
            let (w, r) = tokio::join!(
                client_peer.write_all(&bulk),
                upstream_peer.read_exact(&mut got)
            );
            w.unwrap_or_else(|e| panic!("{e}"));
            r.unwrap_or_else(|e| panic!("{e}"));
            assert!(got == bulk);
            moved += 4 + bulk.len() as u64;
            assert_eq!(
                pipes.open(),
                1,
                "round {round}: the client's direction splices"
            );
            // Given back once idle for PIPE_IDLE: watched, not slept through.
            let deadline = Instant::now() + PIPE_IDLE * 10;
            while pipes.open() != 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(
                pipes.open(),
                0,
                "round {round}: an idle connection holds none"
            );
        }
        drop(client_peer);
        drop(upstream_peer);
        let (end, bytes) = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(end, RelayEnd::Closed), "{end:?}");
        assert_eq!(bytes.from_client, moved);
    }

    #[test]
    fn only_a_plain_tcp_stream_is_taken() {
        let mut other = Some(Plain(tokio::io::empty()));
        assert!(take_tcp(&mut other).is_none());
        assert!(
            other.is_some(),
            "a stream it cannot splice is left in place"
        );
    }
}
