//! What a dial reaches: a TCP connection in the agent, or an in-memory pipe
//! in the packet fuzz target. The session and its connections are the same
//! code either way; only the connect differs. In memory, one execution of
//! the target costs microseconds instead of the loopback TCP handshake and
//! teardown that took two thirds of its time.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::net::{TcpStream, tcp};
use tokio_util::either::Either;

use crate::dial::policy::DestinationPolicy;
use crate::dial::{self, DialError};

/// Opens the in-memory side of a destination address, or fails as a connect
/// would (e.g. `ECONNREFUSED`).
pub type MemoryConnect = dyn Fn(SocketAddr) -> io::Result<DuplexStream> + Send + Sync;

/// How a session reaches destinations.
#[derive(Clone, Default)]
pub enum Dialer {
    /// TCP, as the agent does.
    #[default]
    Tcp,
    /// In-memory pipes, after the same address checks and policy.
    Memory(Arc<MemoryConnect>),
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dialer::Tcp => "Tcp",
            Dialer::Memory(_) => "Memory",
        })
    }
}

impl Dialer {
    /// Dials `protocol` `address` within `timeout`; see [`dial::dial`].
    pub async fn dial(
        &self,
        protocol: &str,
        address: &str,
        timeout: Duration,
        policy: &DestinationPolicy,
    ) -> Result<Destination, DialError> {
        match self {
            Dialer::Tcp => dial::dial(protocol, address, timeout, policy)
                .await
                .map(Destination::Tcp),
            Dialer::Memory(connect) => {
                dial::dial_via(protocol, address, timeout, policy, |a| {
                    std::future::ready(connect(a).map(|pipe| Destination::Memory(pipe, a)))
                })
                .await
            }
        }
    }
}

/// A dialed destination.
pub enum Destination {
    Tcp(TcpStream),
    Memory(DuplexStream, SocketAddr),
}

type Reader<'a> = Either<tcp::ReadHalf<'a>, ReadHalf<&'a mut DuplexStream>>;
type Writer<'a> = Either<tcp::WriteHalf<'a>, WriteHalf<&'a mut DuplexStream>>;

impl Destination {
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Destination::Tcp(s) => s.peer_addr().ok(),
            Destination::Memory(_, a) => Some(*a),
        }
    }

    /// Its reading and writing halves, usable at once (TCP's split borrows,
    /// with no lock between the halves).
    pub fn split(&mut self) -> (Reader<'_>, Writer<'_>) {
        match self {
            Destination::Tcp(s) => {
                let (r, w) = s.split();
                (Either::Left(r), Either::Left(w))
            }
            Destination::Memory(p, _) => {
                let (r, w) = tokio::io::split(p);
                (Either::Right(r), Either::Right(w))
            }
        }
    }

    /// Ends what we send (a FIN on TCP).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Destination::Tcp(s) => s.shutdown().await,
            Destination::Memory(p, _) => p.shutdown().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn policy(s: &str) -> DestinationPolicy {
        DestinationPolicy::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn in_memory_dials_pass_the_same_checks_and_words_as_tcp() {
        let open: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let dialer = Dialer::Memory(Arc::new(move |a| {
            if a == open {
                let (near, mut far) = tokio::io::duplex(64);
                tokio::spawn(async move { far.write_all(b"hi").await });
                Ok(near)
            } else {
                Err(io::Error::from_raw_os_error(libc::ECONNREFUSED))
            }
        }));
        let t = Duration::from_secs(5);
        let all = policy("");

        let mut d = match dialer.dial("tcp", "127.0.0.1:1", t, &all).await {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(d.peer_addr(), Some(open));
        let (mut r, _w) = d.split();
        let mut got = [0u8; 2];
        r.read_exact(&mut got)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&got, b"hi");

        let text = |r: Result<Destination, DialError>| match r {
            Ok(_) => panic!("dialed"),
            Err(e) => e,
        };
        let refused = text(dialer.dial("tcp", "127.0.0.1:2", t, &all).await);
        assert_eq!(
            refused.text,
            "dial tcp 127.0.0.1:2: connect: connection refused"
        );
        let denied = text(
            dialer
                .dial("tcp", "127.0.0.1:1", t, &policy("10.0.0.0/8"))
                .await,
        );
        assert!(denied.denied, "{denied}");
        let bad = text(dialer.dial("udp", "127.0.0.1:1", t, &all).await);
        assert_eq!(bad.text, "dial udp: unknown network udp");
    }
}
