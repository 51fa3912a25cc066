//! One destination connection, owned by one task: bytes from the destination
//! become DATA packets, DATA for it is written to it, and whichever side ends
//! first ends both (the protocol has no half-close).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use konnectivity_proto::control::ControlTx;
use konnectivity_proto::ids::ConnectId;
use konnectivity_proto::{Packet, PacketExt};
use link::chunks::ChunkReader;
use link::debug_connections::CloseReason;
use link::flow::{RecvGate, SendGate};
use link::relay::Tally;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::dial::destination::Destination;

/// The stream-facing handle of a connection.
pub struct ConnHandle {
    /// Bytes for the destination, admitted by `gate` before they are queued.
    /// futures' channel, not tokio's: tokio's allocates a 32-slot block
    /// (1 KiB) and 0.5 KiB of state per channel up front and keeps them, and
    /// most connections are idle (P5 in BENCHMARKS.md, issue 39); futures'
    /// holds about 128 bytes and allocates per queued chunk.
    pub to_remote: UnboundedSender<Bytes>,
    /// Legacy server: `--xfr-channel-size` packets and a stall limit. Ours:
    /// the flow-control window.
    pub gate: Arc<RecvGate>,
    /// Credit for our DATA to the server; `None` for upstream servers.
    pub send: Option<Arc<SendGate>>,
    pub close: CloseSignal,
}

/// Asks the connection task to end, optionally with an error for the server.
#[derive(Clone, Default)]
pub struct CloseSignal {
    token: CancellationToken,
    reason: Arc<Mutex<Option<(CloseReason, String)>>>,
}

impl CloseSignal {
    pub fn close(&self, reason: Option<(CloseReason, String)>) {
        if let Some(r) = reason {
            self.reason.lock().get_or_insert(r);
        }
        self.token.cancel();
    }

    /// The error for the server, if the connection was closed with one.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().as_ref().map(|(_, r)| r.clone())
    }

    /// The cause and error it was closed with, if any.
    pub fn cause(&self) -> Option<(CloseReason, String)> {
        self.reason.lock().clone()
    }

    pub async fn closed(&self) {
        self.token.cancelled().await
    }

    pub fn is_closed(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// The server side of a pump: where packets go, and the connection's gates.
pub struct Link<'a> {
    pub id: ConnectId,
    pub to_server: &'a mpsc::Sender<Packet>,
    pub control: &'a ControlTx,
    pub gate: &'a RecvGate,
    pub send: Option<&'a SendGate>,
    /// Counts bytes each way for `/debug/connections` (from the server:
    /// `client`; from the destination: `upstream`).
    pub tally: &'a dyn Tally,
}

/// Pumps bytes both ways until either side ends or `close` fires. Returns when
/// the connection is over; the caller sends CLOSE_RSP.
pub async fn pump(
    mut stream: Destination,
    link: Link<'_>,
    mut to_remote: UnboundedReceiver<Bytes>,
    close: &CloseSignal,
    on_sent: impl Fn(i32),
) {
    let id = link.id;
    let (rd, mut wr) = stream.split();
    let upload = async {
        // No buffer is held while the destination is quiet (see ChunkReader).
        let mut reader = ChunkReader::new();
        let mut rd = rd;
        loop {
            // What is read is held until it may be sent.
            let limit = link::flow::read_size(link.send);
            let data = match reader.read_at_most(&mut rd, limit).await {
                Ok(d) if !d.is_empty() => d,
                _ => return,
            };
            link.tally.upstream_bytes(data.len() as u64);
            if let Some(send) = link.send {
                send.acquire(data.len()).await;
            }
            if link.to_server.send(Packet::data(id.0, data)).await.is_err() {
                return;
            }
            on_sent(konnectivity_proto::PacketType::Data as i32);
        }
    };
    let download = async {
        while let Some(data) = to_remote.next().await {
            if wr.write_all(&data).await.is_err() {
                return;
            }
            link.tally.client_bytes(data.len() as u64);
            if let Some(credit) = link.gate.consumed(data.len()) {
                if link
                    .control
                    .send(Packet::window_update(id.0, credit))
                    .is_err()
                {
                    // The server stopped reading its stream; the session
                    // ends it.
                    return;
                }
                on_sent(konnectivity_proto::PacketType::WindowUpdate as i32);
            }
        }
    };
    tokio::select! {
        _ = upload => {}
        _ = download => {}
        _ = close.closed() => {}
    }
    // Best effort: let the destination see a clean FIN rather than a reset.
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}
