//! A slow lane for the client addresses a listener has flagged: the kernel
//! steers their new connections, as their SYNs arrive, to a listening socket
//! of their own, which the process accepts from at a fixed rate. Past that
//! socket's backlog ([`SLOW_LANE_BACKLOG`]) the kernel drops their SYNs and
//! the clients retry on their own schedule.
//!
//! Why: a connection cannot be told apart from another until it has been
//! accepted and read, and accepting, reading and refusing a storm of them
//! costs CPU that the connections of every other client wait for. A refusal
//! in the process, however cheap, brings the client back at once. Holding
//! the flagged clients' connections in the kernel costs nothing per
//! connection, and other clients' connections never queue behind theirs.
//!
//! How: the listener and its lane are one `SO_REUSEPORT` group of two
//! sockets, and a classic BPF program (`SO_ATTACH_REUSEPORT_CBPF`) chooses
//! the socket by the packet's source address: index 1 (the lane) for a
//! flagged IPv4 address or IPv6 /64, 0 (the listener) for everyone else. The
//! program is rebuilt and attached again when the flagged set changes. It is
//! written here by hand because no crate builds such programs; it is a
//! straight list of comparisons (two instructions an IPv4 address, five an
//! IPv6 prefix), bounded by [`MAX_SLOW_LANE_SOURCES`], and the kernel checks
//! it when it is attached.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::libc::{sock_filter, sock_fprog};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::flood_penalty::{key, make_room};
use crate::limits::{MAX_SLOW_LANE_SOURCES, SLOW_LANE_BACKLOG};

/// Longer periods are taken as this (a century).
const LONGEST_PERIOD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Binds `host:port` as [`crate::listen::bind_tcp`] does, with a slow lane
/// beside it whose flagged addresses stay flagged for `period` after their
/// last [`Steering::flag`].
pub async fn bind(host: &str, port: u16, period: Duration) -> io::Result<(TcpListener, SlowLane)> {
    let main = crate::listen::bind_tcp_reuse_port(host, port).await?;
    let lane = SlowLane::beside(&main, period)?;
    Ok((main, lane))
}

/// The lane's listening socket and what steers connections to it.
#[derive(Debug)]
pub struct SlowLane {
    pub listener: TcpListener,
    pub steering: std::sync::Arc<Steering>,
}

impl SlowLane {
    /// A lane for `main`, which must have been bound with `SO_REUSEPORT`
    /// and be listening already (so that it is the group's socket 0).
    pub fn beside(main: &TcpListener, period: Duration) -> io::Result<SlowLane> {
        let main_ref = socket2::SockRef::from(main);
        if !main_ref.reuse_port()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the listener was bound without SO_REUSEPORT, so no slow lane can join it",
            ));
        }
        let local = main.local_addr()?;
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(local),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        if local.is_ipv6() {
            socket.set_only_v6(main_ref.only_v6()?)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&local.into())?;
        // Before the lane listens: without a program the kernel would spread
        // connections over both sockets by hash.
        attach(main, program(&[]))?;
        socket.listen(SLOW_LANE_BACKLOG)?;
        let group = OwnedFd::from(socket.try_clone()?);
        let steering = std::sync::Arc::new(Steering {
            group,
            period: period.min(LONGEST_PERIOD),
            flagged: Mutex::new(HashMap::new()),
        });
        let listener = TcpListener::from_std(socket.into())?;
        Ok(SlowLane { listener, steering })
    }
}

/// Which client addresses go to the lane, and until when.
#[derive(Debug)]
pub struct Steering {
    /// A descriptor of the lane's socket: a program attached to any socket
    /// of the group is the group's.
    group: OwnedFd,
    period: Duration,
    flagged: Mutex<HashMap<IpAddr, Instant>>,
}

impl Steering {
    /// Sends `ip`'s new connections (its IPv6 /64's) to the lane from now
    /// until the period has passed since the last time it was flagged.
    pub fn flag(&self, ip: IpAddr) {
        let k = key(ip);
        let now = Instant::now();
        let until = now + self.period;
        let mut map = self.flagged.lock();
        if let Some(u) = map.get_mut(&k) {
            *u = until;
            return;
        }
        make_room(&mut map, MAX_SLOW_LANE_SOURCES, now, |u| *u);
        map.insert(k, until);
        tracing::info!(client = %k, period = ?self.period, "client address flagged: its new connections take the slow lane");
        self.steer(&map);
    }

    /// Restarts `ip`'s period if it is flagged; nothing otherwise. For
    /// failures that do not flag an address but show that a flagged one is
    /// still at it (its lane keeps it under the bound that flagged it).
    pub fn extend(&self, ip: IpAddr) {
        if let Some(u) = self.flagged.lock().get_mut(&key(ip)) {
            *u = Instant::now() + self.period;
        }
    }

    /// Lets the addresses whose period has passed back onto the listener;
    /// call it now and then (every second, say).
    pub fn prune(&self) {
        let now = Instant::now();
        let mut map = self.flagged.lock();
        let before = map.len();
        map.retain(|_, u| *u > now);
        if map.len() != before {
            if map.is_empty() {
                map.shrink_to_fit();
            }
            self.steer(&map);
        }
    }

    /// Addresses (IPv6: /64s) sent to the lane now.
    pub fn flagged(&self) -> usize {
        self.flagged.lock().len()
    }

    fn steer(&self, map: &HashMap<IpAddr, Instant>) {
        let addrs: Vec<IpAddr> = map.keys().copied().collect();
        if let Err(e) = attach(&self.group, program(&addrs)) {
            // The last program stays: connections keep their lanes.
            tracing::warn!(error = %e, "the slow lane's steering could not be updated");
        }
    }
}

fn attach(fd: &impl AsFd, mut prog: Vec<sock_filter>) -> io::Result<()> {
    let len = u16::try_from(prog.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "slow lane program too long"))?;
    let fprog = sock_fprog {
        len,
        filter: prog.as_mut_ptr(),
    };
    // The kernel copies the program before the call returns.
    nix::sys::socket::setsockopt(fd, nix::sys::socket::sockopt::AttachReusePortCbpf, &fprog)
        .map_err(io::Error::from)
}

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const LD_B_ABS: u16 = 0x30;
const LD_W_ABS: u16 = 0x20;
const AND_K: u16 = 0x54;
const JEQ_K: u16 = 0x15;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
/// `SKF_NET_OFF`: loads relative to the network header (the program runs
/// with the packet's data at its TCP payload).
const NET: u32 = (-0x0010_0000i32) as u32;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The program steering `flagged` (keys: IPv4 addresses, IPv6 /64s) to
/// socket 1 and every other packet to socket 0.
fn program(flagged: &[IpAddr]) -> Vec<sock_filter> {
    let v4: Vec<u32> = flagged
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(a) => Some(u32::from(*a)),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6: Vec<u64> = flagged
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(a) => Some((u128::from(*a) >> 64) as u64),
            IpAddr::V4(_) => None,
        })
        .collect();
    let mut p = vec![
        // The IP version, from the header's first nibble.
        op(LD_B_ABS, 0, 0, NET),
        op(AND_K, 0, 0, 0xf0),
        op(JEQ_K, 0, 1, 0x60),
        // To the IPv6 part, past the IPv4 one (its length is patched in).
        op(JA, 0, 0, 0),
        op(JEQ_K, 1, 0, 0x40),
        op(RET_K, 0, 0, 0),
        // IPv4: the source address.
        op(LD_W_ABS, 0, 0, NET + 12),
    ];
    for a in v4 {
        p.push(op(JEQ_K, 0, 1, a));
        p.push(op(RET_K, 0, 0, 1));
    }
    p.push(op(RET_K, 0, 0, 0));
    // A jump counts from the instruction after it.
    p[3].k = (p.len() - 4) as u32;
    // IPv6: the source address's first 64 bits, at bytes 8 to 15.
    for prefix in v6 {
        p.push(op(LD_W_ABS, 0, 0, NET + 8));
        p.push(op(JEQ_K, 0, 3, (prefix >> 32) as u32));
        p.push(op(LD_W_ABS, 0, 0, NET + 12));
        p.push(op(JEQ_K, 0, 1, prefix as u32));
        p.push(op(RET_K, 0, 0, 1));
    }
    p.push(op(RET_K, 0, 0, 0));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// Where a connection from `source` to `lane`'s listener lands: on the
    /// listener (`false`) or on the lane (`true`).
    async fn lands_on_lane(
        main: &TcpListener,
        lane: &SlowLane,
        source: IpAddr,
    ) -> io::Result<bool> {
        let to: SocketAddr = match (main.local_addr()?, source) {
            (a, IpAddr::V4(_)) if a.ip().is_unspecified() || a.is_ipv4() => {
                SocketAddr::new(IpAddr::from([127, 0, 0, 1]), a.port())
            }
            (a, _) => SocketAddr::new(IpAddr::from(std::net::Ipv6Addr::LOCALHOST), a.port()),
        };
        let socket = match source {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        let _client = socket.connect(to).await?;
        tokio::select! {
            r = main.accept() => r.map(|_| false),
            r = lane.listener.accept() => r.map(|_| true),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    async fn lane(host: &str, period: Duration) -> (TcpListener, SlowLane) {
        bind(host, 0, period)
            .await
            .unwrap_or_else(|e| panic!("binding {host} with a slow lane: {e}"))
    }

    async fn lands(main: &TcpListener, lane: &SlowLane, source: &str) -> bool {
        lands_on_lane(main, lane, ip(source))
            .await
            .unwrap_or_else(|e| panic!("connecting from {source}: {e}"))
    }

    /// The kernel sends a flagged address's connections to the lane and
    /// everyone else's to the listener, before and after the flag.
    #[tokio::test]
    async fn only_a_flagged_address_takes_the_lane() {
        let (main, lane) = lane("127.0.0.1", Duration::from_secs(60)).await;
        for _ in 0..4 {
            assert!(!lands(&main, &lane, "127.0.0.1").await);
            assert!(!lands(&main, &lane, "127.0.0.2").await);
        }
        lane.steering.flag(ip("127.0.0.2"));
        assert_eq!(lane.steering.flagged(), 1);
        for _ in 0..4 {
            assert!(!lands(&main, &lane, "127.0.0.1").await);
            assert!(lands(&main, &lane, "127.0.0.2").await);
            assert!(!lands(&main, &lane, "127.0.0.3").await);
        }
    }

    /// On a dual-stack listener, IPv4 clients and an IPv6 /64 are told
    /// apart by the same program.
    #[tokio::test]
    async fn a_dual_stack_listener_steers_both_families() {
        let Ok((main, lane)) = bind("::", 0, Duration::from_secs(60)).await else {
            eprintln!("no IPv6 here");
            return;
        };
        if !main.local_addr().is_ok_and(|a| a.is_ipv6()) {
            eprintln!("no IPv6 here");
            return;
        }
        lane.steering.flag(ip("::1"));
        assert!(lands(&main, &lane, "::1").await);
        assert!(!lands(&main, &lane, "127.0.0.2").await);
        lane.steering.flag(ip("127.0.0.2"));
        assert!(lands(&main, &lane, "127.0.0.2").await);
        assert!(!lands(&main, &lane, "127.0.0.1").await);
        // How a dual-stack socket names an IPv4 client.
        lane.steering.flag(ip("::ffff:127.0.0.3"));
        assert!(lands(&main, &lane, "127.0.0.3").await);
        assert!(!lands(&main, &lane, "127.0.0.1").await);
    }

    /// An address whose period has passed is steered back to the listener.
    #[tokio::test(start_paused = true)]
    async fn the_lane_ends_with_the_period() {
        let (main, lane) = lane("127.0.0.1", Duration::from_secs(30)).await;
        lane.steering.extend(ip("127.0.0.3"));
        assert_eq!(lane.steering.flagged(), 0, "extending flags nobody");
        lane.steering.flag(ip("127.0.0.2"));
        tokio::time::advance(Duration::from_secs(20)).await;
        lane.steering.extend(ip("127.0.0.2"));
        tokio::time::advance(Duration::from_secs(20)).await;
        lane.steering.prune();
        assert_eq!(lane.steering.flagged(), 1, "extended 20 s ago");
        assert!(lands(&main, &lane, "127.0.0.2").await);
        tokio::time::advance(Duration::from_secs(11)).await;
        lane.steering.prune();
        assert_eq!(lane.steering.flagged(), 0);
        assert!(!lands(&main, &lane, "127.0.0.2").await);
    }

    /// At the bound the kernel takes the program, and the oldest flag makes
    /// room for a new one.
    #[tokio::test(start_paused = true)]
    async fn the_most_addresses_the_bound_allows_fit_one_program() {
        let (main, lane) = lane("127.0.0.1", Duration::from_secs(60)).await;
        let v6 = (0..MAX_SLOW_LANE_SOURCES)
            .map(|i| IpAddr::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, i as u16, 0, 0, 0, 1)));
        let longest = program(&v6.collect::<Vec<_>>());
        assert!(longest.len() <= 4096, "{} instructions", longest.len());
        attach(&lane.steering.group, longest).unwrap_or_else(|e| panic!("{e}"));
        lane.steering.flag(ip("127.0.0.9"));
        tokio::time::advance(Duration::from_millis(1)).await;
        for i in 0..MAX_SLOW_LANE_SOURCES {
            lane.steering.flag(IpAddr::from(std::net::Ipv6Addr::new(
                0xfd00, 0, 0, i as u16, 0, 0, 0, 1,
            )));
        }
        assert_eq!(lane.steering.flagged(), MAX_SLOW_LANE_SOURCES);
        assert!(
            !lands(&main, &lane, "127.0.0.9").await,
            "the oldest made room"
        );
        lane.steering.flag(ip("127.0.0.2"));
        assert!(lands(&main, &lane, "127.0.0.2").await);
    }

    /// A listener bound without `SO_REUSEPORT` gets a clear error.
    #[tokio::test]
    async fn a_plain_listener_cannot_have_a_lane() {
        let main = crate::listen::bind_tcp("127.0.0.1", 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let Err(e) = SlowLane::beside(&main, Duration::from_secs(1)) else {
            panic!("a lane joined a listener without SO_REUSEPORT");
        };
        assert!(e.to_string().contains("SO_REUSEPORT"), "{e}");
    }
}
