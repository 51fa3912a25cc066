//! Keeps the agent connected to every proxy server: connect until we hold
//! `servercount` distinct server ids (a duplicate id is closed at once), back
//! off with jitter on failure, reconnect when a stream drops, and stop
//! connecting once draining.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use daemon::drain::Drain;
use konnectivity_proto::ids::ServerId;
use parking_lot::Mutex;
use rand::Rng;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::connect::Connector;
use crate::metrics::Metrics;
use crate::servers::Endpoint;
use crate::session::{Session, SessionConfig};

/// The sync loop's timing.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    pub interval: Duration,
    pub interval_cap: Duration,
    /// Keep dialing at every interval even with enough servers, to discover
    /// servers added behind a load balancer.
    pub forever: bool,
    /// Where the servers are (default: the connector's host and port).
    pub servers: crate::servers::Servers,
}

pub struct ClientSet {
    sessions: Mutex<HashMap<ServerId, Arc<Session>>>,
    /// The endpoint (see [`crate::servers`]) each session was reached at.
    held: Mutex<HashMap<ServerId, String>>,
    server_count: AtomicU32,
    /// Set with `--count-server-leases`.
    leases: std::sync::OnceLock<Arc<crate::servers::leases::LeaseCount>>,
    lost: Notify,
    connected_tx: watch::Sender<usize>,
    metrics: Arc<Metrics>,
    session_cfg: SessionConfig,
    /// Tracks stream and connection tasks; stopped on the final shutdown.
    drain: Drain,
    /// The agent is draining (first SIGTERM): no new servers, DRAIN sent.
    draining: CancellationToken,
    /// Every session's connections, for `/debug/connections`.
    pub debug: link::debug_connections::Connections,
}

/// When an endpoint that failed is tried again, and the wait after that.
struct Retry {
    at: tokio::time::Instant,
    backoff: Duration,
}

/// `interval` plus up to 10 % (wait.Jitter(d, 0.1)).
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(rand::rng().random_range(0.0..0.1))
}

impl ClientSet {
    pub fn new(metrics: Arc<Metrics>, session_cfg: SessionConfig, drain: Drain) -> Arc<Self> {
        let (connected_tx, _) = watch::channel(0);
        metrics.known_server_count.set(1.0);
        let debug = link::debug_connections::Connections::new();
        let m = metrics.clone();
        debug.on_close(move |_, reason, _| m.connection_closed(reason));
        Arc::new(ClientSet {
            sessions: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            server_count: AtomicU32::new(0),
            leases: std::sync::OnceLock::new(),
            lost: Notify::new(),
            connected_tx,
            metrics,
            session_cfg,
            drain,
            draining: CancellationToken::new(),
            debug,
        })
    }

    /// Servers the agent wants: the last `servercount` it was told or, with
    /// lease counting, the number of valid server leases (or the larger of
    /// the two with `--server-count-source=max`); at least 1.
    pub fn target(&self) -> usize {
        let header = self.server_count.load(Ordering::Relaxed).max(1) as usize;
        match self.leases.get() {
            None => header,
            Some(l) if l.max_with_header => l.get().max(header),
            Some(l) => l.get(),
        }
    }

    /// Counts server leases from now on (`--count-server-leases`).
    pub fn count_leases(&self, count: Arc<crate::servers::leases::LeaseCount>) {
        let _ = self.leases.set(count);
    }

    pub fn connected(&self) -> usize {
        self.sessions.lock().len()
    }

    pub fn watch_connected(&self) -> watch::Receiver<usize> {
        self.connected_tx.subscribe()
    }

    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().values().cloned().collect()
    }

    /// Publishes how many sessions are open, counted under the table's lock
    /// so a session that starts and one that ends at the same time cannot
    /// publish their counts out of order.
    fn publish(&self) {
        let sessions = self.sessions.lock();
        let n = sessions.len();
        self.metrics.open_server_connections.set(n as f64);
        self.connected_tx.send_replace(n);
    }

    /// Runs until draining starts: connects to endpoints it holds no stream
    /// to, one attempt at a time, until it holds [`ClientSet::target`]
    /// streams. Each endpoint backs off on its own, so one dead server does
    /// not slow down reaching the others.
    pub async fn sync(self: Arc<Self>, connector: Connector, cfg: SyncConfig) {
        let mut endpoints = crate::servers::follow(
            &cfg.servers,
            (connector.host.clone(), connector.port),
            &self.drain,
        );
        let mut retry: HashMap<String, Retry> = HashMap::new();
        let mut turn = 0usize;
        loop {
            if self.draining.is_cancelled() || self.drain.is_draining() {
                return;
            }
            let target = self.target();
            self.metrics.known_server_count.set(target as f64);
            let eps = endpoints.borrow_and_update().clone();
            let wait = if !cfg.forever && self.connected() >= target {
                jitter(cfg.interval)
            } else {
                let now = tokio::time::Instant::now();
                let held: Vec<String> = self.held.lock().values().cloned().collect();
                let mut free: Vec<&Endpoint> =
                    eps.iter().filter(|e| !held.contains(&e.key())).collect();
                if free.is_empty() {
                    // Every endpoint has a stream and more are wanted: an
                    // endpoint may be a load balancer (upstream's setup with
                    // one --proxy-server-host), so dial them again.
                    free = eps.iter().collect();
                }
                turn = turn.wrapping_add(1);
                let ready = (0..free.len())
                    .map(|i| free[(turn + i) % free.len()])
                    .find(|e| retry.get(&e.key()).is_none_or(|r| r.at <= now));
                match ready {
                    None => {
                        let next = free
                            .iter()
                            .filter_map(|e| retry.get(&e.key()).map(|r| r.at))
                            .min();
                        next.map_or(jitter(cfg.interval), |at| at.saturating_duration_since(now))
                            .min(jitter(cfg.interval))
                    }
                    Some(ep) => {
                        let c = Connector {
                            host: ep.host.clone(),
                            port: ep.port,
                            addr: ep.addr,
                            ..connector.clone()
                        };
                        let attempt = tokio::select! {
                            r = c.connect(self.session_cfg.conn_queue.max(64)) => r,
                            _ = self.drain.draining() => return,
                        };
                        let more = eps.len() > 1;
                        match attempt {
                            Ok(conn) => {
                                retry.remove(&ep.key());
                                let duplicate = self.sessions.lock().contains_key(&conn.server_id);
                                if duplicate {
                                    tracing::debug!(server = %ep, server_id = %conn.server_id, "already connected to this server; closing the new stream");
                                    // Reached again at the next interval, not at once.
                                    retry.insert(
                                        ep.key(),
                                        Retry {
                                            at: now + jitter(cfg.interval),
                                            backoff: cfg.interval,
                                        },
                                    );
                                } else {
                                    self.server_count
                                        .store(conn.server_count, Ordering::Relaxed);
                                    self.start(conn, ep.key());
                                }
                                // With several endpoints the next one is tried
                                // at once while streams are missing.
                                if more && !duplicate && self.connected() < self.target() {
                                    Duration::ZERO
                                } else {
                                    jitter(cfg.interval)
                                }
                            }
                            Err(e) => {
                                let r = retry.entry(ep.key()).or_insert(Retry {
                                    at: now,
                                    backoff: cfg.interval,
                                });
                                tracing::warn!(server = %ep, error = %e, retry_in = %go_compat::duration::format(r.backoff), "cannot connect to proxy server");
                                let w = jitter(r.backoff);
                                r.at = tokio::time::Instant::now() + w;
                                r.backoff = r.backoff.mul_f64(1.5).min(cfg.interval_cap);
                                if more { Duration::ZERO } else { w }
                            }
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait.max(crate::limits::MIN_SYNC_PAUSE)) => {}
                // A lost stream is replaced without waiting out the interval.
                _ = self.lost.notified() => {}
                // Fixed endpoints have no sender: never a change.
                Ok(()) = endpoints.changed() => {}
                _ = self.draining.cancelled() => return,
                _ = self.drain.draining() => return,
            }
        }
    }

    fn start(self: &Arc<Self>, conn: crate::connect::Connection, endpoint: String) {
        let (server_id, server_count, flow_max) =
            (conn.server_id.clone(), conn.server_count, conn.flow_max);
        let (session, inbound) = Session::new(
            conn,
            self.metrics.clone(),
            self.session_cfg.clone(),
            self.drain.clone(),
            self.debug.clone(),
        );
        self.held.lock().insert(server_id.clone(), endpoint);
        self.sessions
            .lock()
            .insert(server_id.clone(), session.clone());
        tracing::info!(server_id = %server_id, server_count, flow_max, "connected to proxy server");
        let me = self.clone();
        let span = tracing::info_span!("server", server_id = %server_id);
        self.drain.spawn(
            async move {
                if me.draining.is_cancelled() {
                    session.send_drain().await;
                }
                session.serve(inbound).await;
                me.held.lock().remove(&session.server_id);
                me.sessions.lock().remove(&session.server_id);
                me.publish();
                me.lost.notify_one();
                tracing::info!("disconnected from proxy server");
            }
            .instrument(span),
        );
        // Only once the session's task is tracked: whoever sees the agent
        // connected also sees that task (tests take the task count then as
        // the steady state).
        self.publish();
    }

    /// First termination signal: no new servers, and tell every server we
    /// are leaving so it routes new dials elsewhere.
    pub async fn drain_all(&self) {
        self.draining.cancel();
        for s in self.sessions() {
            s.send_drain().await;
        }
    }

    /// Closes every stream.
    pub fn close_all(&self) {
        for s in self.sessions() {
            s.close();
        }
    }
}
