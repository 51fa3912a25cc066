//! The soak's nodeport-proxy sections: memory cycles through every kind of
//! connection (SNI, HTTP/1.1 CONNECT, HTTP/2 CONNECT from tunnel-agent,
//! NodePort) with half-open connections beside them; slowloris floods at the
//! listener limit with legitimate clients timed through them; and a broken
//! table file and a taken node port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration_tests::dest;
use integration_tests::http_get;
use integration_tests::k8s::free_port;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::{
    client_hello, inventory, service, slices, try_connect_h1, with_mapping,
};
use integration_tests::procs::{Proc, status_kib};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{PeakWatch, Report, Scale, lowest, mib, spawn};

const HOST: &str = "echo.seed.example.com";
const AUTHORITY: &str = "echo.cluster-soak.svc.cluster.local:7000";

/// Where a running proxy (and its tunnel-agent) can be reached.
#[derive(Clone, Copy)]
struct Addrs {
    sni: SocketAddr,
    tunnel: SocketAddr,
    stats: SocketAddr,
    node_port: SocketAddr,
    agent: Option<SocketAddr>,
    agent_stats: Option<SocketAddr>,
}

struct Rig {
    proxy: Proc,
    agent: Option<Proc>,
    addrs: Addrs,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// An SNI + tunneling Service and a NodePort one, both to `echo`, plus
/// `extra` Services.
fn table(echo: SocketAddr, node_port: u16, extra: &[(Value, Vec<Value>)]) -> Value {
    let mut services = vec![
        with_mapping(
            service(
                "cluster-soak",
                "echo",
                "SNI, Tunneling",
                "ClusterIP",
                &[("raw", 7000, 0)],
            ),
            &[("raw", HOST)],
        ),
        service(
            "cluster-soak",
            "np",
            "NodePort",
            "NodePort",
            &[("tcp", 7000, node_port)],
        ),
    ];
    let mut slice_list = vec![
        slices("cluster-soak", "echo", "raw", &[(echo, true)]),
        slices("cluster-soak", "np", "tcp", &[(echo, true)]),
    ];
    for (s, l) in extra {
        services.push(s.clone());
        slice_list.push(l.clone());
    }
    inventory(services, slice_list)
}

/// Replaces the table file the way a ConfigMap update or an editor does.
fn write_table(file: &Path, text: &str) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Waits until `proc` answers 200 on `path`. `Err` with its log if it exited
/// first (a port picked for it was taken meanwhile, say).
async fn wait_healthy(
    proc: &mut Proc,
    stats: SocketAddr,
    what: &str,
    path: &str,
) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) =
            tokio::time::timeout(Duration::from_secs(2), http_get_safe(stats, path)).await
        {
            return Ok(());
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            return Err(format!(
                "{what} exited ({status}) before it was ready:\n{}",
                proc.lines_so_far().join("\n")
            ));
        }
        assert!(
            Instant::now() < end,
            "{what} not ready within 60 s:\n{}",
            proc.lines_so_far().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `name` with ports picked by `args` (called again for each
/// attempt): the ports are picked free but bound by the child later, so
/// another process may take one meanwhile; then the child exits and the
/// start is retried with new ports.
async fn start_healthy<T>(
    bins: Option<&Path>,
    name: &str,
    path: &str,
    mut args: impl FnMut() -> (Vec<String>, SocketAddr, T),
) -> (Proc, T) {
    let mut last = String::new();
    for _ in 0..5 {
        let (a, stats, picked) = args();
        let mut p = spawn(bins, name, &a);
        match wait_healthy(&mut p, stats, name, path).await {
            Ok(()) => return (p, picked),
            Err(e) => last = e,
        }
    }
    panic!("{name} did not start in 5 attempts; the last: {last}");
}

/// `http_get` that reports a refused connection instead of panicking.
async fn http_get_safe(addr: SocketAddr, path: &str) -> (u16, String) {
    if TcpStream::connect(addr).await.is_err() {
        return (0, String::new());
    }
    http_get(addr, path).await
}

impl Rig {
    async fn start(bins: Option<&Path>, echo: SocketAddr, extra: &[String], agent: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("table.json");
        let (proxy, (node_port, sni, tunnel, stats)) =
            start_healthy(bins, "nodeport-proxy", "/healthz", || {
                let node_port = free_port();
                std::fs::write(&file, table(echo, node_port, &[]).to_string()).unwrap();
                let (sni, tunnel, stats) = (free_port(), free_port(), free_port());
                let mut args: Vec<String> = vec![
                    format!("-config={}", file.display()),
                    "-bind-address=127.0.0.1".into(),
                    format!("-envoy-sni-port={sni}"),
                    format!("-envoy-tunneling-port={tunnel}"),
                    format!("-envoy-stats-port={stats}"),
                ];
                args.extend(extra.iter().cloned());
                (args, loopback(stats), (node_port, sni, tunnel, stats))
            })
            .await;
        let mut addrs = Addrs {
            sni: loopback(sni),
            tunnel: loopback(tunnel),
            stats: loopback(stats),
            node_port: loopback(node_port),
            agent: None,
            agent_stats: None,
        };
        let agent = if agent {
            let (p, (listen, astats)) = start_healthy(bins, "tunnel-agent", "/ready", || {
                let (listen, astats) = (free_port(), free_port());
                let args = vec![
                    "-proxy-host=127.0.0.1".into(),
                    format!("-proxy-port={tunnel}"),
                    format!("-listener=127.0.0.1:{listen}={AUTHORITY}"),
                    "-stats-address=127.0.0.1".into(),
                    format!("-stats-port={astats}"),
                ];
                (args, loopback(astats), (listen, astats))
            })
            .await;
            addrs.agent = Some(loopback(listen));
            addrs.agent_stats = Some(loopback(astats));
            Some(p)
        } else {
            None
        };
        Rig {
            proxy,
            agent,
            addrs,
            file,
            _dir: dir,
        }
    }

    fn pids(&self) -> Vec<u32> {
        let mut p = vec![self.proxy.child.id().unwrap()];
        if let Some(a) = &self.agent {
            p.push(a.child.id().unwrap());
        }
        p
    }

    async fn metrics(&self) -> String {
        http_get(self.addrs.stats, "/stats/prometheus").await.1
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sni,
    Connect,
    Agent,
    NodePort,
}

const KINDS: [Kind; 4] = [Kind::Sni, Kind::Connect, Kind::Agent, Kind::NodePort];

/// Opens a connection of `kind` and proves it routed by an echo of
/// `payload` bytes; also returns how long routing took (connect to the first
/// byte back through the route).
async fn open(a: Addrs, kind: Kind, payload: usize) -> Option<(TcpStream, Duration)> {
    let t0 = Instant::now();
    let (mut s, routed) = match kind {
        Kind::Sni => {
            let mut s = TcpStream::connect(a.sni).await.ok()?;
            let hello = client_hello(HOST);
            s.write_all(&hello).await.ok()?;
            let mut back = vec![0u8; hello.len()];
            s.read_exact(&mut back).await.ok()?;
            (back == hello).then_some(())?;
            (s, Some(t0.elapsed()))
        }
        Kind::Connect => {
            let (code, s) = try_connect_h1(a.tunnel, AUTHORITY).await?;
            (code == 200).then_some(())?;
            (s, Some(t0.elapsed()))
        }
        Kind::Agent => (TcpStream::connect(a.agent?).await.ok()?, None),
        Kind::NodePort => (TcpStream::connect(a.node_port).await.ok()?, None),
    };
    let data = vec![b'x'; payload];
    s.write_all(&data).await.ok()?;
    let mut back = vec![0u8; payload];
    s.read_exact(&mut back).await.ok()?;
    let routed = routed.unwrap_or_else(|| t0.elapsed());
    (back == data).then_some((s, routed))
}

/// Open connections the proxy counts on its listeners.
fn listener_connections(m: &str) -> f64 {
    m.lines()
        .filter(|l| l.starts_with("envoy_listener_downstream_cx_active{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (bounded) until the proxy holds at most `n` connections.
async fn wait_connections(rig: &Rig, n: f64) {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end && listener_connections(&rig.metrics().await) > n {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn silent(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    futures::stream::iter(0..n)
        .map(|_| async move { TcpStream::connect(addr).await.ok() })
        .buffer_unordered(256)
        .filter_map(|s| async move { s })
        .collect()
        .await
}

struct Sizes {
    held: usize,
    silent: usize,
    short: usize,
}

/// Memory cycles: connections of every kind held and short-lived, with
/// half-open ones beside them, then all closed; RSS must come back.
pub async fn memory(report: &mut Report, scale: Scale, bins: Option<&Path>) {
    let section = "memory";
    let sizes = if scale.quick {
        Sizes {
            held: 200,
            silent: 200,
            short: 200,
        }
    } else {
        // Agent tunnels share one HTTP/2 connection of at most 1024
        // streams: a quarter of the held ones plus the short ones in flight.
        Sizes {
            held: 3200,
            silent: 4000,
            short: 4000,
        }
    };
    let echo = dest::echo().await;
    let rig = Rig::start(bins, echo, &[], true).await;
    let pids = rig.pids();
    let names = ["nodeport-proxy", "tunnel-agent"];
    let idle = lowest(&pids, Duration::from_secs(1)).await;
    let mut peaks = Vec::new();
    // Failures by what failed: held / short per kind, and half-open.
    let mut held_failed = [0usize; 4];
    let mut short_failed = [0usize; 4];
    let mut half_open_failed = 0;
    for cycle in 1..=scale.cycles {
        let watch = PeakWatch::start(&pids);
        let a = rig.addrs;
        let mut half_open = silent(a.sni, sizes.silent / 2).await;
        half_open.extend(silent(a.tunnel, sizes.silent - sizes.silent / 2).await);
        let held: Vec<_> = futures::stream::iter(0..sizes.held)
            .map(|i| async move { (i % 4, open(a, KINDS[i % 4], 1024).await.map(|(s, _)| s)) })
            .buffer_unordered(200)
            .collect()
            .await;
        let short: Vec<(usize, bool)> = futures::stream::iter(0..sizes.short)
            .map(|i| async move { (i % 4, open(a, KINDS[i % 4], 16 << 10).await.is_some()) })
            .buffer_unordered(100)
            .collect()
            .await;
        for (k, ok) in short {
            short_failed[k] += usize::from(!ok);
        }
        for (k, s) in &held {
            held_failed[*k] += usize::from(s.is_none());
        }
        half_open_failed += sizes.silent - half_open.len();
        drop(held);
        drop(half_open);
        // The agent's HTTP/2 connection stays.
        wait_connections(&rig, 1.0).await;
        let peak = watch.finish().await;
        let low = lowest(&pids, scale.settle).await;
        for (i, name) in names.iter().enumerate() {
            let label = format!("{name}, cycle {cycle}");
            report.cycle(section, &label, scale.settle, peak[i], low[i], idle[i]);
        }
        peaks.push(peak);
    }
    for (i, name) in names.iter().enumerate() {
        report.peaks(section, name, peaks.iter().map(|p| p[i]));
    }
    let errors =
        held_failed.iter().sum::<usize>() + short_failed.iter().sum::<usize>() + half_open_failed;
    report.limit(
        section,
        format!(
            "nodeport-proxy: failed connections ({} cycles of {} held (SNI, HTTP/1.1 CONNECT, tunnel-agent HTTP/2, NodePort) + {} short + {} half-open)",
            scale.cycles, sizes.held, sizes.short, sizes.silent
        ),
        if errors == 0 {
            "0".into()
        } else {
            let by_kind = |f: &[usize; 4]| {
                KINDS
                    .iter()
                    .zip(f)
                    .map(|(k, n)| format!("{k:?} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "{errors} (held: {}; short: {}; half-open: {half_open_failed})",
                by_kind(&held_failed),
                by_kind(&short_failed)
            )
        },
        "0".into(),
        errors == 0,
    );
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

/// Slowloris at the listener limit (issue 14.4): the listener is filled
/// with half-open connections and an attacker keeps opening more, while
/// legitimate clients connect and are timed until routed.
pub async fn slowloris(report: &mut Report, scale: Scale, bins: Option<&Path>) {
    let section = "slowloris";
    let (limit, legit, rate) = if scale.quick {
        (300usize, 50usize, 100u32)
    } else {
        (10_000, 200, 500)
    };
    let echo = dest::echo().await;
    let rig = Rig::start(
        bins,
        echo,
        &[format!("-max-connections-per-listener={limit}")],
        false,
    )
    .await;
    let pid = rig.proxy.child.id().unwrap();
    let idle = lowest(&[pid], Duration::from_secs(1)).await[0];
    let watch = PeakWatch::start(&[pid]);
    for (name, kind, addr) in [
        ("6443 (SNI)", Kind::Sni, rig.addrs.sni),
        ("8088 (tunneling)", Kind::Connect, rig.addrs.tunnel),
    ] {
        let flood = silent(addr, limit).await;
        let full = status_kib(pid, "VmRSS");
        // The attacker goes on opening half-open connections.
        let stop = Arc::new(AtomicBool::new(false));
        let attacker = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut held = std::collections::VecDeque::new();
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                let per_tick = (rate / 100).max(1);
                let mut opened = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    for _ in 0..per_tick {
                        if let Ok(s) = TcpStream::connect(addr).await {
                            held.push_back(s);
                            opened += 1;
                        }
                    }
                    // The proxy sheds the oldest; keep our descriptors bounded too.
                    while held.len() > 2000 {
                        held.pop_front();
                    }
                }
                opened
            })
        };
        let a = rig.addrs;
        let times: Vec<Option<Duration>> = futures::stream::iter(0..legit)
            .map(|i| async move {
                tokio::time::sleep(Duration::from_millis(20) * i as u32).await;
                tokio::time::timeout(Duration::from_secs(30), open(a, kind, 64))
                    .await
                    .ok()
                    .flatten()
                    .map(|(_, t)| t)
            })
            .buffer_unordered(legit)
            .collect()
            .await;
        stop.store(true, Ordering::Relaxed);
        let attacked = attacker.await.unwrap_or(0);
        let mut ok: Vec<Duration> = times.iter().flatten().copied().collect();
        ok.sort();
        let shed = metric(
            &rig.metrics().await,
            &format!(
                "nodeport_proxy_rejected_connections_total{{envoy_listener_address=\"127.0.0.1_{}\",reason=\"shed_unrouted\"}}",
                addr.port()
            ),
        );
        drop(flood);
        report.limit(
            section,
            format!(
                "{name}: legitimate connections routed while {limit} half-open held the listener and {attacked} more came"
            ),
            format!("{} of {legit}", ok.len()),
            format!("{legit} of {legit}"),
            ok.len() == legit,
        );
        report.figure(
            section,
            format!("{name}: legitimate connection's time to route, p50 / p99 / max"),
            format!(
                "{} / {} / {}",
                ms(percentile(&ok, 0.5)),
                ms(percentile(&ok, 0.99)),
                ms(ok.last().copied().unwrap_or_default())
            ),
            "p99 < 100 ms (was 6-9 s)".into(),
        );
        report.figure(
            section,
            format!("{name}: half-open connections shed for newcomers"),
            format!("{shed}"),
            String::new(),
        );
        report.figure(
            section,
            format!("{name}: nodeport-proxy RSS with {limit} half-open connections"),
            // Against the RSS before any flood: the second flood reuses what
            // the allocator kept from the first, so "just before it" said 0.
            format!(
                "{} ({:.1} KiB each over the idle {})",
                mib(full),
                full.saturating_sub(idle) as f64 / limit as f64,
                mib(idle)
            ),
            String::new(),
        );
        wait_connections(&rig, 0.0).await;
    }
    let peak = watch.finish().await[0];
    let low = lowest(&[pid], scale.settle).await[0];
    report.figure(
        section,
        format!(
            "nodeport-proxy: peak / lowest within {:?} after",
            scale.settle
        ),
        format!("{} / {}", mib(peak), mib(low)),
        "(was 8 → 107 MB, kept)".into(),
    );
    report.limit(
        section,
        "nodeport-proxy: lowest RSS after the floods".into(),
        mib(low),
        format!("≤ idle ({}) + 10 % + 16 MiB", mib(idle)),
        low <= idle + idle / 10 + 16 * 1024,
    );
}

/// Lines the proxy logged since the last look that contain `needle`.
fn count_lines(p: &mut Proc, needle: &str) -> usize {
    p.lines_so_far()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

async fn wait_metric(rig: &Rig, series: &str, want: impl Fn(f64) -> bool, what: &str) -> Duration {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(60);
    loop {
        if want(metric(&rig.metrics().await, series)) {
            return t0.elapsed();
        }
        assert!(Instant::now() < end, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broken table file and a taken node port (issue 14.7): one error each,
/// the last good table keeps serving, /healthz and metrics say why.
pub async fn config(report: &mut Report, scale: Scale, bins: Option<&Path>) {
    let section = "config";
    let echo = dest::echo().await;
    let mut rig = Rig::start(bins, echo, &[], false).await;
    let node_port = rig.addrs.node_port.port();
    let good = table(echo, node_port, &[]).to_string();
    rig.proxy.lines_so_far();
    // A broken file, then a busy directory and the same bytes again.
    write_table(&rig.file, "{\"services\": [");
    let failed = "nodeport_proxy_table_reloads_total{result=\"failed\"} ";
    wait_metric(&rig, failed, |v| v >= 1.0, "the broken file's failure").await;
    let log = rig.file.with_file_name("proxy.log");
    let neighbour_writes = if scale.quick { 50 } else { 500 };
    for i in 0..neighbour_writes {
        std::fs::write(&log, format!("line {i}\n")).unwrap();
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for _ in 0..5 {
        std::fs::write(&rig.file, "{\"services\": [").unwrap();
    }
    let (code, health) = http_get(rig.addrs.stats, "/healthz").await;
    let serving = open(rig.addrs, Kind::Sni, 64).await.is_some();
    // Repaired, with one more Service: applied.
    let extra = (
        service(
            "cluster-soak",
            "extra",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 7001, 0)],
        ),
        slices("cluster-soak", "extra", "tcp", &[(echo, true)]),
    );
    write_table(&rig.file, &table(echo, node_port, &[extra]).to_string());
    wait_metric(
        &rig,
        "nodeport_proxy_routes{kind=\"tunnel\"} ",
        |v| v >= 2.0,
        "the repaired file",
    )
    .await;
    let errors = count_lines(&mut rig.proxy, "routing table not reloaded");
    let m = rig.metrics().await;
    report.limit(
        section,
        format!(
            "broken table file, {neighbour_writes} writes to a file beside it and 5 identical rewrites: errors logged"
        ),
        errors.to_string(),
        "1 (was one every 50 ms)".into(),
        errors == 1,
    );
    report.limit(
        section,
        "broken table file: reload failures counted".into(),
        metric(&m, failed).to_string(),
        "1".into(),
        metric(&m, failed) == 1.0,
    );
    let shown = code == 200 && health.contains("routing table: last reload failed: parsing");
    report.limit(
        section,
        "broken table file: /healthz 200 naming the error".into(),
        shown.to_string(),
        "true".into(),
        shown,
    );
    report.limit(
        section,
        "broken table file: the last good table still serves".into(),
        serving.to_string(),
        "true".into(),
        serving,
    );
    drop(good);

    // A node port another process holds.
    let blocker = integration_tests::nodeport::listener_below_ephemeral_ports();
    let taken = blocker.local_addr().unwrap().port();
    let np2 = (
        service(
            "cluster-soak",
            "taken",
            "NodePort",
            "NodePort",
            &[("tcp", 7002, taken)],
        ),
        slices("cluster-soak", "taken", "tcp", &[(echo, true)]),
    );
    rig.proxy.lines_so_far();
    write_table(&rig.file, &table(echo, node_port, &[np2]).to_string());
    wait_metric(
        &rig,
        "nodeport_proxy_node_ports_unbound ",
        |v| v == 1.0,
        "the taken node port",
    )
    .await;
    let attempts = if scale.quick { 2.0 } else { 4.0 };
    wait_metric(
        &rig,
        "nodeport_proxy_node_port_bind_failures_total ",
        |v| v >= attempts,
        "bind retries",
    )
    .await;
    let (code, health) = http_get(rig.addrs.stats, "/healthz").await;
    let shown = code == 200 && health.contains(&format!("node port {taken}: not listening"));
    let errors = count_lines(&mut rig.proxy, "cannot bind NodePort listener");
    report.limit(
        section,
        format!("taken node port, {attempts} bind attempts: errors logged"),
        errors.to_string(),
        "1".into(),
        errors == 1,
    );
    report.limit(
        section,
        "taken node port: /healthz 200 naming it, nodeport_proxy_node_ports_unbound 1".into(),
        shown.to_string(),
        "true".into(),
        shown,
    );
    drop(blocker);
    let took = wait_metric(
        &rig,
        "nodeport_proxy_node_ports_unbound ",
        |v| v == 0.0,
        "the freed node port",
    )
    .await;
    let mut a = rig.addrs;
    a.node_port = loopback(taken);
    let served = open(a, Kind::NodePort, 64).await.is_some();
    report.limit(
        section,
        "taken node port: served once freed".into(),
        served.to_string(),
        "true".into(),
        served,
    );
    report.figure(
        section,
        "taken node port: time from freed to listening".into(),
        format!("{:.1} s", took.as_secs_f64()),
        "≤ 30 s (back-off cap)".into(),
    );
}

/// An idle tunnel-agent and nodeport-proxy pair with KKP's settings (issue
/// 15.1): the agent's one HTTP/2 connection outlives the proxy's 10 s
/// request-head deadline (which once closed it) and several 30 s PINGs; it
/// is still the only connection at the end, and traffic flows through it.
/// The full run idles 65 s; the quick one 12 s, past that deadline.
pub async fn idle_agent(report: &mut Report, scale: Scale, bins: Option<&Path>) {
    let section = "kkp";
    let idle = if scale.quick {
        Duration::from_secs(12)
    } else {
        Duration::from_secs(65)
    };
    let echo = dest::echo().await;
    let rig = Rig::start(bins, echo, &[], true).await;
    let Some(agent_stats) = rig.addrs.agent_stats else {
        unreachable!("the rig was started with an agent")
    };
    tokio::time::sleep(idle).await;
    let flows = open(rig.addrs, Kind::Agent, 64).await.is_some();
    let proxy_side = metric(
        &rig.metrics().await,
        "envoy_http_downstream_cx_total{envoy_http_conn_manager_prefix=\"ingress_http\"}",
    );
    let agent_side = metric(
        &http_get(agent_stats, "/stats/prometheus").await.1,
        "envoy_cluster_upstream_cx_total{envoy_cluster_name=\"proxy_cluster\"}",
    );
    let secs = idle.as_secs();
    report.limit(
        section,
        format!("idle tunnel-agent: connections the proxy accepted in {secs} s"),
        format!("{proxy_side}"),
        "= 1".into(),
        proxy_side == 1.0,
    );
    report.limit(
        section,
        format!("idle tunnel-agent: connections the agent opened in {secs} s"),
        format!("{agent_side}"),
        "= 1".into(),
        agent_side == 1.0,
    );
    report.limit(
        section,
        "idle tunnel-agent: a tunnel through it after the idle time".into(),
        if flows { "flows" } else { "fails" }.into(),
        "flows".into(),
        flows,
    );
}
