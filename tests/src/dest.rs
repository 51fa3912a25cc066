//! Destinations on loopback for tunnels to reach.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP echo server on `127.0.0.1:0`; runs until the test's runtime ends.
pub async fn echo() -> SocketAddr {
    echo_on("127.0.0.1").await
}

/// A TCP echo server on a given loopback address (all of 127.0.0.0/8 is local,
/// so tests can give agents distinct destination IPs).
pub async fn echo_on(ip: &str) -> SocketAddr {
    let l = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A server that speaks first: writes `greeting` on accept, then echoes.
pub async fn greeter(greeting: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                if s.write_all(greeting).await.is_err() {
                    return;
                }
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Serves `len` bytes of a repeating pattern to every connection, then closes.
pub async fn source(len: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
                let mut left = len;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A destination that accepts and then never reads: what a client sends it
/// piles up in the proxy once the (small) socket buffers are full. Its
/// connections stay open as long as the listener task runs.
pub async fn sink() -> SocketAddr {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Accepted sockets inherit a small receive buffer: stalls come quickly.
    let _ = s.set_recv_buffer_size(16 << 10);
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    s.listen(128).unwrap();
    s.set_nonblocking(true).unwrap();
    let l = TcpListener::from_std(s.into()).unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

/// A port on loopback that refuses connections: bound, never listened on, and
/// kept bound so nobody else takes it while the test runs.
pub fn refused() -> (socket2::Socket, SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

/// A destination that never answers a TCP handshake, on loopback: a listener
/// with the smallest backlog whose queue is filled and never accepted, so the
/// kernel drops further SYNs and a dialer waits until its own timeout.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: socket2::Socket,
    _fillers: Vec<TcpStream>,
}

pub async fn blackhole() -> Blackhole {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    s.listen(0).unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    // Fill the accept queue. With backlog 0 Linux queues one connection; keep
    // connecting until a handshake stops completing.
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(
            std::time::Duration::from_millis(200),
            TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(c)) => fillers.push(c),
            _ => break,
        }
    }
    Blackhole {
        addr,
        _listener: s,
        _fillers: fillers,
    }
}

/// A destination that accepts connections and never reads them; its
/// receive buffers are small so that what is sent to it backs up into the
/// proxy at once. Dropping it resets every connection it holds.
pub struct Stalled {
    pub addr: SocketAddr,
    held: std::sync::Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stalled {
    /// Closes every connection held so far (the proxy sees each end);
    /// new ones are still accepted and held.
    pub fn release(&self) {
        let gone = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        drop(gone);
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn stalled() -> Stalled {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    s.listen(1024).unwrap();
    s.set_nonblocking(true).unwrap();
    let l = tokio::net::TcpListener::from_std(s.into()).unwrap();
    let addr = l.local_addr().unwrap();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = held.clone();
    let task = tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let mut held = kept.lock().unwrap_or_else(|e| e.into_inner());
            // Bounded by the proxy's own bound on this cluster.
            if held.len() < 10_000 {
                held.push(c);
            }
        }
    });
    Stalled { addr, held, task }
}

/// Writes `data`, reads the same number of bytes back, returns them.
pub async fn roundtrip<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    data: &[u8],
) -> Vec<u8> {
    s.write_all(data).await.unwrap();
    let mut buf = vec![0; data.len()];
    s.read_exact(&mut buf).await.unwrap();
    buf
}

/// Destinations whose connection tasks are counted, so a test can wait until
/// every destination socket is closed (leak checks count descriptors).
#[derive(Clone)]
pub struct Counted {
    live: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

struct Guard(std::sync::Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Default for Counted {
    fn default() -> Self {
        Counted {
            live: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl Counted {
    fn guard(&self) -> Guard {
        self.live.send_modify(|n| *n += 1);
        Guard(self.live.clone())
    }

    /// Waits until no destination connection is open.
    pub async fn wait_idle(&self) {
        let mut rx = self.live.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// An echo server.
    pub async fn echo(&self) -> SocketAddr {
        self.serve(|mut s| async move {
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        })
        .await
    }

    /// Says `bye` and closes first.
    pub async fn closer(&self) -> SocketAddr {
        self.serve(|mut s| async move {
            let _ = s.write_all(b"bye").await;
        })
        .await
    }

    async fn serve<F, Fut>(&self, f: F) -> SocketAddr
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let g = me.guard();
                let fut = f(s);
                tokio::spawn(async move {
                    fut.await;
                    drop(g);
                });
            }
        });
        addr
    }
}
