//! The soak's `floods` section (issue 33): an authenticated agent that
//! floods the agent port with HTTP/2 control frames while legitimate
//! tunnels are timed (their p99 beside the quiet figure), and one that does
//! not announce flow control and sends 4 MiB packets to tunnels whose
//! frontends stopped reading (the server's peak memory beside its budget).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use integration_tests::certs::Pki;
use integration_tests::client::{Frontend, grpc_dial, start_dial};
use integration_tests::h2raw::{self, frame};
use integration_tests::konnectivity::raw_agent;
use integration_tests::procs::{loopback, status_kib};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use tokio::io::AsyncWriteExt;

use super::{Report, Scale, agent, mib, server};

const SECTION: &str = "floods";

pub async fn run(report: &mut Report, scale: Scale) {
    control_frames(report, scale).await;
    // tests/tests/legacy_budget.rs covers it in every test run.
    if !scale.quick {
        legacy_agent(report).await;
    }
}

/// One legitimate tunnel: dial, 1 KiB there and back, close.
async fn tunnel(fe: &Frontend, echo: &str) -> Option<Duration> {
    let started = Instant::now();
    let mut t = grpc_dial(fe, echo).await.ok()?;
    let data = [5u8; 1024];
    t.write(&data).await;
    let back = tokio::time::timeout(Duration::from_secs(30), t.read_exact(data.len())).await;
    back.ok().filter(|b| b[..] == data)?;
    let took = started.elapsed();
    t.finish().await;
    Some(took)
}

/// Tunnels one after another for `d`: their times, and how many failed.
async fn timed(fe: &Frontend, echo: &str, d: Duration) -> (Vec<Duration>, usize) {
    let until = Instant::now() + d;
    let (mut times, mut failed) = (Vec::new(), 0);
    while Instant::now() < until {
        match tunnel(fe, echo).await {
            Some(t) => times.push(t),
            None => failed += 1,
        }
    }
    times.sort();
    (times, failed)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// A flooding agent: connects over TLS with its certificate, sends `one`
/// in batches until the server ends the connection, reconnects, until
/// `stop`. Counts the GOAWAYs it is sent.
async fn flooder(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    one: Vec<u8>,
    stop: Arc<AtomicBool>,
    goaways: Arc<AtomicU64>,
) {
    let batch = one.repeat(100);
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
            continue;
        };
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let Ok(mut s) = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
        else {
            continue;
        };
        if h2raw::start(&mut s).await.is_err() {
            continue;
        }
        let (mut rd, mut wr) = tokio::io::split(s);
        let g = goaways.clone();
        let reader = tokio::spawn(async move {
            while let Ok((kind, _, _, payload)) = h2raw::read_frame(&mut rd).await {
                if kind == h2raw::GOAWAY && payload.get(7) == Some(&0xb) {
                    g.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        while !stop.load(Ordering::Relaxed) {
            if wr.write_all(&batch).await.is_err() {
                break;
            }
        }
        let _ = reader.await;
    }
}

/// p99 of legitimate tunnels, quiet and while 4 TLS connections flood the
/// agent port with SETTINGS, then with WINDOW_UPDATE frames (each
/// reconnecting whenever it is sent away).
async fn control_frames(report: &mut Report, scale: Scale) {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (_srv, addrs) = server(&pki, dir.path(), &["--mode=grpc".into()]).await;
    let _agt = agent(&pki, &addrs["agent"], &[]).await;
    let fe = Frontend::Uds(dir.path().join("s.sock"));
    let echo = integration_tests::dest::echo().await.to_string();
    let agent_addr = loopback(&addrs["agent"]);
    let window = if scale.quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(20)
    };
    let identity = pki.client("flooder");
    let tls = Arc::new(
        daemon::tls::client_config(
            &pki.ca(),
            Some((&identity.cert, &identity.key)),
            &[b"h2".to_vec()],
        )
        .unwrap(),
    );
    // Warm up (first handshakes, allocator), then the quiet figure.
    let _ = timed(&fe, &echo, Duration::from_millis(500)).await;
    let (quiet, quiet_failed) = timed(&fe, &echo, window).await;
    let quiet_p99 = percentile(&quiet, 0.99);
    report.figure(
        SECTION,
        "agent port, quiet: legitimate tunnels (dial + 1 KiB echo), p50 / p99".into(),
        format!(
            "{} / {} ({} tunnels)",
            ms(percentile(&quiet, 0.5)),
            ms(quiet_p99),
            quiet.len()
        ),
        String::new(),
    );
    for (name, one) in [
        ("SETTINGS", frame(h2raw::SETTINGS, 0, 0, &[])),
        ("WINDOW_UPDATE", frame(8, 0, 0, &1u32.to_be_bytes())),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let goaways = Arc::new(AtomicU64::new(0));
        let floods: Vec<_> = (0..4)
            .map(|_| {
                tokio::spawn(flooder(
                    agent_addr,
                    tls.clone(),
                    one.clone(),
                    stop.clone(),
                    goaways.clone(),
                ))
            })
            .collect();
        let (flooded, failed) = timed(&fe, &echo, window).await;
        stop.store(true, Ordering::Relaxed);
        for f in floods {
            let _ = tokio::time::timeout(Duration::from_secs(10), f).await;
        }
        let p99 = percentile(&flooded, 0.99);
        report.figure(
            SECTION,
            format!(
                "agent port, {name} flood from 4 TLS connections: legitimate tunnels, p50 / p99"
            ),
            format!(
                "{} / {} ({} tunnels)",
                ms(percentile(&flooded, 0.5)),
                ms(p99),
                flooded.len()
            ),
            format!(
                "p99 ≤ 2 × quiet ({}); before the guard 0.7-2.2 s, upstream's server 0.07-0.5 s",
                ms(quiet_p99 * 2)
            ),
        );
        report.figure(
            SECTION,
            format!("agent port, {name} flood: p99 flooded / quiet"),
            format!(
                "{:.2}",
                p99.as_secs_f64() / quiet_p99.as_secs_f64().max(1e-9)
            ),
            "≤ 2".into(),
        );
        let sent_away = goaways.load(Ordering::Relaxed);
        report.limit(
            SECTION,
            format!(
                "agent port, {name} flood: connections sent away with GOAWAY ENHANCE_YOUR_CALM"
            ),
            sent_away.to_string(),
            "≥ 1".into(),
            sent_away >= 1,
        );
        report.limit(
            SECTION,
            format!("agent port, {name} flood: legitimate tunnels failed"),
            (failed + quiet_failed).to_string(),
            "0".into(),
            failed + quiet_failed == 0,
        );
    }
}

/// An agent without flow control sends 4 MiB packets, round after round,
/// to 32 tunnels whose frontends read nothing (default budgets).
async fn legacy_agent(report: &mut Report) {
    const STALLED: i64 = 32;
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (srv, addrs) = server(
        &pki,
        dir.path(),
        &[
            "--mode=grpc".into(),
            "--proxy-strategies=destHost,default".into(),
        ],
    )
    .await;
    let _agt = agent(
        &pki,
        &addrs["agent"],
        &["--agent-identifiers=ipv4=127.0.0.1".into()],
    )
    .await;
    let pid = srv.child.id().unwrap();
    let fe = Frontend::Uds(dir.path().join("s.sock"));
    let echo = integration_tests::dest::echo().await.to_string();
    let evil = raw_agent(&pki, loopback(&addrs["agent"]), "evil", "host=evil").await;
    let (tx, mut rx) = (evil.tx, evil.rx);
    let mut stalled = Vec::new();
    for id in 1..=STALLED {
        let mut t = start_dial(&fe, "evil:80").await;
        let req = loop {
            match rx.message().await.ok().flatten().and_then(|p| p.payload) {
                Some(Payload::DialRequest(r)) => break r,
                Some(_) => continue,
                None => return,
            }
        };
        let _ = tx
            .send(Packet::dial_response(req.random, id, String::new()))
            .await;
        let _ = t.rx.message().await;
        stalled.push(t);
    }
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = rx.message().await {} });
    let before = status_kib(pid, "VmHWM");
    let data = Bytes::from(vec![b'x'; (4 << 20) - 64]);
    let mut sent = 0u64;
    'flood: for _ in 0..4 {
        for id in 1..=STALLED {
            let send = tx.send(Packet::data(id, data.clone()));
            match tokio::time::timeout(Duration::from_secs(15), send).await {
                Ok(Ok(())) => sent += 1,
                _ => break 'flood,
            }
        }
    }
    let served = tunnel(&fe, &echo).await.is_some();
    let peak = status_kib(pid, "VmHWM");
    let grown = peak.saturating_sub(before);
    report.limit(
        SECTION,
        format!("legacy agent, 4 MiB packets to {STALLED} stalled tunnels ({sent} sent): proxy-server peak RSS growth"),
        mib(grown),
        "≤ --flow-control-budget (128 MiB) + 64 MiB (was 874 MiB for 20 tunnels)".into(),
        grown <= (128 + 64) * 1024,
    );
    report.limit(
        SECTION,
        "legacy agent flood: a tunnel through another agent".into(),
        if served { "served" } else { "failed" }.into(),
        "served".into(),
        served,
    );
    reader.abort();
    drop(stalled);
}
