//! Copies bytes both ways between a client and an upstream, holding a buffer
//! only while data is in flight (a quiet connection holds none; see
//! [`crate::chunks`]; an HTTP/2 stream's frames pass through uncopied, see
//! [`crate::duplex`]), keeps half-closes (EOF one way shuts down the write
//! side of the other peer and the opposite direction keeps flowing), ends on an
//! idle timeout, and says which side failed.

use std::future::{Future, poll_fn};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::duplex::{ChunkRead, ChunkWrite, Duplex};

/// Receives byte counts as they flow, for live metrics.
pub trait Tally: Send + Sync {
    fn client_bytes(&self, bytes: u64);
    fn upstream_bytes(&self, bytes: u64);
}

impl Tally for () {
    fn client_bytes(&self, _: u64) {}
    fn upstream_bytes(&self, _: u64) {}
}

#[derive(Clone, Copy, Debug)]
pub struct RelayOptions {
    /// Largest chunk read at once in each direction (1 KiB to 64 KiB).
    pub buffer_size: usize,
    /// Ends the relay when no byte moved either way for this long.
    pub idle_timeout: Option<Duration>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            buffer_size: 16 * 1024,
            idle_timeout: None,
        }
    }
}

/// How a relay ended.
#[derive(Debug)]
pub enum RelayEnd {
    /// Both directions reached EOF.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
    /// The caller's stop future resolved (drain timeout, shutdown).
    Stopped,
    ClientError(io::Error),
    UpstreamError(io::Error),
}

impl RelayEnd {
    /// A short label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RelayEnd::Closed => "closed",
            RelayEnd::Idle => "idle_timeout",
            RelayEnd::Stopped => "stopped",
            RelayEnd::ClientError(_) => "client_error",
            RelayEnd::UpstreamError(_) => "upstream_error",
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayBytes {
    pub from_client: u64,
    pub from_upstream: u64,
}

pub(crate) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

pub(crate) type ErrorOf = fn(io::Error) -> RelayEnd;

pub(crate) enum Side {
    Client,
    Upstream,
}

/// Relays until both directions end, one side fails, the idle timeout passes
/// or `stop` resolves.
pub async fn relay<C, U>(
    client: C,
    upstream: U,
    options: RelayOptions,
    tally: &dyn Tally,
    stop: impl Future<Output = ()>,
) -> (RelayEnd, RelayBytes)
where
    C: Duplex,
    U: Duplex,
{
    let activity = Arc::new(Activity::new());
    let from_client = AtomicU64::new(0);
    let from_upstream = AtomicU64::new(0);
    let size = options.buffer_size.max(1024);
    let (cr, cw) = client.split(size);
    let (ur, uw) = upstream.split(size);
    let count_up = |n| {
        from_client.fetch_add(n, Ordering::Relaxed);
        tally.client_bytes(n);
    };
    let count_down = |n| {
        from_upstream.fetch_add(n, Ordering::Relaxed);
        tally.upstream_bytes(n);
    };
    let up = pump(cr, uw, &activity, Side::Client, &count_up);
    let down = pump(ur, cw, &activity, Side::Upstream, &count_down);
    let idle = idle_watch(&activity, options.idle_timeout);
    let end = tokio::select! {
        r = async { tokio::try_join!(up, down) } => match r {
            Ok(_) => RelayEnd::Closed,
            Err(e) => e,
        },
        _ = idle => RelayEnd::Idle,
        _ = stop => RelayEnd::Stopped,
    };
    let bytes = RelayBytes {
        from_client: from_client.load(Ordering::Relaxed),
        from_upstream: from_upstream.load(Ordering::Relaxed),
    };
    (end, bytes)
}

pub(crate) async fn idle_watch(activity: &Activity, idle: Option<Duration>) {
    let Some(idle) = idle.filter(|d| !d.is_zero()) else {
        return std::future::pending().await;
    };
    loop {
        let deadline = activity.last() + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

async fn pump<R, W>(
    mut r: R,
    mut w: W,
    activity: &Activity,
    source: Side,
    count: &(dyn Fn(u64) + Sync),
) -> Result<(), RelayEnd>
where
    R: ChunkRead,
    W: ChunkWrite,
{
    let (read_err, write_err): (ErrorOf, ErrorOf) = match source {
        Side::Client => (RelayEnd::ClientError, RelayEnd::UpstreamError),
        Side::Upstream => (RelayEnd::UpstreamError, RelayEnd::ClientError),
    };
    loop {
        let mut chunk = poll_fn(|cx| r.poll_chunk(cx)).await.map_err(read_err)?;
        if chunk.is_empty() {
            // Half-close: the peer sees EOF, the other direction goes on.
            let _ = poll_fn(|cx| w.poll_finish(cx)).await;
            return Ok(());
        }
        let len = chunk.len() as u64;
        poll_fn(|cx| w.poll_send(cx, &mut chunk))
            .await
            .map_err(write_err)?;
        activity.touch();
        count(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duplex::Plain;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn copies_both_ways_and_keeps_half_close() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            relay(
                Plain(client),
                Plain(upstream),
                RelayOptions::default(),
                &(),
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
        assert_eq!(got, b"ping");
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
        assert_eq!(back, b"pong");
        let (end, bytes) = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(end, RelayEnd::Closed), "{end:?}");
        assert_eq!(
            bytes,
            RelayBytes {
                from_client: 4,
                from_upstream: 4
            }
        );
    }

    #[tokio::test]
    async fn idle_timeout_ends_relay() {
        let (client, _c) = tokio::io::duplex(64);
        let (upstream, _u) = tokio::io::duplex(64);
        let opts = RelayOptions {
            idle_timeout: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        let (end, _) = relay(
            Plain(client),
            Plain(upstream),
            opts,
            &(),
            std::future::pending(),
        )
        .await;
        assert!(matches!(end, RelayEnd::Idle), "{end:?}");
    }

    #[tokio::test]
    async fn stop_future_ends_relay() {
        let (client, _c) = tokio::io::duplex(64);
        let (upstream, _u) = tokio::io::duplex(64);
        let (end, _) = relay(
            Plain(client),
            Plain(upstream),
            RelayOptions::default(),
            &(),
            async {},
        )
        .await;
        assert!(matches!(end, RelayEnd::Stopped), "{end:?}");
    }
}
