//! P11 (issue 21): nodeport-proxy at seed scale. For N exposed Services
//! (an SNI host and a tunneling route each, one Ready endpoint) from the
//! table file and from a real kube-apiserver (tests/k8s; Services and
//! EndpointSlices created through the API), measures start to serving,
//! start-up CPU, idle RSS and memory per route, one change to serving
//! (p50/p99/max; CPU per change), a canary connection's worst wait while
//! changes are applied and while /stats/prometheus is scraped, scrape time,
//! size and RSS jump, RSS after 100 reloads against RSS after start, and
//! held connections dropped. scripts/bench runs it after the side-by-side
//! workloads; loopback and a namespace of its own only, bounded in count
//! and time.
//!
//! ```text
//! cargo run --release -p integration-tests --example scale -- [--quick] [--out FILE] [--sizes 1000,5000] [--sources file,kube]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration_tests::k8s::{Cluster, ClusterOpts, TestNet, free_port};
use integration_tests::nodeport::try_connect_h1;
use integration_tests::procs::{Proc, status_kib};
use integration_tests::{dest, http_get};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PORT_NAME: &str = "https";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    File,
    Kube,
}

#[derive(Clone, Copy)]
struct Plan {
    changes: usize,
    reloads: usize,
    held: usize,
    scrapes: usize,
    settle: Duration,
}

fn service_name(i: usize) -> String {
    format!("apiserver-{i}")
}

fn authority(ns: &str, name: &str) -> String {
    format!("{name}.{ns}.svc.cluster.local:443")
}

/// The table file: `names` Services in `ns`, each with an SNI host and a
/// tunneling route to `endpoint`.
fn table_yaml(ns: &str, names: &[String], endpoint: SocketAddr) -> String {
    if names.is_empty() {
        return "services: []\nendpointSlices: []\n".into();
    }
    let mut s = String::from("services:\n");
    for n in names {
        let _ = write!(
            s,
            "- metadata:\n    namespace: {ns}\n    name: {n}\n    uid: {n}\n    creationTimestamp: \"2024-01-01T00:00:00Z\"\n    annotations:\n      nodeport-proxy.k8s.io/expose: \"SNI, Tunneling\"\n      nodeport-proxy.k8s.io/port-mapping: '{{\"{PORT_NAME}\": \"{n}.{ns}.seed.example\"}}'\n  spec:\n    ports:\n    - {{name: {PORT_NAME}, port: 443, protocol: TCP}}\n"
        );
    }
    s.push_str("endpointSlices:\n");
    for n in names {
        let _ = write!(
            s,
            "- metadata:\n    namespace: {ns}\n    name: {n}-1\n    labels: {{kubernetes.io/service-name: {n}}}\n  ports: [{{name: {PORT_NAME}, port: {}, protocol: TCP}}]\n  endpoints:\n  - addresses: [\"{}\"]\n    conditions: {{ready: true}}\n",
            endpoint.port(),
            endpoint.ip()
        );
    }
    s
}

fn write_table(file: &Path, text: &str) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Renders and writes the table on a blocking thread: at 20,000 Services
/// that takes tens of milliseconds, which on one of this driver's workers
/// delayed the canary it was measuring the proxy with.
async fn write_table_off_runtime(
    file: &Path,
    ns: &str,
    names: &mut Vec<String>,
    endpoint: SocketAddr,
) {
    let (file, ns, list) = (file.to_path_buf(), ns.to_string(), std::mem::take(names));
    *names = tokio::task::spawn_blocking(move || {
        write_table(&file, &table_yaml(&ns, &list, endpoint));
        list
    })
    .await
    .unwrap();
}

/// Sends a CONNECT; returns the status and how long the answer took.
async fn connect(tunnel: SocketAddr, authority: &str) -> Option<(u16, TcpStream, Duration)> {
    let t0 = Instant::now();
    let (code, s) = try_connect_h1(tunnel, authority).await?;
    Some((code, s, t0.elapsed()))
}

async fn echo(s: &mut TcpStream) -> bool {
    let ok = async {
        s.write_all(b"ping").await.ok()?;
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.ok()?;
        (&back == b"ping").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(10), ok).await,
        Ok(Some(()))
    )
}

/// Polls until `authority` answers `want` (200: served, 404: gone); returns
/// how long that took from `since`, or `None` after `patience`.
async fn wait_status(
    tunnel: SocketAddr,
    authority: &str,
    want: u16,
    since: Instant,
    patience: Duration,
) -> Option<Duration> {
    loop {
        if let Some((code, _, _)) = connect(tunnel, authority).await
            && code == want
        {
            return Some(since.elapsed());
        }
        if since.elapsed() > patience {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// User + system CPU of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// Bytes the proxy's allocator has handed out and not taken back
/// (`envoy_server_memory_allocated`, jemalloc's `stats.allocated`).
async fn allocated(stats: SocketAddr) -> f64 {
    let (_, body) = http_get(stats, "/stats/prometheus").await;
    body.lines()
        .find_map(|l| l.strip_prefix("envoy_server_memory_allocated "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn lowest_rss(pid: u32, window: Duration) -> u64 {
    let end = Instant::now() + window;
    let mut low = u64::MAX;
    while Instant::now() < end {
        low = low.min(status_kib(pid, "VmRSS"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    low
}

/// Opens a CONNECT to the canary authority every 10 ms and records how
/// long each took to be answered and echo. It runs on a thread and runtime
/// of its own, so what this driver does meanwhile (writing a table file of
/// 20,000 Services, creating objects) does not count as the proxy's wait.
struct Canary {
    stop: Arc<AtomicBool>,
    task: std::thread::JoinHandle<Vec<(Instant, Duration)>>,
}

impl Canary {
    fn start(tunnel: SocketAddr, authority: String) -> Canary {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let task = std::thread::spawn(move || {
            rt.block_on(async move {
                let mut samples = Vec::new();
                while !s.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let ok = match connect(tunnel, &authority).await {
                        Some((200, mut c, _)) => echo(&mut c).await,
                        _ => false,
                    };
                    // A failed canary counts as the longest possible wait.
                    let took = if ok {
                        t0.elapsed()
                    } else {
                        Duration::from_secs(3600)
                    };
                    samples.push((t0, took));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                samples
            })
        });
        Canary { stop, task }
    }

    async fn finish(self) -> Vec<(Instant, Duration)> {
        self.stop.store(true, Ordering::Relaxed);
        let task = self.task;
        tokio::task::spawn_blocking(move || task.join().unwrap_or_default())
            .await
            .unwrap_or_default()
    }
}

fn worst_in(samples: &[(Instant, Duration)], from: Instant, to: Instant) -> Duration {
    samples
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// How the Services of one run are made and changed.
enum Feed {
    File {
        file: PathBuf,
        names: Vec<String>,
        endpoint: SocketAddr,
    },
    Kube {
        services: Box<Api<Service>>,
        slices: Box<Api<EndpointSlice>>,
        endpoint: SocketAddr,
    },
}

fn service_object(ns: &str, name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "annotations": {
            "nodeport-proxy.k8s.io/expose": "SNI, Tunneling",
            "nodeport-proxy.k8s.io/port-mapping": format!("{{\"{PORT_NAME}\": \"{name}.{ns}.seed.example\"}}"),
        }},
        "spec": {"clusterIP": "None", "ports": [{"name": PORT_NAME, "port": 443, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn slice_object(ns: &str, name: &str, endpoint: SocketAddr) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{name}-1"), "namespace": ns,
            "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": PORT_NAME, "port": endpoint.port(), "protocol": "TCP"}],
        "endpoints": [{"addresses": [endpoint.ip().to_string()], "conditions": {"ready": true}}]
    }))
    .unwrap()
}

impl Feed {
    /// Adds Service `name` (and its slice); returns when the source has it.
    async fn add(&mut self, ns: &str, name: &str) {
        match self {
            Feed::File {
                file,
                names,
                endpoint,
            } => {
                names.push(name.to_string());
                write_table_off_runtime(file, ns, names, *endpoint).await;
            }
            Feed::Kube {
                services,
                slices,
                endpoint,
            } => {
                let pp = PostParams::default();
                slices
                    .create(&pp, &slice_object(ns, name, *endpoint))
                    .await
                    .unwrap();
                services
                    .create(&pp, &service_object(ns, name))
                    .await
                    .unwrap();
            }
        }
    }

    async fn remove(&mut self, ns: &str, name: &str) {
        match self {
            Feed::File {
                file,
                names,
                endpoint,
            } => {
                names.retain(|n| n != name);
                write_table_off_runtime(file, ns, names, *endpoint).await;
            }
            Feed::Kube {
                services, slices, ..
            } => {
                let dp = DeleteParams::default();
                let _ = services.delete(name, &dp).await;
                let _ = slices.delete(&format!("{name}-1"), &dp).await;
            }
        }
    }
}

struct Row {
    source: String,
    n: usize,
    cells: Vec<String>,
}

/// One run: `n` Services from `source`, nodeport-proxy started with
/// `extra` flags.
#[allow(clippy::too_many_arguments)]
async fn run(
    source: Source,
    n: usize,
    label: &str,
    extra: &[String],
    plan: Plan,
    base_idle: Option<(u64, f64)>,
    kube: Option<(&Cluster, &TestNet)>,
) -> (Row, (u64, f64)) {
    let ns = format!("p11-n{n}");
    let tunnel_port = free_port();
    let stats_port = free_port();
    let tunnel = SocketAddr::from(([127, 0, 0, 1], tunnel_port));
    let stats = SocketAddr::from(([127, 0, 0, 1], stats_port));
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..n).map(service_name).collect();
    let mut args: Vec<String> = vec![
        "-bind-address=127.0.0.1".into(),
        format!("-envoy-tunneling-port={tunnel_port}"),
        format!("-envoy-sni-port={}", free_port()),
        format!("-envoy-stats-port={stats_port}"),
    ];
    args.extend(extra.iter().cloned());
    let mut feed = match (source, kube) {
        (Source::File, _) => {
            let endpoint = dest::echo().await;
            let file = dir.path().join("table.yaml");
            std::fs::write(&file, table_yaml(&ns, &names, endpoint)).unwrap();
            args.push(format!("-config={}", file.display()));
            Feed::File {
                file,
                names: names.clone(),
                endpoint,
            }
        }
        (Source::Kube, Some((cluster, net))) => {
            let endpoint = dest::echo_on(&net.host_ip.to_string()).await;
            let client = cluster.client.clone();
            let nsobj: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
            let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .create(&PostParams::default(), &nsobj)
                .await;
            let services: Api<Service> = Api::namespaced(client.clone(), &ns);
            let slices: Api<EndpointSlice> = Api::namespaced(client, &ns);
            let t0 = Instant::now();
            futures::stream::iter(names.iter())
                .map(|name| {
                    let (services, slices, ns) = (services.clone(), slices.clone(), ns.clone());
                    async move {
                        let pp = PostParams::default();
                        slices
                            .create(&pp, &slice_object(&ns, name, endpoint))
                            .await
                            .unwrap();
                        services
                            .create(&pp, &service_object(&ns, name))
                            .await
                            .unwrap();
                    }
                })
                .buffer_unordered(32)
                .collect::<Vec<()>>()
                .await;
            eprintln!(
                "P11: {n} Services and EndpointSlices created through the API in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            args.push("-source=kubernetes".into());
            args.push(format!(
                "-kubeconfig={}",
                cluster.admin_kubeconfig.display()
            ));
            args.push(format!("-namespace={ns}"));
            Feed::Kube {
                services: Box::new(services),
                slices: Box::new(slices),
                endpoint,
            }
        }
        (Source::Kube, None) => unreachable!(),
    };
    // Start to serving: the last Service's route answers.
    let t0 = Instant::now();
    let mut proxy = Proc::spawn("nodeport-proxy", &args);
    let pid = proxy.child.id().unwrap();
    let last = authority(&ns, names.last().map(String::as_str).unwrap_or("none"));
    let started = if n > 0 {
        wait_status(tunnel, &last, 200, t0, Duration::from_secs(300)).await
    } else {
        while TcpStream::connect(stats).await.is_err() && t0.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Some(t0.elapsed())
    };
    let Some(started) = started else {
        proxy.lines_so_far();
        panic!(
            "{label} N={n}: not serving within 300 s:\n{}",
            proxy.log.join("\n")
        );
    };
    let startup_cpu = cpu_seconds(pid);
    let idle = lowest_rss(pid, plan.settle).await;
    let in_use = allocated(stats).await;
    if n == 0 {
        return (
            Row {
                source: label.into(),
                n,
                cells: Vec::new(),
            },
            (idle, in_use),
        );
    }
    let routes = 2 * n;
    let per_route = base_idle.map(|(b, a)| {
        (
            idle.saturating_sub(b) as f64 * 1024.0 / routes as f64,
            (in_use - a) / routes as f64,
        )
    });
    // Held connections, spread over the Services.
    let mut held = Vec::new();
    for i in 0..plan.held {
        let name = &names[i * n / plan.held];
        if let Some((200, mut s, _)) = connect(tunnel, &authority(&ns, name)).await
            && echo(&mut s).await
        {
            held.push(s);
        }
    }
    let opened = held.len();
    let canary = Canary::start(tunnel, authority(&ns, &names[0]));
    // Changes: one new Service each, timed from the write (or the API
    // call's return) to its route answering.
    let changes_from = Instant::now();
    let cpu0 = cpu_seconds(pid);
    let mut times = Vec::new();
    for k in 0..plan.changes {
        let name = format!("extra-{k}");
        let t = Instant::now();
        feed.add(&ns, &name).await;
        match wait_status(
            tunnel,
            &authority(&ns, &name),
            200,
            t,
            Duration::from_secs(60),
        )
        .await
        {
            Some(d) => times.push(d),
            None => times.push(Duration::from_secs(3600)),
        }
    }
    let cpu_per_change = (cpu_seconds(pid) - cpu0) / plan.changes.max(1) as f64;
    let changes_to = Instant::now();
    times.sort();
    // Scrapes.
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let rss0 = status_kib(pid, "VmRSS");
    let scrapes_from = Instant::now();
    let mut scrape_times = Vec::new();
    let mut scrape_size = 0;
    for _ in 0..plan.scrapes {
        let t = Instant::now();
        let (_, body) = http_get(stats, "/stats/prometheus").await;
        scrape_times.push(t.elapsed());
        scrape_size = body.len();
    }
    let jump = status_kib(pid, "VmHWM").saturating_sub(rss0);
    // Every series on request, its RSS jump apart from the default scrape's.
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let rss1 = status_kib(pid, "VmRSS");
    let t = Instant::now();
    let (_, all) = http_get(stats, "/stats/prometheus?usedonly=false").await;
    let all_time = t.elapsed();
    let scrapes_to = Instant::now();
    let all_jump = status_kib(pid, "VmHWM").saturating_sub(rss1);
    scrape_times.sort();
    // Reloads: one Service added and removed in turn, each waited for.
    let reloads_from = Instant::now();
    for k in 0..plan.reloads {
        let t = Instant::now();
        if k % 2 == 0 {
            feed.add(&ns, "flip").await;
            wait_status(
                tunnel,
                &authority(&ns, "flip"),
                200,
                t,
                Duration::from_secs(60),
            )
            .await;
        } else {
            feed.remove(&ns, "flip").await;
            wait_status(
                tunnel,
                &authority(&ns, "flip"),
                404,
                t,
                Duration::from_secs(60),
            )
            .await;
        }
    }
    let reloads_to = Instant::now();
    let after_reloads = status_kib(pid, "VmRSS");
    let low_after = lowest_rss(pid, plan.settle).await;
    let samples = canary.finish().await;
    let mut dropped = opened.abs_diff(plan.held);
    for s in &mut held {
        if !echo(s).await {
            dropped += 1;
        }
    }
    proxy.signal(9);
    let worst_changes = worst_in(&samples, changes_from, changes_to).max(worst_in(
        &samples,
        reloads_from,
        reloads_to,
    ));
    let worst_scrapes = worst_in(&samples, scrapes_from, scrapes_to);
    let cells = vec![
        ms(started),
        format!("{startup_cpu:.2} s"),
        mib(idle),
        per_route.map_or("–".into(), |(b, a)| {
            format!("{b:.0} B (allocated: {a:.0} B)")
        }),
        format!(
            "{} / {} / {}",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(times.last().copied().unwrap_or_default())
        ),
        format!("{:.3} s", cpu_per_change),
        ms(worst_changes),
        ms(worst_scrapes),
        format!(
            "{} / {:.1} MB / +{} (all series: {}, {:.1} MB, +{})",
            ms(percentile(&scrape_times, 0.5)),
            scrape_size as f64 / 1e6,
            mib(jump),
            ms(all_time),
            all.len() as f64 / 1e6,
            mib(all_jump)
        ),
        format!(
            "{} ({:.2}×) / lowest within {:?}: {} ({:.2}×)",
            mib(after_reloads),
            after_reloads as f64 / idle as f64,
            plan.settle,
            mib(low_after),
            low_after as f64 / idle as f64
        ),
        format!("{dropped} of {opened}"),
    ];
    (
        Row {
            source: label.into(),
            n,
            cells,
        },
        (idle, in_use),
    )
}

fn table(rows: &[Row], plan: Plan) -> String {
    let mut s = format!(
        "| Source | N Services | start → serving | start-up CPU | idle RSS | memory per route (RSS over an empty table; allocator's bytes in use) | one change → serving, p50 / p99 / max of {} | proxy CPU per change | canary worst wait during {} changes and {} reloads | canary worst wait during scrapes | scrape p50 / size / RSS jump | RSS after {} reloads (× after start) | held connections dropped |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        plan.changes, plan.changes, plan.reloads, plan.reloads
    );
    for r in rows {
        let _ = writeln!(s, "| {} | {} | {} |", r.source, r.n, r.cells.join(" | "));
    }
    s
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let out = value("--out").map(PathBuf::from);
    let sizes: Vec<usize> = value("--sizes")
        .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_else(|| {
            if quick {
                vec![100]
            } else {
                vec![1000, 5000, 20000]
            }
        });
    let sources = value("--sources").unwrap_or_else(|| "file,kube".into());
    let plan = if quick {
        Plan {
            changes: 5,
            reloads: 10,
            held: 20,
            scrapes: 2,
            settle: Duration::from_secs(2),
        }
    } else {
        Plan {
            changes: 20,
            reloads: 100,
            held: 200,
            scrapes: 5,
            settle: Duration::from_secs(15),
        }
    };
    daemon::process::raise_open_files_limit();
    let started = Instant::now();
    let mut rows = Vec::new();
    let (_, base) = run(Source::File, 0, "file", &[], plan, None, None).await;
    if sources.contains("file") {
        for &n in &sizes {
            eprintln!("P11: file source, {n} Services");
            rows.push(
                run(Source::File, n, "file", &[], plan, Some(base), None)
                    .await
                    .0,
            );
        }
        // A one-CPU pod: the largest size with one runtime worker.
        if let Some(&n) = sizes.last() {
            eprintln!("P11: file source, {n} Services, -worker-threads=1");
            let one = ["-worker-threads=1".to_string()];
            rows.push(
                run(
                    Source::File,
                    n,
                    "file, -worker-threads=1",
                    &one,
                    plan,
                    Some(base),
                    None,
                )
                .await
                .0,
            );
        }
    }
    if sources.contains("kube") {
        let net = TestNet::create();
        let cluster = Cluster::start(ClusterOpts::default()).await;
        for &n in &sizes {
            eprintln!("P11: kube-apiserver source, {n} Services");
            rows.push(
                run(
                    Source::Kube,
                    n,
                    "kube-apiserver",
                    &[],
                    plan,
                    Some(base),
                    Some((&cluster, &net)),
                )
                .await
                .0,
            );
        }
        cluster.stop().await;
    }
    let text = format!(
        "\n### P11: nodeport-proxy at seed scale (issue 21)\n\nEach Service: an SNI host and a tunneling route to one Ready endpoint. Idle RSS of an empty table: {}. Took {:.0} s.\n\n{}",
        mib(base.0),
        started.elapsed().as_secs_f64(),
        table(&rows, plan)
    );
    println!("{text}");
    if let Some(path) = out {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }
}
