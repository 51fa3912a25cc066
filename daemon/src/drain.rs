//! One shutdown signal for a whole process (or one in-process instance in tests):
//! listeners stop accepting when draining starts, live tunnels get until the
//! grace period ends, then everything still running is told to stop.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Debug)]
pub struct Drain {
    draining: CancellationToken,
    stopping: CancellationToken,
    tasks: TaskTracker,
    /// Live task count, watchable so tests and shutdown can wait for a number.
    live: watch::Sender<usize>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            draining: CancellationToken::new(),
            stopping: CancellationToken::new(),
            tasks: TaskTracker::new(),
            live: watch::channel(0).0,
        }
    }
}

/// Decrements the live count when a tracked task ends, however it ends.
struct Live(watch::Sender<usize>);

/// `fut`, holding `live` until it ends. A combinator, not an async block: an
/// async block would hold `fut` twice, once as its capture and once as the
/// future it awaits (rust-lang/rust#62958), and every connection's task is
/// spawned through here, so each idle connection paid for its state twice.
fn counted<F: Future>(fut: F, live: Live) -> impl Future<Output = F::Output> {
    fut.map(move |out| {
        drop(live);
        out
    })
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Drain {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts draining: accept loops end, components stop taking new work.
    pub fn start(&self) {
        self.draining.cancel();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Resolves once draining has started.
    pub async fn draining(&self) {
        self.draining.cancelled().await
    }

    /// Resolves once the grace period is over and every task must end now.
    pub async fn stopping(&self) {
        self.stopping.cancelled().await
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }

    /// A token cancelled when stopping; for APIs that take a token.
    pub fn stop_token(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// Spawns a task that shutdown waits for.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.live.send_modify(|n| *n += 1);
        let live = Live(self.live.clone());
        self.tasks.spawn(counted(fut, live))
    }

    /// Number of tracked tasks still running (connections, tunnels, loops).
    pub fn live_tasks(&self) -> usize {
        *self.live.borrow()
    }

    /// Waits until at most `n` tracked tasks are running.
    pub async fn wait_tasks_at_most(&self, n: usize) {
        let mut rx = self.live.subscribe();
        let _ = rx.wait_for(|live| *live <= n).await;
    }

    /// Drains, waits up to `grace` for tracked tasks, then stops the rest and
    /// waits for them to notice. Returns whether everything ended within `grace`.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        self.start();
        self.tasks.close();
        let clean = tokio::time::timeout(grace, self.tasks.wait()).await.is_ok();
        self.stopping.cancel();
        // Stopped tasks end at their next await point; bound it anyway.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.tasks.wait()).await;
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper every task is spawned in adds a few bytes, not a second
    /// copy of the task's state.
    #[test]
    fn a_counted_task_holds_its_future_once() {
        let (tx, _rx) = watch::channel(0);
        let big = [7u8; 4096];
        let fut = async move {
            std::future::ready(()).await;
            big.len()
        };
        let alone = size_of_val(&fut);
        let wrapped = size_of_val(&counted(fut, Live(tx)));
        assert!(alone >= 4096, "{alone}");
        assert!(
            wrapped <= alone + 64,
            "{wrapped} bytes for a {alone}-byte future"
        );
    }

    #[tokio::test]
    async fn waits_for_tasks_then_stops_stragglers() {
        let d = Drain::new();
        let quick = d.clone();
        d.spawn(async move { quick.draining().await });
        let slow = d.clone();
        let straggler = d.spawn(async move {
            slow.stopping().await;
            "stopped"
        });
        // The straggler only ends on stop, so the grace period runs out.
        assert!(!d.shutdown(Duration::from_millis(50)).await);
        assert_eq!(straggler.await.ok(), Some("stopped"));
        assert_eq!(d.live_tasks(), 0);
    }

    #[tokio::test]
    async fn clean_when_tasks_finish_within_grace() {
        let d = Drain::new();
        let t = d.clone();
        d.spawn(async move { t.draining().await });
        assert!(d.shutdown(Duration::from_secs(5)).await);
    }
}
