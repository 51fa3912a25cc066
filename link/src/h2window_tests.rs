//! The controller on a real HTTP/2 connection (`h2grpc::serve` against
//! an `h2` client) over an in-memory link that delays every chunk by half
//! the round trip each way, on tokio's paused clock: round trips are
//! simulated, not waited for.
use super::*;
use crate::h2grpc::{H2Config, RecvBody, serve};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const MIB: u32 = 1 << 20;

/// Bytes pass after `rtt / 2` each way, without a bandwidth limit; once
/// `frozen` is set nothing passes any more (a stopped peer whose kernel
/// still takes the bytes).
fn delayed_link(rtt: Duration) -> (DuplexStream, DuplexStream, Arc<AtomicBool>) {
    let (near, relay_a) = tokio::io::duplex(1 << 20);
    let (relay_b, far) = tokio::io::duplex(1 << 20);
    let frozen = Arc::new(AtomicBool::new(false));
    let (ar, aw) = tokio::io::split(relay_a);
    let (br, bw) = tokio::io::split(relay_b);
    for (mut from, mut to) in [(ar, bw), (br, aw)] {
        let frozen = frozen.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        tokio::spawn(async move {
            let mut buf = vec![0; 64 << 10];
            while let Ok(n) = from.read(&mut buf).await {
                if n == 0
                    || tx
                        .send((Instant::now() + rtt / 2, buf[..n].to_vec()))
                        .is_err()
                {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some((at, chunk)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if !frozen.load(Ordering::Relaxed) && to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
    }
    (near, far, frozen)
}

fn config(max: u32, process_budget: i64, keepalive: Option<Keepalive>) -> H2Config {
    H2Config {
        window: WindowSettings {
            initial: MIB,
            max,
            connection_budget: i64::from(max),
            idle: Duration::from_secs(1),
            single_stream: true,
        },
        keepalive,
        max_frame_size: 16 << 10,
        max_header_list_size: 16 << 10,
        max_concurrent_streams: 10,
        max_send_buffer: 1 << 20,
        process_budget: Budget::new(process_budget, None),
        stats: Arc::default(),
        control_frames: Default::default(),
    }
}

/// Reads each request body to its end, counting the bytes where a test
/// can wait for a total.
#[derive(Clone)]
struct Sink(Arc<tokio::sync::watch::Sender<u64>>);

impl tower_service::Service<http::Request<RecvBody>> for Sink {
    type Response = http::Response<http_body_util::Empty<Bytes>>;
    type Error = h2::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, h2::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<RecvBody>) -> Self::Future {
        let n = self.0.clone();
        Box::pin(async move {
            let mut body = req.into_body();
            while let Some(f) = body.frame().await {
                if let Ok(d) = f?.into_data() {
                    n.send_modify(|v| *v += d.len() as u64);
                }
            }
            Ok(http::Response::new(http_body_util::Empty::new()))
        })
    }
}

/// A client connection to `cfg` served at the far end of a link of
/// `rtt`: the client, the bytes the server read so far, the server's
/// task and the link's freeze switch.
async fn connect(
    cfg: &H2Config,
    rtt: Duration,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::sync::watch::Receiver<u64>,
    tokio::task::JoinHandle<()>,
    Arc<AtomicBool>,
) {
    let (client_io, server_io, frozen) = delayed_link(rtt);
    let (read_tx, read) = tokio::sync::watch::channel(0u64);
    let drain = daemon::drain::Drain::new();
    let (svc, c) = (Sink(Arc::new(read_tx)), cfg.clone());
    let server = tokio::spawn(async move { serve(server_io, svc, &c, &drain).await });
    let (client, conn) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(conn);
    (client, read, server, frozen)
}

/// Serves `cfg` at the far end of a link of `rtt`; the client uploads
/// `total` bytes on one stream (or freezes the link after
/// `freeze_after`). Returns the largest connection window seen while the
/// upload ran, the bytes the server read, the server's task and the
/// client (the connection lives as long as it does).
async fn upload(
    cfg: &H2Config,
    rtt: Duration,
    total: usize,
    freeze_after: Option<usize>,
) -> (
    i64,
    u64,
    tokio::task::JoinHandle<()>,
    h2::client::SendRequest<Bytes>,
) {
    let (mut client, mut read, server, frozen) = connect(cfg, rtt).await;
    let stats = cfg.stats.clone();
    let peak = Arc::new(AtomicI64::new(0));
    let watch = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(stats.connection_windows(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let req = http::Request::post("http://test/").body(()).unwrap();
    let (_resp, mut send) = client.send_request(req, false).unwrap();
    let chunk = Bytes::from(vec![7u8; 256 << 10]);
    let mut sent = 0;
    while sent < total {
        if freeze_after.is_some_and(|f| sent >= f) {
            frozen.store(true, Ordering::Relaxed);
            break;
        }
        send.reserve_capacity(chunk.len().min(total - sent));
        match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) if n > 0 => {
                let n = n.min(total - sent);
                send.send_data(chunk.slice(..n), false).unwrap();
                sent += n;
            }
            Some(Ok(_)) => {}
            _ => panic!("stream ended after {sent} bytes"),
        }
    }
    if !frozen.load(Ordering::Relaxed) {
        send.send_data(Bytes::new(), true).unwrap();
        // Everything arrived and was read.
        read.wait_for(|n| *n >= total as u64).await.unwrap();
    }
    watch.abort();
    let read = *read.borrow();
    (peak.load(Ordering::Relaxed), read, server, client)
}

/// The largest frame a connection advertises is the largest it is sent:
/// with 64 KiB a 40,000-byte body arrives in one DATA frame, where
/// HTTP/2's default 16 KiB splits it in three that the reader must
/// gather (a 16 KiB gRPC message never fits one default frame).
#[tokio::test]
async fn a_client_advertising_larger_frames_is_sent_a_message_in_one() {
    for (advertised, frames) in [(16 << 10, 3), (64 << 10, 1)] {
        let mut cfg = config(32 * MIB, i64::from(64 * MIB), None);
        cfg.max_frame_size = advertised;
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let mut send = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                send.send_data(Bytes::from(vec![1u8; 40_000]), true)
                    .unwrap();
            }
        });
        let mut channel = crate::h2grpc::connect(client_io, &cfg).await.unwrap();
        std::future::poll_fn(|cx| {
            tower_service::Service::<http::Request<http_body_util::Empty<Bytes>>>::poll_ready(
                &mut channel,
                cx,
            )
        })
        .await
        .unwrap();
        let req = http::Request::post("http://test/")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let resp = tower_service::Service::call(&mut channel, req)
            .await
            .unwrap();
        let mut body = resp.into_body();
        let mut sizes = Vec::new();
        while let Some(f) = body.frame().await {
            if let Ok(d) = f.unwrap().into_data() {
                sizes.push(d.len());
            }
        }
        assert_eq!(sizes.iter().sum::<usize>(), 40_000);
        assert_eq!(sizes.len(), frames, "advertising {advertised}: {sizes:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_window_grows_under_a_long_round_trip_and_shrinks_back_when_idle() {
    let cfg = config(16 * MIB, 1 << 30, None);
    let (peak, read, server, mut client) =
        upload(&cfg, Duration::from_millis(50), 48 << 20, None).await;
    assert_eq!(read, 48 << 20);
    assert!(peak >= i64::from(8 * MIB), "peak window {peak}");
    assert!(peak <= i64::from(16 * MIB), "peak window {peak}");
    assert!(cfg.stats.stream_windows() > i64::from(MIB));
    let grown = cfg.process_budget.used();
    // Idle: one halving per idle second, back to the initial window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(cfg.stats.stream_windows(), i64::from(MIB));
    assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
    // The client may still send what it was granted before, so the
    // budget keeps it, and gets it back byte for byte as it comes (too
    // little to grow the window again).
    assert_eq!(cfg.process_budget.used(), grown);
    let req = http::Request::post("http://test/").body(()).unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    let mut left = 512usize << 10;
    while left > 0 {
        send.reserve_capacity(left);
        let n = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap()
            .min(left);
        send.send_data(Bytes::from(vec![7u8; n]), false).unwrap();
        left -= n;
    }
    send.send_data(Bytes::new(), true).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
    assert_eq!(cfg.process_budget.used(), grown - (512 << 10));
    // And all of it when the connection ends.
    drop((resp, send, client));
    server.await.unwrap();
    assert_eq!(cfg.process_budget.used(), 0);
}

#[tokio::test(start_paused = true)]
async fn without_a_round_trip_to_cover_the_window_stays_small() {
    let cfg = config(16 * MIB, 1 << 30, None);
    let (peak, read, _server, _client) = upload(&cfg, Duration::ZERO, 24 << 20, None).await;
    assert_eq!(read, 24 << 20);
    assert!(peak <= i64::from(2 * MIB), "peak window {peak}");
}

/// A link that carried only a trickle for a while (every BDP sample
/// said "not the limit", so PINGs backed off towards `MAX_BDP_PAUSE`)
/// still grows its window as soon as a transfer fills it.
#[tokio::test(start_paused = true)]
async fn a_transfer_after_a_quiet_spell_grows_the_window_at_once() {
    let cfg = config(16 * MIB, 1 << 30, None);
    let (mut client, mut read, _server, _frozen) = connect(&cfg, Duration::from_millis(10)).await;
    let req = http::Request::post("http://test/").body(()).unwrap();
    let (_resp, mut send) = client.send_request(req, false).unwrap();
    let mut sent = 0u64;
    // The quiet spell: 16 KiB every 200 ms for 10 s.
    for _ in 0..50 {
        send.send_data(Bytes::from(vec![7u8; 16 << 10]), false)
            .unwrap();
        sent += 16 << 10;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    read.wait_for(|n| *n >= sent).await.unwrap();
    assert_eq!(cfg.stats.connection_windows(), i64::from(MIB));
    // The transfer: 96 MiB, a second at 1 MiB per 10 ms.
    let chunk = Bytes::from(vec![7u8; 256 << 10]);
    let end = sent + (96 << 20);
    let mut peak = 0;
    while sent < end {
        send.reserve_capacity(chunk.len());
        if let Some(Ok(n)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            let n = n.min(chunk.len());
            send.send_data(chunk.slice(..n), false).unwrap();
            sent += n as u64;
        }
        peak = peak.max(cfg.stats.connection_windows());
    }
    read.wait_for(|n| *n >= sent).await.unwrap();
    assert!(peak >= i64::from(8 * MIB), "peak window {peak}");
}

/// A tunneling connection's start (256 KiB streams, 1 MiB connection):
/// the whole start while the budget has room, what is left when it has
/// little, HTTP/2's own window once it is spent; each given back when
/// its connection ends.
#[test]
fn connections_start_with_what_the_budget_has_left() {
    let settings = WindowSettings {
        initial: 256 << 10,
        max: 16 * MIB,
        connection_budget: 64 << 20,
        idle: Duration::from_secs(5),
        single_stream: false,
    };
    let process = Budget::new(i64::from(MIB) + (300 << 10), None);
    let stats = Arc::new(WindowStats::default());
    let full = Start::new(settings, &process, stats.clone());
    assert_eq!((full.stream(), full.connection()), (256 << 10, MIB));
    let part = Start::new(settings, &process, stats.clone());
    assert_eq!((part.stream(), part.connection()), (256 << 10, 300 << 10));
    let spent = Start::new(settings, &process, stats.clone());
    assert_eq!(
        (spent.stream(), spent.connection()),
        (SPEC_WINDOW, SPEC_WINDOW)
    );
    // Past the budget by the one window HTTP/2 grants anyway.
    assert_eq!(process.used(), process.limit() + i64::from(SPEC_WINDOW));
    // What the first gave back pays for the floor first.
    drop(full);
    let again = Start::new(settings, &process, stats);
    assert_eq!(
        i64::from(again.connection()),
        process.limit() - (300 << 10) - i64::from(SPEC_WINDOW)
    );
    assert_eq!(process.used(), process.limit());
    drop((part, spent, again));
    assert_eq!(process.used(), 0);
}

/// With the process budget spent by others, a new connection starts
/// at HTTP/2's own window and still moves data; its window grows once
/// budget comes free, and what it reserved is given back when it ends.
#[tokio::test(start_paused = true)]
async fn a_connection_started_on_a_spent_budget_grows_as_budget_comes_free() {
    let budget = 4 * i64::from(MIB);
    let cfg = config(16 * MIB, budget, None);
    assert_eq!(cfg.process_budget.try_reserve(budget), budget);
    let others = {
        let (process, stats) = (cfg.process_budget.clone(), cfg.stats.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (window, used) = (stats.connection_windows(), process.used());
            // The others end.
            process.release(budget);
            (window, used)
        })
    };
    let (peak, read, server, client) =
        upload(&cfg, Duration::from_millis(50), 24 << 20, None).await;
    assert_eq!(read, 24 << 20);
    let (window, used) = others.await.unwrap();
    assert_eq!(
        window,
        i64::from(SPEC_WINDOW),
        "window while the budget was spent"
    );
    assert_eq!(used, budget + i64::from(SPEC_WINDOW));
    // Doubled at least four times from 64 KiB.
    assert!(
        peak >= 16 * i64::from(SPEC_WINDOW),
        "it grew once budget came free: {peak}"
    );
    assert!(
        peak <= budget,
        "peak window {peak} past the budget {budget}"
    );
    drop(client);
    server.await.unwrap();
    assert_eq!(cfg.process_budget.used(), 0);
    assert_eq!(cfg.stats.connection_windows(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_window_never_grows_past_the_process_budget() {
    let budget = 3 * i64::from(MIB);
    let cfg = config(16 * MIB, budget, None);
    let (peak, read, _server, _client) =
        upload(&cfg, Duration::from_millis(50), 32 << 20, None).await;
    assert_eq!(read, 32 << 20);
    assert!(peak > i64::from(MIB), "it grew within the budget: {peak}");
    assert!(
        peak <= budget,
        "peak window {peak} past the budget {budget}"
    );
    assert!(cfg.process_budget.used() <= budget);
}

/// A peer that stops answering while a BDP PING is out is found out by
/// the keepalive timeout as well.
#[tokio::test(start_paused = true)]
async fn a_peer_frozen_while_data_flows_is_dropped_after_the_keepalive_timeout() {
    let keepalive = Keepalive {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(2),
        min_gap: Duration::ZERO,
    };
    let cfg = config(16 * MIB, 1 << 30, Some(keepalive));
    let (_, _, server, _client) =
        upload(&cfg, Duration::from_millis(20), 64 << 20, Some(4 << 20)).await;
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the connection to the frozen peer is still served")
        .unwrap();
    assert!(t0.elapsed() <= keepalive.timeout + Duration::from_millis(100));
}

/// A peer that freezes while the connection is idle is found out within
/// `interval + timeout` of when it was last heard.
#[tokio::test(start_paused = true)]
async fn a_peer_frozen_while_idle_is_dropped_within_interval_and_timeout() {
    let keepalive = Keepalive {
        interval: Duration::from_secs(25),
        timeout: Duration::from_secs(5),
        min_gap: Duration::ZERO,
    };
    // No BDP PINGs (the window cannot grow): only the keepalive's.
    let cfg = config(MIB, 1 << 30, Some(keepalive));
    let (client_io, server_io, frozen) = delayed_link(Duration::from_millis(20));
    let (read_tx, mut read) = tokio::sync::watch::channel(0u64);
    let drain = daemon::drain::Drain::new();
    let svc = Sink(Arc::new(read_tx));
    let server = tokio::spawn(async move { serve(server_io, svc, &cfg, &drain).await });
    let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("http://test/").body(()).unwrap();
    let (_resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
    read.wait_for(|n| *n == 5).await.unwrap();
    // The server last heard the client now (give or take the window
    // update it answers with); it goes quiet for good.
    let heard = Instant::now();
    frozen.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(120), server)
        .await
        .expect("the connection to the frozen peer is still served")
        .unwrap();
    let took = heard.elapsed();
    assert!(took >= keepalive.interval, "{took:?}");
    assert!(
        took <= keepalive.interval + keepalive.timeout + Duration::from_millis(100),
        "{took:?}"
    );
}

/// A client connection's controller with `keepalive`, over a link of
/// 20 ms to a plain `h2` server that PINGs it every `server_pings` (if
/// given); and the switch that freezes the link.
async fn client_controller(
    keepalive: Keepalive,
    server_pings: Option<Duration>,
) -> (Controller, Arc<AtomicBool>) {
    let (client_io, server_io, frozen) = delayed_link(Duration::from_millis(20));
    tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        let mut pings = conn.ping_pong().unwrap();
        let pinger = async move {
            let Some(every) = server_pings else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(every).await;
                if pings.ping(Ping::opaque()).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = std::future::poll_fn(|cx| conn.poll_closed(cx)) => {}
            () = pinger => {}
        }
    });
    let meter = Meter::new();
    let (send, mut conn) = h2::client::handshake(meter.counted(client_io))
        .await
        .unwrap();
    let pings = conn.ping_pong().unwrap();
    tokio::spawn(async move {
        let _send = send;
        let _ = conn.await;
    });
    // The agent link's settings: its controller wakes rarely by itself.
    let mut window = config(MIB, 1 << 30, None).window;
    window.idle = Duration::from_secs(30);
    let start = Start::new(window, &Budget::new(1 << 30, None), Arc::default());
    let ctl = Controller::new(pings, start, Some(keepalive), meter);
    (ctl, frozen)
}

/// Drives `ctl` for `run`: the PINGs answered meanwhile, or when the
/// keepalive gave up.
async fn drive(ctl: &mut Controller, run: Duration) -> Result<u64, Instant> {
    let deadline = tokio::time::sleep(run);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return Ok(ctl.pongs()),
            a = ctl.next() => if a == Action::KeepaliveTimedOut {
                return Err(Instant::now());
            },
        }
    }
}

async fn client_pings(keepalive: Keepalive, server_pings: Option<Duration>, run: Duration) -> u64 {
    let (mut ctl, _frozen) = client_controller(keepalive, server_pings).await;
    drive(&mut ctl, run)
        .await
        .expect("the live peer was dropped")
}

/// A peer heard from all along that then freezes is found out within
/// `interval + timeout` of when it was last heard, whenever that was.
#[tokio::test(start_paused = true)]
async fn a_peer_heard_until_it_froze_is_dropped_within_interval_and_timeout() {
    let keepalive = Keepalive {
        interval: Duration::from_secs(25),
        timeout: Duration::from_secs(5),
        min_gap: Duration::from_secs(31),
    };
    for quiet_after in [37, 40, 49, 63] {
        let (mut ctl, frozen) = client_controller(keepalive, Some(Duration::from_secs(1))).await;
        // The freeze comes while the controller waits, as it would.
        let froze = Instant::now() + Duration::from_secs(quiet_after);
        tokio::spawn(async move {
            tokio::time::sleep_until(froze).await;
            frozen.store(true, Ordering::Relaxed);
        });
        let gone = drive(&mut ctl, Duration::from_secs(quiet_after + 120))
            .await
            .expect_err("the frozen peer was kept");
        assert_eq!(ctl.pongs(), 0, "a peer heard every second was PINGed");
        let took = gone - froze;
        assert!(
            took <= keepalive.interval + keepalive.timeout,
            "frozen after {quiet_after} s, dropped {took:?} later"
        );
    }
}

/// A peer that is heard from (here: its own PINGs every 15 s, as our
/// server sends them) is not PINGed at all; a quiet one is, but never
/// more often than `min_gap` allows.
#[tokio::test(start_paused = true)]
async fn keepalive_pings_only_a_quiet_peer_and_no_closer_than_the_gap() {
    let keepalive = Keepalive {
        interval: Duration::from_secs(25),
        timeout: Duration::from_secs(5),
        min_gap: Duration::from_secs(31),
    };
    let run = Duration::from_secs(300);
    let heard = client_pings(keepalive, Some(Duration::from_secs(15)), run).await;
    assert_eq!(heard, 0, "PINGed a peer that was heard every 15 s");
    let quiet = client_pings(keepalive, None, run).await;
    // One PING per 31 s, not one per 25 s.
    assert_eq!(quiet, 300 / 31, "PINGs answered in {run:?}");
}
