//! The soak's per-cluster fault isolation section (issue 38, KKP #15962):
//! one nodeport-proxy with three SNI clusters; 10,000 connections each are
//! sent to a blackholed cluster (connects never answered) and to a stalled
//! one (accepts, never reads) while the third is used normally: its
//! connection times and throughput against its quiet figures, the faulty
//! clusters' circuit breakers, the process's RSS. By default the floods
//! come as fast as the proxy takes them and the working cluster keeps its
//! CPU busy; `SOAK_ISOLATION_FLOOD_RATE` and `SOAK_ISOLATION_PACE` set both
//! to fixed rates (RELIABILITY.md, "A storm at a fixed rate").

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use integration_tests::dest;
use integration_tests::http_get;
use integration_tests::k8s::free_port;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::{
    client_hello, inventory, service, slices, try_connect_from, with_mapping,
};
use integration_tests::procs::{Proc, status_kib};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::pinning::Pinning;
use super::{PeakWatch, Report, Scale, cpu_seconds, lowest, mib, spawn};

const HOLE: &str = "hole.seed.example.com";
const STALL: &str = "stall.seed.example.com";
const ECHO: &str = "echo.seed.example.com";
const HOLE_CLUSTER: &str = "cluster-b/hole-https";
const STALL_CLUSTER: &str = "cluster-c/stall-https";
const ECHO_CLUSTER: &str = "cluster-a/echo-https";
/// The connection bounds this section sets: Envoy's defaults, the bounds
/// KKP's Envoy has (ours allows 4,096 connections); the quick run (CI)
/// sets a quarter of them and sends a tenth of the connections.
const MAX_CONNECTIONS: f64 = 1024.0;
/// Quiet/storm pairs the working cluster is timed in (one in a quick run).
const STORM_PAIRS: usize = 3;
const MAX_BUFFERED_MIB: u64 = 16;
const BUFFER_KIB: u64 = 16;

fn table(hole: SocketAddr, stall: SocketAddr, echo: SocketAddr) -> serde_json::Value {
    let svc = |ns: &str, name: &str, host: &str| {
        with_mapping(
            service(ns, name, "SNI", "ClusterIP", &[("https", 6443, 0)]),
            &[("https", host)],
        )
    };
    inventory(
        vec![
            svc("cluster-b", "hole", HOLE),
            svc("cluster-c", "stall", STALL),
            svc("cluster-a", "echo", ECHO),
        ],
        vec![
            slices("cluster-b", "hole", "https", &[(hole, true)]),
            slices("cluster-c", "stall", "https", &[(stall, true)]),
            slices("cluster-a", "echo", "https", &[(echo, true)]),
        ],
    )
}

fn series(text: &str, name: &str, cluster: &str) -> f64 {
    metric(text, &format!("{name}{{envoy_cluster_name=\"{cluster}\"}}"))
}

/// One connection to the working cluster: connect, ClientHello, the same
/// bytes echoed back.
async fn one(sni: SocketAddr, hello: &[u8]) -> Option<Duration> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(sni).await.ok()?;
    s.write_all(hello).await.ok()?;
    let mut back = vec![0u8; hello.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back))
        .await
        .ok()?
        .ok()?;
    Some(t0.elapsed())
}

/// What the working cluster did over a window: connection times (one after
/// another), failures, and the bytes echoed on one streaming connection.
struct Use {
    times: Vec<Duration>,
    failed: usize,
    bytes: u64,
    window: Duration,
}

/// Per second, with `SOAK_ISOLATION_PACE=N`: the working cluster's timed
/// connections and 64 KiB writes on its streaming connection (back to back
/// without it). A paced working cluster leaves its CPU idle part of the
/// time, as a proxy with CPU to spare has.
fn pace() -> Option<f64> {
    env_rate("SOAK_ISOLATION_PACE")
}

/// With `SOAK_ISOLATION_FLOOD_RATE=N`: each faulty cluster's flood opens N
/// connections a second (as fast as the proxy takes them without it).
fn flood_rate() -> Option<f64> {
    env_rate("SOAK_ISOLATION_FLOOD_RATE")
}

/// With `SOAK_ISOLATION_FLOOD_SOURCE=ADDR` (a loopback address such as
/// 127.0.0.2): the floods' connections come from it, not from the timed
/// client's 127.0.0.1, as a storm from other machines would.
fn flood_source() -> Option<std::net::IpAddr> {
    let v = std::env::var("SOAK_ISOLATION_FLOOD_SOURCE").ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|e| panic!("SOAK_ISOLATION_FLOOD_SOURCE={v}: {e}")),
    )
}

/// With `SOAK_ISOLATION_SLOW_LANE=D` (e.g. `30s`): nodeport-proxy's
/// `-sni-overflow-slow-lane`.
fn slow_lane() -> Option<String> {
    std::env::var("SOAK_ISOLATION_SLOW_LANE").ok()
}

/// With `SOAK_ISOLATION_STORM_MAX=S`: a storm window ends after S seconds
/// even if the floods are not all made (a slowed flood takes far longer).
fn storm_max() -> Option<Duration> {
    env_rate("SOAK_ISOLATION_STORM_MAX").map(Duration::from_secs_f64)
}

/// With `SOAK_ISOLATION_SPIN_STORMS=1`: the spinning process of the quiet
/// windows runs beside the flooding process during the storms too, so that
/// the flooders' CPU is as busy in both (a flood slowed by the slow lane
/// leaves it mostly idle).
fn spin_storms() -> bool {
    std::env::var("SOAK_ISOLATION_SPIN_STORMS").is_ok_and(|v| v == "1")
}

fn env_rate(name: &str) -> Option<f64> {
    let v = std::env::var(name).ok()?;
    let r: f64 = v
        .parse()
        .unwrap_or_else(|e| panic!("{name}={v}: not a number: {e}"));
    (r > 0.0).then_some(r)
}

/// A tick every 1/`per_second` s that skips what it missed (a slow
/// connection does not make the next ones come in a burst).
fn ticker(per_second: f64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    t
}

async fn use_working_cluster(sni: SocketAddr, until: impl Fn() -> bool) -> Use {
    let pace = pace();
    let hello = client_hello(ECHO);
    let start = Instant::now();
    let echoed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // One connection streaming 64 KiB writes, the echo read back.
    let stream = {
        let (echoed, stop, hello) = (echoed.clone(), stop.clone(), hello.clone());
        tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(sni).await else {
                return;
            };
            if s.write_all(&hello).await.is_err() {
                return;
            }
            let (mut r, mut w) = s.into_split();
            let writer = tokio::spawn(async move {
                let block = vec![7u8; 64 << 10];
                let mut tick = pace.map(ticker);
                loop {
                    if let Some(t) = &mut tick {
                        t.tick().await;
                    }
                    if w.write_all(&block).await.is_err() {
                        break;
                    }
                }
            });
            let mut buf = vec![0u8; 64 << 10];
            let mut skip = hello.len() as u64;
            while !stop.load(Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_millis(200), r.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => {
                        let n = n as u64;
                        let counted = n.saturating_sub(skip);
                        skip = skip.saturating_sub(n);
                        echoed.fetch_add(counted, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
            writer.abort();
        })
    };
    let mut times = Vec::new();
    let mut failed = 0;
    let mut tick = pace.map(ticker);
    while until() || start.elapsed() < Duration::from_secs(1) {
        if let Some(t) = &mut tick {
            t.tick().await;
        }
        match one(sni, &hello).await {
            Some(t) => times.push(t),
            None => failed += 1,
        }
    }
    let window = start.elapsed();
    let bytes = echoed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = stream.await;
    times.sort();
    Use {
        times,
        failed,
        bytes,
        window,
    }
}

impl Use {
    /// Several windows as one: every time, failure and byte, over their
    /// summed length.
    fn merged(uses: &[Use]) -> Use {
        let mut times: Vec<Duration> = uses.iter().flat_map(|u| u.times.iter().copied()).collect();
        times.sort();
        Use {
            times,
            failed: uses.iter().map(|u| u.failed).sum(),
            bytes: uses.iter().map(|u| u.bytes).sum(),
            window: uses.iter().map(|u| u.window).sum(),
        }
    }
}

/// Waits (30 s at most) until `cluster`'s gauge `name` is 0: a gauge
/// gives no other signal to wait on.
async fn drained(stats: SocketAddr, name: &str, cluster: &str) {
    let what = format!("{cluster}'s {name} at 0");
    integration_tests::eventually(&what, Duration::from_secs(30), || async move {
        series(&http_get(stats, "/stats/prometheus").await.1, name, cluster) == 0.0
    })
    .await;
}

/// Waits until the slow lane has taken what its backlog held when the
/// flood ended: its count of connections taken has not moved for 1.5 s
/// (it takes 10 a second while it holds any). Nothing is told when it
/// empties, so the count is read every 250 ms, for at most 60 s.
async fn lane_emptied(stats: SocketAddr) {
    let (mut last, mut still_since) = (-1.0, Instant::now());
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        let n = metric(
            &http_get(stats, "/stats/prometheus").await.1,
            "nodeport_proxy_slow_lane_accepted_total ",
        );
        if n != last {
            (last, still_since) = (n, Instant::now());
        } else if still_since.elapsed() >= Duration::from_millis(1500) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the slow lane still took connections 60 s after the flood ended");
}

/// `1.06, 1.57, 1.45`.
fn list(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The middle of `v` (the upper middle of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn mb_s(u: &Use) -> f64 {
    u.bytes as f64 / u.window.as_secs_f64() / 1e6
}

/// `n` SNI connections to `host`, at most 256 connecting at once (and with
/// `rate`, started that many a second); each sends its ClientHello and is
/// held until the proxy closes it or the flood is dropped.
struct Flood {
    made: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(sni: SocketAddr, host: &str, n: usize, rate: Option<f64>) -> Flood {
        let source = flood_source();
        let t0 = tokio::time::Instant::now();
        let made = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(256));
        let hello = Arc::new(client_hello(host));
        let tasks = (0..n)
            .map(|i| {
                let (made, gate, hello) = (made.clone(), gate.clone(), hello.clone());
                tokio::spawn(async move {
                    // The flood's schedule (connection i at i/rate s), a
                    // rate and not a wait for anything to be ready.
                    if let Some(r) = rate {
                        tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / r)).await;
                    }
                    let Ok(permit) = gate.acquire_owned().await else {
                        return;
                    };
                    let connected = match source {
                        Some(ip) => try_connect_from(ip, sni).await,
                        None => TcpStream::connect(sni).await,
                    };
                    let Ok(mut s) = connected else {
                        made.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let _ = s.write_all(&hello).await;
                    made.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                    let mut b = [0u8; 256];
                    while let Ok(1..) = s.read(&mut b).await {}
                })
            })
            .collect();
        Flood { made, tasks }
    }

    fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `--isolation-flood SNI N HOST...`: N connections to each HOST through
/// the SNI listener at SNI; says `flood made` once all are made, then holds
/// what the proxy keeps open until it is killed.
pub async fn flooder(args: &[String]) {
    daemon::process::raise_open_files_limit();
    let sni: SocketAddr = args[0].parse().unwrap();
    let n: usize = args[1].parse().unwrap();
    let rate = flood_rate();
    let floods: Vec<Flood> = args[2..]
        .iter()
        .map(|h| Flood::start(sni, h, n, rate))
        .collect();
    while floods.iter().map(Flood::made).sum::<usize>() < n * floods.len() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("flood made {}", n * floods.len());
    std::future::pending::<()>().await;
}

/// While the working cluster is timed without a flood: the flooders' CPU
/// kept as busy as a flood keeps it (`floods`' control process, connecting
/// nowhere), since a CPU left idle wakes slower in this VM and would make
/// the quiet figure the slower one. Nothing when unpinned: a spinner would
/// then take the CPU the proxy uses.
async fn spin(pinning: &Option<Pinning>, d: Duration) -> Option<Proc> {
    pinning.as_ref()?;
    let secs = (d + Duration::from_millis(500)).as_secs_f64();
    let mut p = Pinning::spawn_flooder(
        pinning,
        &std::env::current_exe().unwrap(),
        &["--flood".into(), "none".into(), secs.to_string()],
    );
    p.wait_line("flooding").await;
    Some(p)
}

pub async fn run(report: &mut Report, scale: Scale, bins: Option<&Path>) {
    let section = "isolation";
    let (flood_n, bound) = if scale.quick {
        (1_000, MAX_CONNECTIONS / 4.0)
    } else {
        (10_000, MAX_CONNECTIONS)
    };
    let quiet_window = Duration::from_secs(if scale.quick { 2 } else { 8 });
    // Before anything is spawned: nodeport-proxy, the destinations and the
    // timed client share one CPU, the flooding process has the other.
    let pinning = Pinning::new();
    let hole = dest::blackhole().await;
    let stall = dest::stalled().await;
    let echo = dest::echo().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("table.json");
    std::fs::write(&file, table(hole.addr, stall.addr, echo).to_string()).unwrap();
    let (sni_port, stats_port) = (free_port(), free_port());
    let proxy = spawn(
        bins,
        "nodeport-proxy",
        &[
            format!("-config={}", file.display()),
            "-bind-address=127.0.0.1".into(),
            format!("-envoy-sni-port={sni_port}"),
            format!("-envoy-stats-port={stats_port}"),
            "-envoy-admin-port=0".into(),
            format!("-max-connections-per-cluster={bound}"),
            format!("-max-pending-connects-per-cluster={bound}"),
        ]
        .into_iter()
        .chain(slow_lane().map(|d| format!("-sni-overflow-slow-lane={d}")))
        .collect::<Vec<_>>(),
    );
    let sni = SocketAddr::from(([127, 0, 0, 1], sni_port));
    let stats = SocketAddr::from(([127, 0, 0, 1], stats_port));
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect(stats).await.is_ok() {
            let (_, m) = http_get(stats, "/stats/prometheus").await;
            if metric(&m, "nodeport_proxy_routes{kind=\"sni\"}") == 3.0 {
                break;
            }
        }
        assert!(
            Instant::now() < end,
            "nodeport-proxy not serving within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = proxy.child.id().unwrap();
    let idle = lowest(&[pid], Duration::from_secs(1)).await[0];

    let watch = PeakWatch::start(&[pid]);
    // Samples the faulty clusters' gauges while the floods run.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let (mut pending, mut open, mut buffered) = (0f64, 0f64, 0f64);
            while sampling.load(Ordering::Relaxed) {
                let (_, m) = http_get(stats, "/stats/prometheus").await;
                pending = pending.max(series(
                    &m,
                    "envoy_cluster_upstream_rq_pending_active",
                    HOLE_CLUSTER,
                ));
                open = open.max(series(
                    &m,
                    "envoy_cluster_upstream_cx_active",
                    STALL_CLUSTER,
                ));
                buffered = buffered.max(
                    series(
                        &m,
                        "envoy_cluster_upstream_cx_tx_bytes_buffered",
                        STALL_CLUSTER,
                    ) + series(
                        &m,
                        "envoy_cluster_upstream_cx_tx_bytes_buffered",
                        HOLE_CLUSTER,
                    ),
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (pending, open, buffered)
        })
    };
    // One 8 s window's p99 moves by about ±30 % between runs on this VM,
    // more than the 10 % it is held to: the storm is timed in interleaved
    // quiet/storm pairs, and the figure is the median pair's ratio.
    let pairs = if scale.quick { 1 } else { STORM_PAIRS };
    let (mut quiets, mut storms, mut flood_times) = (Vec::new(), Vec::new(), Vec::new());
    let (mut quiet_cpu, mut storm_cpu) = (Vec::new(), Vec::new());
    let (mut quiet_busy, mut storm_busy) = (Vec::new(), Vec::new());
    let ticks = || pinning.as_ref().map(Pinning::ours_ticks);
    let busy = |from: Option<super::pinning::CpuTicks>| Some(ticks()?.busy_since(from?));
    let mut flooder = None;
    for pair in 0..pairs {
        let t = Instant::now();
        let spinning = spin(&pinning, quiet_window).await;
        let (cpu, shared) = (cpu_seconds(pid), ticks());
        quiets.push(use_working_cluster(sni, || t.elapsed() < quiet_window).await);
        quiet_cpu.push((cpu_seconds(pid) - cpu) / t.elapsed().as_secs_f64());
        quiet_busy.push(busy(shared));
        drop(spinning);
        // With SOAK_ISOLATION_SPIN_STORMS the flooders' CPU is kept busy
        // during the storm too, whatever the flooding process does there.
        let storm_spinning = match spin_storms() {
            true => spin(&pinning, storm_max().unwrap_or(Duration::from_secs(600))).await,
            false => None,
        };
        // The floods come from a process of their own, so that the timed
        // client does not share a runtime with 20,000 flooding tasks.
        let mut storm = Pinning::spawn_flooder(
            &pinning,
            &std::env::current_exe().unwrap(),
            &[
                "--isolation-flood".into(),
                sni.to_string(),
                flood_n.to_string(),
                HOLE.into(),
                STALL.into(),
            ],
        );
        let flooding = Arc::new(AtomicBool::new(true));
        let t = Instant::now();
        let waiter = {
            let flooding = flooding.clone();
            tokio::spawn(async move {
                // With a cap, the window ends there whether or not the
                // flood has been made.
                let made = storm.wait_line_within("flood made", Duration::from_secs(600));
                match storm_max() {
                    Some(cap) => drop(tokio::time::timeout(cap, made).await),
                    None => drop(made.await),
                }
                flooding.store(false, Ordering::Relaxed);
                (storm, t.elapsed())
            })
        };
        // Timed for as long as the flood is being made (at least 1 s): the
        // 8 s of a quiet window would mostly time what follows the storm.
        let (cpu, shared) = (cpu_seconds(pid), ticks());
        storms.push(use_working_cluster(sni, || flooding.load(Ordering::Relaxed)).await);
        storm_cpu.push((cpu_seconds(pid) - cpu) / t.elapsed().as_secs_f64());
        storm_busy.push(busy(shared));
        drop(storm_spinning);
        let (storm, made_in) = waiter.await.unwrap();
        flood_times.push(made_in);
        // A flood cut short by SOAK_ISOLATION_STORM_MAX would go on feeding
        // the clusters: it ends with its window. (The stalled cluster keeps
        // its connections: the proxy holds a connection whose client has
        // gone while the apiserver has not ended its side.)
        let storm = storm_max().is_none().then_some(storm);
        if storm.is_none() && slow_lane().is_some() {
            lane_emptied(stats).await;
        }
        // The blackholed cluster's last pending connects end at the 1 s
        // connect timeout.
        drained(
            stats,
            "envoy_cluster_upstream_rq_pending_active",
            HOLE_CLUSTER,
        )
        .await;
        if pair + 1 < pairs {
            // Before the next quiet window: the flood's held connections
            // closed, the stalled cluster empty again. The proxy keeps a
            // connection whose client has gone while its apiserver has not
            // ended its side (half-close), so the stalled apiserver lets
            // go of its own too.
            drop(storm);
            stall.release();
            drained(stats, "envoy_cluster_upstream_cx_active", STALL_CLUSTER).await;
        } else {
            flooder = storm;
        }
    }
    let m = http_get(stats, "/stats/prometheus").await.1;
    let ratio = |f: &dyn Fn(&Use) -> f64, (q, s): (&Use, &Use)| f(s) / f(q).max(1e-9);
    let p99 = |u: &Use| percentile(&u.times, 0.99).as_secs_f64();
    let p99_ratios: Vec<f64> = quiets
        .iter()
        .zip(&storms)
        .map(|qs| ratio(&p99, qs))
        .collect();
    let mb_ratios: Vec<f64> = quiets
        .iter()
        .zip(&storms)
        .map(|qs| ratio(&mb_s, qs))
        .collect();
    let (quiet, flooded) = (Use::merged(&quiets), Use::merged(&storms));
    let last_quiet = quiets.last().unwrap();
    // The storm is over; the stalled cluster's connections stay held at
    // its bound while the working cluster is used again.
    let t = Instant::now();
    let spinning = spin(&pinning, quiet_window).await;
    let held = use_working_cluster(sni, || t.elapsed() < quiet_window).await;
    drop(spinning);
    sampling.store(false, Ordering::Relaxed);
    let (max_pending, max_open, max_buffered) = sampler.await.unwrap();
    let held_rss = status_kib(pid, "VmRSS");
    let peak = watch.finish().await[0];
    drop(flooder);
    drop(stall);
    let low = lowest(&[pid], scale.settle).await[0];

    let s = |name| series(&m, name, HOLE_CLUSTER);
    let hole_overflow = s("envoy_cluster_upstream_rq_pending_overflow");
    let hole_timeouts = s("envoy_cluster_upstream_cx_connect_timeout");
    let s = |name| series(&m, name, STALL_CLUSTER);
    let stall_overflow = s("envoy_cluster_upstream_cx_overflow");
    let stall_pending_overflow = s("envoy_cluster_upstream_rq_pending_overflow");
    let e = |name| series(&m, name, ECHO_CLUSTER);
    let echo_refused =
        e("envoy_cluster_upstream_cx_overflow") + e("envoy_cluster_upstream_rq_pending_overflow");

    let p = |u: &Use, q| percentile(&u.times, q);
    report.figure(
        section,
        "CPUs".into(),
        match &pinning {
            Some(p) => format!(
                "flooding process on CPU {} (quiet and held: a process spinning there, connecting nowhere); nodeport-proxy, the destinations and the timed client on CPU {}",
                p.flooders, p.ours
            ),
            None => "not pinned (SOAK_FLOODS_UNPINNED, or taskset or a second CPU missing): every process shares the CPUs".into(),
        },
        String::new(),
    );
    report.figure(
        section,
        "pace (SOAK_ISOLATION_PACE, SOAK_ISOLATION_FLOOD_RATE)".into(),
        format!(
            "working cluster: {}; floods: {}",
            match pace() {
                Some(r) => format!("{r} connections a second and {r} × 64 KiB a second streamed"),
                None => "connections back to back, streaming as fast as echoed".into(),
            },
            match flood_rate() {
                Some(r) => format!("{r} connections a second to each faulty cluster"),
                None => "as fast as the proxy takes them".into(),
            }
        ),
        String::new(),
    );
    if slow_lane().is_some() || flood_source().is_some() || storm_max().is_some() || spin_storms() {
        report.figure(
            section,
            "slow lane (SOAK_ISOLATION_SLOW_LANE, SOAK_ISOLATION_FLOOD_SOURCE, SOAK_ISOLATION_STORM_MAX, SOAK_ISOLATION_SPIN_STORMS)".into(),
            format!(
                "-sni-overflow-slow-lane={}; floods from {}; storm windows {}{}; {} connections taken from the lane, {} client addresses on it after the storms",
                slow_lane().unwrap_or_else(|| "0 (off)".into()),
                flood_source().map_or("127.0.0.1".into(), |a| a.to_string()),
                storm_max().map_or("until the floods are made".into(), |d| format!("at most {} s", d.as_secs_f64())),
                if spin_storms() { ", the flooders' CPU kept busy beside the flood" } else { "" },
                metric(&m, "nodeport_proxy_slow_lane_accepted_total "),
                metric(&m, "nodeport_proxy_slow_lane_clients "),
            ),
            String::new(),
        );
    }
    report.figure(
        section,
        format!(
            "working cluster, SNI connection (connect, ClientHello echoed), p50 / p99 (count), quiet → {flood_n} connections each to a blackholed and a stalled cluster ({pairs} quiet/storm pairs, all times)"
        ),
        format!(
            "{} / {} ({}) → {} / {} ({})",
            ms(p(&quiet, 0.5)),
            ms(p(&quiet, 0.99)),
            quiet.times.len(),
            ms(p(&flooded, 0.5)),
            ms(p(&flooded, 0.99)),
            flooded.times.len()
        ),
        "p99 ≤ 1.10 × quiet (issue 38)".into(),
    );
    report.figure(
        section,
        "working cluster: p99 flooded / quiet, the median pair (each pair)".into(),
        format!("{:.2} ({})", median(p99_ratios.clone()), list(&p99_ratios)),
        "≤ 1.10".into(),
    );
    report.figure(
        section,
        "working cluster: echo throughput on one connection, quiet → flooded (all pairs)".into(),
        format!("{:.0} → {:.0} MB/s", mb_s(&quiet), mb_s(&flooded)),
        "≥ 0.90 × quiet (issue 38)".into(),
    );
    report.figure(
        section,
        "working cluster: throughput flooded / quiet, the median pair (each pair)".into(),
        format!("{:.2} ({})", median(mb_ratios.clone()), list(&mb_ratios)),
        "≥ 0.90".into(),
    );
    report.figure(
        section,
        format!(
            "working cluster, after the storm with the stalled cluster's {max_open} connections held: p50 / p99 (count); throughput"
        ),
        format!(
            "{} / {} ({}); {:.0} MB/s",
            ms(p(&held, 0.5)),
            ms(p(&held, 0.99)),
            held.times.len(),
            mb_s(&held)
        ),
        String::new(),
    );
    report.figure(
        section,
        "working cluster, held: p99 / quiet; throughput / quiet (the last pair's quiet)".into(),
        format!(
            "{:.2}; {:.2}",
            ratio(&p99, (last_quiet, &held)),
            ratio(&mb_s, (last_quiet, &held))
        ),
        "≤ 1.10; ≥ 0.90".into(),
    );
    let failed = quiet.failed + flooded.failed + held.failed;
    report.limit(
        section,
        "working cluster: connections failed or refused, quiet, flooded and held".into(),
        format!("{}", failed + echo_refused as usize),
        "0".into(),
        failed == 0 && echo_refused == 0.0,
    );
    report.figure(
        section,
        format!(
            "the floods: {} connections made in (each storm){}",
            2 * flood_n,
            match storm_max() {
                Some(d) => format!(
                    "; {} s: cut there (SOAK_ISOLATION_STORM_MAX), not all made",
                    d.as_secs_f64()
                ),
                None => String::new(),
            }
        ),
        flood_times
            .iter()
            .map(|t| format!("{:.1} s", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        String::new(),
    );
    report.figure(
        section,
        "nodeport-proxy: share of one CPU used, each pair's quiet window → its storm".into(),
        quiet_cpu
            .iter()
            .zip(&storm_cpu)
            .map(|(q, f)| format!("{:.0} → {:.0} %", q * 100.0, f * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        String::new(),
    );
    if pinning.is_some() {
        // The timed client runs flat out, so this CPU is as busy when quiet
        // as during a storm: what the storm costs the proxy comes out of
        // the working cluster's share of it.
        let pct = |b: &Option<f64>| b.map_or("?".to_string(), |b| format!("{:.0}", b * 100.0));
        report.figure(
            section,
            "the shared CPU (nodeport-proxy, destinations, timed client): busy, each pair's quiet window → its storm".into(),
            quiet_busy
                .iter()
                .zip(&storm_busy)
                .map(|(q, f)| format!("{} → {} %", pct(q), pct(f)))
                .collect::<Vec<_>>()
                .join(", "),
            String::new(),
        );
    }
    report.limit(
        section,
        "blackholed cluster: most connects pending at once (sampled every 100 ms)".into(),
        format!("{max_pending}"),
        format!("≤ {bound} (-max-pending-connects-per-cluster)"),
        max_pending <= bound,
    );
    report.figure(
        section,
        format!(
            "blackholed cluster: of {}, refused at once (upstream_rq_pending_overflow) / connect timed out after 1 s",
            pairs * flood_n
        ),
        format!("{hole_overflow} / {hole_timeouts}"),
        "Envoy: 1,024 pending, the rest UO".into(),
    );
    report.limit(
        section,
        "stalled cluster: most connections open at once (sampled)".into(),
        format!("{max_open}"),
        format!("≤ {bound} (-max-connections-per-cluster)"),
        max_open <= bound,
    );
    report.figure(
        section,
        format!(
            "stalled cluster: of {}, refused at once (upstream_cx_overflow / upstream_rq_pending_overflow)",
            pairs * flood_n
        ),
        format!("{stall_overflow} / {stall_pending_overflow}"),
        "Envoy: 1,024 open, then 1,024 queued as pending for ever, the rest UO".into(),
    );
    report.figure(
        section,
        "faulty clusters: most bytes held in the relay's buffers (sampled)".into(),
        format!("{:.1} KiB", max_buffered / 1024.0),
        format!("≤ {MAX_BUFFERED_MIB} MiB each (-max-buffered-bytes-per-cluster)"),
    );
    // Both faulty clusters at their byte budgets, and every connection they
    // admit at once (open and pending) with a full buffer each way and an
    // SNI connection's own state (9.6 KiB, BENCHMARKS.md NPM; 10 here).
    let admitted = 2 * bound as u64;
    let rss_bound = idle + 2 * MAX_BUFFERED_MIB * 1024 + admitted * (2 * BUFFER_KIB + 10);
    report.limit(
        section,
        "nodeport-proxy RSS: idle / peak during the floods / with the stalled cluster's connections held".into(),
        format!("{} / {} / {}", mib(idle), mib(peak), mib(held_rss)),
        format!(
            "peak ≤ idle + 2 × 16 MiB + {admitted} × (32 + 10) KiB = {} (Envoy, KKP #15962: 400 Mi → 1.5 Gi, OOM-killed)",
            mib(rss_bound)
        ),
        peak <= rss_bound,
    );
    report.limit(
        section,
        format!(
            "nodeport-proxy: lowest RSS within {:?} after the floods end",
            scale.settle
        ),
        mib(low),
        format!("≤ idle ({}) + 10 % + 16 MiB", mib(idle)),
        low <= idle + idle / 10 + 16 * 1024,
    );
    drop(proxy);
}
