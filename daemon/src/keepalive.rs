//! TCP keepalive as operators configure it: time, interval and probe count,
//! each optional, in whole seconds. Only the fields given are set; the kernel
//! keeps its own value for the rest (no backfill), as KKP's Envoy settings did.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Idle time before the first probe.
    pub time: Option<Duration>,
    /// Time between probes.
    pub interval: Option<Duration>,
    /// Unanswered probes before the connection is dropped.
    pub probes: Option<u32>,
}

impl TcpKeepalive {
    pub fn is_set(&self) -> bool {
        self.time.is_some() || self.interval.is_some() || self.probes.is_some()
    }

    /// Enables keepalive on `stream` with the fields given; a no-op when none is.
    pub fn apply(&self, stream: &TcpStream) -> io::Result<()> {
        if !self.is_set() {
            return Ok(());
        }
        let whole = |d: Duration| Duration::from_secs(d.as_secs().max(1));
        let mut ka = socket2::TcpKeepalive::new();
        if let Some(t) = self.time {
            ka = ka.with_time(whole(t));
        }
        if let Some(i) = self.interval {
            ka = ka.with_interval(whole(i));
        }
        if let Some(p) = self.probes {
            ka = ka.with_retries(p);
        }
        socket2::SockRef::from(stream).set_tcp_keepalive(&ka)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sets_only_given_fields() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let s = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sock = socket2::SockRef::from(&s);
        let default_interval = sock.tcp_keepalive_interval().ok();
        TcpKeepalive {
            time: Some(Duration::from_millis(7500)),
            interval: None,
            probes: Some(4),
        }
        .apply(&s)
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sock.keepalive().ok(), Some(true));
        assert_eq!(sock.tcp_keepalive_time().ok(), Some(Duration::from_secs(7)));
        assert_eq!(sock.tcp_keepalive_retries().ok(), Some(4));
        assert_eq!(sock.tcp_keepalive_interval().ok(), default_interval);
    }
}
