//! SIGTERM/SIGINT as a sequence: the first one drains, the second one exits,
//! as upstream's binaries behave.

use tokio::signal::unix::{Signal, SignalKind, signal};

pub struct Terminations {
    term: Signal,
    int: Signal,
}

impl Terminations {
    pub fn install() -> std::io::Result<Self> {
        Ok(Terminations {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT.
    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Waits for SIGHUP, for reloads. Never resolves if it cannot be installed.
pub async fn hangups() -> Option<Signal> {
    signal(SignalKind::hangup()).ok()
}
