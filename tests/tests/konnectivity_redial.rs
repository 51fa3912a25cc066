//! Dials that survive agent churn (issue 38.1; upstream fails them: #566,
//! #126): a dial whose agent dies or starts draining before its DIAL_RSP
//! is sent once to another agent that serves its address, and the
//! frontend sees one successful dial.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;

use integration_tests::certs::Pki;
use integration_tests::client::{Frontend, grpc_dial, http_connect, start_dial};
use integration_tests::dest;
use integration_tests::konnectivity::{ServerOpts, init_logging, metric, raw_agent, start_server};
use integration_tests::procs::{Proc, loopback, server_on_socket};
use integration_tests::{eventually, http_get};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESENT: &str = "konnectivity_network_proxy_server_dials_resent_total";
const READY: &str = "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} ";
const PENDING: &str = "konnectivity_network_proxy_server_pending_backend_dials";
/// How long a metrics condition may take to hold on a loaded machine.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// One of our proxy-agent processes, connected to every server in `ports`.
fn agent(pki: &Pki, id: &str, ports: &[u16], extra: &[String]) -> Proc {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec![
        format!("--ca-cert={}", pki.ca().display()),
        format!("--proxy-server-host={}", hosts.join(",")),
        "--health-server-host=127.0.0.1".into(),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        format!("--agent-id={id}"),
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ];
    args.extend_from_slice(extra);
    Proc::spawn("proxy-agent", &args)
}

/// A dial through `frontend` to the echo at `echo`, and one round trip on
/// it: `Err` with what the frontend said when it failed.
async fn dial_and_echo(frontend: &Frontend, grpc: bool, echo: SocketAddr) -> Result<(), String> {
    let what = b"served";
    if grpc {
        let mut t = grpc_dial(frontend, &echo.to_string())
            .await
            .map_err(|e| e.0)?;
        t.write(what).await;
        let back = t.read_exact(what.len()).await;
        t.close().await;
        return (back == what).then_some(()).ok_or("echo differed".into());
    }
    let reply = http_connect(frontend, &echo.to_string()).await;
    if reply.status != 200 {
        return Err(format!("{} {}", reply.head, reply.body));
    }
    let mut s = reply.stream;
    s.write_all(what).await.map_err(|e| e.to_string())?;
    let mut back = [0u8; 6];
    s.read_exact(&mut back).await.map_err(|e| e.to_string())?;
    (&back == what).then_some(()).ok_or("echo differed".into())
}

/// Two servers, one with a gRPC frontend and one with an HTTP-CONNECT
/// frontend (each on a Unix socket, `--server-count=2`): the frontends
/// (with whether each is gRPC and the server's health address) and the
/// agent ports.
async fn two_servers(
    pki: &Pki,
    dirs: [&std::path::Path; 2],
) -> (Vec<Proc>, Vec<(Frontend, bool, SocketAddr)>, Vec<u16>) {
    let mut servers = Vec::new();
    let mut fronts = Vec::new();
    let mut ports = Vec::new();
    for (dir, mode, id) in [
        (dirs[0], "grpc", "server-grpc"),
        (dirs[1], "http-connect", "server-http"),
    ] {
        let (p, sock, addrs): (Proc, PathBuf, _) = server_on_socket(
            pki,
            dir,
            &[
                format!("--mode={mode}"),
                format!("--server-id={id}"),
                "--server-count=2".into(),
            ],
        )
        .await;
        fronts.push((
            Frontend::Uds(sock),
            mode == "grpc",
            loopback(&addrs["health"]),
        ));
        ports.push(loopback(&addrs["agent"]).port());
        servers.push(p);
    }
    (servers, fronts, ports)
}

/// Waits until every server has registered `n` agents.
async fn wait_ready(fronts: &[(Frontend, bool, SocketAddr)], n: f64) {
    for (_, _, health) in fronts {
        eventually(&format!("{n} agents registered"), PATIENCE, || async {
            metric(&http_get(*health, "/metrics").await.1, READY) == n
        })
        .await;
    }
}

/// A proxy-agent connected to both servers.
async fn connected_agent(pki: &Pki, id: &str, ports: &[u16], extra: &[String]) -> Proc {
    let mut a = agent(pki, id, ports, extra);
    for _ in 0..ports.len() {
        a.wait_line("connected to proxy server").await;
    }
    a
}

/// Two agents serve two servers (a gRPC frontend and an HTTP-CONNECT one);
/// one agent freezes (SIGSTOP), so the dials the servers give it stay
/// unanswered, and is then killed (SIGKILL) while dials keep coming on both
/// frontends. Every dial succeeds: those pending on the dead agent are
/// answered by the other, later ones go to it. Upstream's server fails each
/// dial pending on the dead agent.
#[tokio::test]
async fn no_dial_is_lost_when_an_agent_is_killed_under_load() {
    let pki = Pki::new();
    let (grpc_dir, http_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_servers, fronts, ports) = two_servers(&pki, [grpc_dir.path(), http_dir.path()]).await;
    let doomed = connected_agent(&pki, "doomed", &ports, &[]).await;
    let _survivor = connected_agent(&pki, "survivor", &ports, &[]).await;
    wait_ready(&fronts, 2.0).await;
    let echo = dest::echo().await;

    // The doomed agent freezes: dials given to it wait for an answer.
    doomed.signal(19);
    const PER_FRONTEND: usize = 60;
    let mut load = tokio::task::JoinSet::new();
    for (front, grpc, _) in &fronts {
        for _ in 0..PER_FRONTEND {
            let (front, grpc) = (front.clone(), *grpc);
            load.spawn(async move { dial_and_echo(&front, grpc, echo).await });
        }
    }
    // Every dial the frozen agent was given is pending; wait until each
    // server holds some (half the dials go to each agent, at random).
    for (_, _, health) in &fronts {
        eventually("5 dials pending on the frozen agent", PATIENCE, || async {
            metric(
                &http_get(*health, "/metrics").await.1,
                &format!("{PENDING} "),
            ) >= 5.0
        })
        .await;
    }
    doomed.signal(9);
    // The load goes on while and after the agent dies.
    for (front, grpc, _) in &fronts {
        for _ in 0..PER_FRONTEND {
            let (front, grpc) = (front.clone(), *grpc);
            load.spawn(async move { dial_and_echo(&front, grpc, echo).await });
        }
    }
    let mut failed = Vec::new();
    let mut served = 0;
    while let Some(r) = load.join_next().await {
        match r.unwrap() {
            Ok(()) => served += 1,
            Err(e) => failed.push(e),
        }
    }
    assert_eq!(
        (served, failed.len()),
        (4 * PER_FRONTEND, 0),
        "dials failed though the surviving agent could serve them: {failed:?}"
    );
    for (_, grpc, health) in &fronts {
        let (_, m) = http_get(*health, "/metrics").await;
        assert!(
            metric(&m, &format!("{RESENT} ")) >= 5.0,
            "grpc={grpc}: the frozen agent's dials were not re-sent:\n{m}"
        );
        assert_eq!(metric(&m, &format!("{PENDING} ")), 0.0, "{m}");
    }
}

/// A rolling restart of both agents (SIGTERM: DRAIN, serve for the grace
/// period, exit; then a new agent) under a steady dial load on both
/// frontends: no dial fails, and none of the connections either.
#[tokio::test]
async fn no_dial_is_lost_in_a_rolling_restart_of_both_agents() {
    let pki = Pki::new();
    let (grpc_dir, http_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_servers, fronts, ports) = two_servers(&pki, [grpc_dir.path(), http_dir.path()]).await;
    let grace = ["--graceful-shutdown-timeout=1s".to_string()];
    let mut old = vec![
        connected_agent(&pki, "old-a", &ports, &grace).await,
        connected_agent(&pki, "old-b", &ports, &grace).await,
    ];
    wait_ready(&fronts, 2.0).await;
    let echo = dest::echo().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    // Four clients per frontend, each dialing one connection after the
    // other until told to stop (bounded by count too).
    for (front, grpc, _) in &fronts {
        for _ in 0..4 {
            let (front, grpc, stop) = (front.clone(), *grpc, stop.clone());
            load.spawn(async move {
                let (mut served, mut failed) = (0usize, Vec::new());
                for _ in 0..20_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    match dial_and_echo(&front, grpc, echo).await {
                        Ok(()) => served += 1,
                        Err(e) => failed.push(e),
                    }
                }
                (served, failed)
            });
        }
    }
    let mut new = Vec::new();
    for (i, mut a) in old.drain(..).enumerate() {
        a.signal(15);
        a.wait_line("draining").await;
        assert_eq!(a.wait_exit().await, Some(0), "{}", a.log.join("\n"));
        new.push(connected_agent(&pki, &format!("new-{i}"), &ports, &grace).await);
        wait_ready(&fronts, 2.0).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut served, mut failed) = (0, Vec::new());
    while let Some(r) = load.join_next().await {
        let (s, f) = r.unwrap();
        served += s;
        failed.extend(f);
    }
    assert!(served >= 8, "the load ran: {served} dials");
    assert!(
        failed.is_empty(),
        "{} of {} dials failed in the rolling restart: {failed:?}",
        failed.len(),
        served + failed.len()
    );
}

/// A dial pending on an agent that starts draining goes to an agent that
/// does not: the draining one is told to drop it (DIAL_CLS), its late
/// answer is closed (CLOSE_REQ) without reaching the frontend or counting
/// as a failure, and the other agent's answer completes the dial.
#[tokio::test]
async fn a_dial_pending_on_a_draining_agent_goes_to_another() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let mut one = raw_agent(&pki, server.agent_addr, "agent-one", "").await;
    let mut two = raw_agent(&pki, server.agent_addr, "agent-two", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 2).await;
    let mut tunnel = start_dial(&server.frontend, "127.0.0.1:9").await;
    // Whichever agent it reached drains.
    let (first, second, request) = tokio::select! {
        p = one.rx.message() => (&mut one, &mut two, p),
        p = two.rx.message() => (&mut two, &mut one, p),
    };
    let request = request.unwrap().unwrap();
    assert!(
        matches!(&request.payload, Some(Payload::DialRequest(r)) if r.random == tunnel.dial_id),
        "{request:?}"
    );
    first.tx.send(Packet::drain()).await.unwrap();
    // The other agent gets the same dial...
    let again = second.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(&again.payload, Some(Payload::DialRequest(r))
            if r.random == tunnel.dial_id && r.address == "127.0.0.1:9"),
        "{again:?}"
    );
    // ...and the draining one is told to drop it.
    let cls = first.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(&cls.payload, Some(Payload::CloseDial(c)) if c.random == tunnel.dial_id),
        "{cls:?}"
    );
    // Its late answer is closed on it.
    first
        .tx
        .send(Packet::dial_response(tunnel.dial_id, 77, String::new()))
        .await
        .unwrap();
    let close = first.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(&close.payload, Some(Payload::CloseRequest(c)) if c.connect_id == 77),
        "{close:?}"
    );
    // The other's answer is the frontend's.
    second
        .tx
        .send(Packet::dial_response(tunnel.dial_id, 5, String::new()))
        .await
        .unwrap();
    let rsp = tunnel.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(&rsp.payload, Some(Payload::DialResponse(r))
            if r.error.is_empty() && r.connect_id == 5),
        "{rsp:?}"
    );
    let m = server.handle.metrics();
    assert_eq!(metric(&m, &format!("{RESENT} ")), 1.0, "{m}");
    assert!(
        !m.contains("konnectivity_network_proxy_server_dial_failure_count{"),
        "a superseded answer is not a failure: {m}"
    );
    drop(tunnel);
}

/// `--resend-unanswered-dials=false` turns the re-send off: a dial pending
/// on an agent whose stream ends fails at once, as upstream's does, although
/// another agent serves its address; nothing is counted as re-sent.
#[tokio::test]
async fn with_the_resend_off_a_dial_pending_on_a_lost_agent_fails() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            resend_dials: false,
            ..Default::default()
        },
    )
    .await;
    let one = raw_agent(&pki, server.agent_addr, "agent-one", "").await;
    let two = raw_agent(&pki, server.agent_addr, "agent-two", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 2).await;
    let mut tunnel = start_dial(&server.frontend, "127.0.0.1:9").await;
    let (mut one, mut two) = (one, two);
    // Whichever agent it reached goes away without answering.
    let first_got_it = tokio::select! {
        p = one.rx.message() => { p.unwrap().unwrap(); true }
        p = two.rx.message() => { p.unwrap().unwrap(); false }
    };
    let _survivor = if first_got_it {
        drop(one);
        two
    } else {
        drop(two);
        one
    };
    let rsp = tunnel.rx.message().await.unwrap().unwrap();
    assert!(
        matches!(&rsp.payload, Some(Payload::DialResponse(r))
            if r.random == tunnel.dial_id && r.error == "agent stream closed before the dial completed"),
        "{rsp:?}"
    );
    let m = server.handle.metrics();
    assert!(!m.contains(RESENT), "nothing re-sent: {m}");
}
