// Command konnectivity-bench runs our proxy-server / proxy-agent against
// upstream apiserver-network-proxy v0.36.0, and nodeport-proxy /
// tunnel-agent against HAProxy, nginx and tinyproxy, side by side on
// loopback, and prints a Markdown table of the results. scripts/bench
// builds everything and runs it; see BENCHMARKS.md.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"konnectivity-goharness"
)

var (
	flagQuick     = flag.Bool("quick", false, "tiny sizes (a smoke run of every workload, about 5 minutes on 2 cores)")
	flagOnly      = flag.String("only", "", "comma list of workload groups to run: konn-grpc, konn-connect, P5, P6, P10, nodeport, P9, konn-scale, np-mem, reusable, churn (default: all)")
	flagRepeats   = flag.Int("repeats", 0, "timed repeats per workload (default 5, quick 3)")
	flagOurs      = flag.String("ours-bin", "target/release", "directory with proxy-server, proxy-agent, nodeport-proxy, tunnel-agent")
	flagUpstream  = flag.String("upstream-bin", "target/bench/bin", "directory with upstream-proxy-server and upstream-proxy-agent")
	flagOut       = flag.String("out", "", "also write the report (Markdown) to this file")
	flagWorkDir   = flag.String("workdir", "", "configs, sockets, PKI and logs (default: a new temporary directory)")
	flagUpstreamV = flag.Int("upstream-v", 0, "klog -v for both implementations' proxy-server and proxy-agent (both mains default to 4)")
	flagIdleConns = flag.Int("idle-conns", 0, "P5 connections (default 10000, quick 200)")
	flagDestOnly  = flag.Bool("dest-only", false, "internal: serve the destinations only (P5 runs them in a child process)")
	flagDestPlain = flag.Int("dest-plain", 1, "internal: with --dest-only, this many plain listeners")
	flagDestCert  = flag.String("dest-cert", "", "internal: with --dest-only, the TLS listener's certificate (PEM file)")
	flagDestKey   = flag.String("dest-key", "", "internal: with --dest-only, the TLS listener's key (PEM file)")
	flagNPMem     = flag.String("np-mem-sizes", "", "np-mem: comma list of concurrent connection counts (default 1000,5000,10000; quick 200,500)")
	flagNPMemKind = flag.String("np-mem-kinds", "", "np-mem: comma list of words; only the kinds of connection whose name contains one of them (e.g. NodePort,SNI; default: every kind)")
	flagScale     = flag.Int("scale-tunnels", 0, "konn-scale idle tunnels (default 50000, quick 500)")
	flagPerf      = flag.Bool("perf", false, "record a perf profile of our processes (of every subject with BENCH_PERF_ALL=1; with callers, BENCH_PERF_CALLGRAPH=1) during the first timed repeat of each throughput/rate workload (distorts that repeat: not for published numbers); reports go to <workdir>/perf/")
)

var (
	workDir        string
	oursBinDir     string
	upstreamBinDir string
	pki            *benchPKI
	dest           *destination
	cfg            sizes
	failures       int
)

type sizes struct {
	repeats     int
	bulk        int64         // P1, P7, NodePort, HTTP/1.1 CONNECT: bytes per transfer
	aggConns    int           // P2, P8
	agg         int64         // P2, P8: bytes in all per run
	limit       time.Duration // a transfer that takes longer fails
	dials       int           // P3: dials per repeat
	rateDur     time.Duration // P4, P7 conns/s: duration per repeat
	rateWorkers int
	rateMax     int64
	idle        int // P5
	idleRepeats int
	hol         int64 // P6: bytes of the measured download
	holLimit    time.Duration
	holRepeats  int
	starts      int // P9
	// konn-scale (issue 18.4): idle tunnels through one proxy-server from
	// scaleAgents agents, scaleRepeats interleaved runs per implementation
	scaleTunnels, scaleAgents, scaleRepeats int
}

var full = sizes{
	repeats: 5, bulk: 512 * mib, aggConns: 64, agg: 1024 * mib, limit: 120 * time.Second,
	dials: 400, rateDur: 5 * time.Second, rateWorkers: 16, rateMax: 1_000_000,
	idle: 10_000, idleRepeats: 3, hol: 256 * mib, holLimit: 15 * time.Second, holRepeats: 3, starts: 5,
	scaleTunnels: 50_000, scaleAgents: 100, scaleRepeats: 2,
}

var quick = sizes{
	repeats: 3, bulk: 8 * mib, aggConns: 64, agg: 16 * mib, limit: 30 * time.Second,
	dials: 30, rateDur: 300 * time.Millisecond, rateWorkers: 4, rateMax: 100_000,
	idle: 200, idleRepeats: 1, hol: 8 * mib, holLimit: 3 * time.Second, holRepeats: 1, starts: 2,
	scaleTunnels: 500, scaleAgents: 10, scaleRepeats: 1,
}

func fatalf(format string, args ...any) {
	killAll()
	fmt.Fprintf(os.Stderr, "konnectivity-bench: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func main() {
	flag.Parse()
	if *flagDestOnly {
		destOnly()
		return
	}
	cfg = full
	if *flagQuick {
		cfg = quick
	}
	if *flagRepeats > 0 {
		cfg.repeats = *flagRepeats
	}
	if *flagIdleConns > 0 {
		cfg.idle = *flagIdleConns
	}
	if *flagScale > 0 {
		cfg.scaleTunnels = *flagScale
	}
	var err error
	if oursBinDir, err = filepath.Abs(*flagOurs); err != nil {
		fatalf("%v", err)
	}
	if upstreamBinDir, err = filepath.Abs(*flagUpstream); err != nil {
		fatalf("%v", err)
	}
	workDir = *flagWorkDir
	if workDir == "" {
		// Short path: sun_path holds 108 bytes.
		if workDir, err = os.MkdirTemp("", "kbench"); err != nil {
			fatalf("%v", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(workDir, "logs"), 0o755); err != nil {
		fatalf("%v", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		killAll()
		fmt.Fprintf(os.Stderr, "konnectivity-bench: %v: children killed\n", s)
		os.Exit(130)
	}()
	preflight()
	raiseNofile()
	quietKlog()
	if pki, err = newPKI(workDir); err != nil {
		fatalf("PKI: %v", err)
	}
	destTLS, err := pki.destTLS()
	if err != nil {
		fatalf("%v", err)
	}
	if dest, err = startDestination(destTLS); err != nil {
		fatalf("destination: %v", err)
	}
	startLoad := loadavg()
	started := time.Now()
	logf("work dir %s (logs in logs/)", workDir)

	var rows []*row
	groups := []struct {
		name string
		run  func() []*row
	}{
		{"konn-grpc", func() []*row { return konnGroup("grpc") }},
		{"konn-connect", func() []*row { return konnGroup("http-connect") }},
		{"P5", idleGroup},
		{"P6", holGroup},
		{"P10", distanceGroup},
		{"nodeport", nodeportGroup},
		{"P9", startGroup},
		{"konn-scale", scaleGroup},
		{"np-mem", npMemGroup},
		{"reusable", reusableGroup},
		{"churn", churnGroup},
	}
	only := onlyGroups()
	for _, g := range groups {
		if len(only) > 0 && !only[g.name] {
			continue
		}
		logf("== %s", g.name)
		rows = append(rows, g.run()...)
		dest.closeAll()
	}
	if n := killAll(); n > 0 {
		logf("killed %d children still running at the end", n)
	}
	for _, r := range rows {
		if r.err != "" {
			failures++
		}
	}
	report := reportHeader(started, startLoad) + "\n"
	if len(rows) > 0 {
		report += renderTable(rows)
	}
	report += distanceSummary.String() + npMemSummary.String()
	fmt.Println(report)
	if *flagOut != "" {
		if err := os.WriteFile(*flagOut, []byte(report), 0o644); err != nil {
			fatalf("%v", err)
		}
	}
	if *flagWorkDir == "" {
		if failures == 0 {
			os.RemoveAll(workDir)
		} else {
			logf("logs kept in %s", workDir)
		}
	}
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "konnectivity-bench: %d workload(s) failed (see the error cells)\n", failures)
		os.Exit(1)
	}
}

// onlyGroups is --only as a set (empty: every group).
func onlyGroups() map[string]bool {
	only := map[string]bool{}
	for _, g := range strings.Split(*flagOnly, ",") {
		if g = strings.TrimSpace(g); g != "" {
			only[g] = true
		}
	}
	return only
}

// preflight fails with a clear message when something to run is missing.
func preflight() {
	var missing []string
	if only := onlyGroups(); len(only) == 1 && only["np-mem"] {
		// nodeport-proxy alone, against no anchor.
		if _, err := os.Stat(filepath.Join(oursBinDir, "nodeport-proxy")); err != nil {
			fatalf("missing %s (cargo build --release -p nodeport-proxy)", filepath.Join(oursBinDir, "nodeport-proxy"))
		}
		return
	}
	konnOnly := []string{"proxy-server", "proxy-agent"}
	if only := onlyGroups(); len(only) == 1 && only["churn"] {
		// Konnectivity against upstream alone: no nodeport-proxy, no anchors.
		for _, n := range konnOnly {
			if _, err := os.Stat(filepath.Join(oursBinDir, n)); err != nil {
				missing = append(missing, filepath.Join(oursBinDir, n)+" (cargo build --release -p proxy-server -p proxy-agent)")
			}
		}
		for _, n := range []string{"upstream-proxy-server", "upstream-proxy-agent"} {
			if _, err := os.Stat(filepath.Join(upstreamBinDir, n)); err != nil {
				missing = append(missing, filepath.Join(upstreamBinDir, n)+" (go build ./cmd/... in tests/interop)")
			}
		}
		if len(missing) > 0 {
			fatalf("missing:\n  %s", strings.Join(missing, "\n  "))
		}
		return
	}
	for _, n := range append(konnOnly, "nodeport-proxy", "tunnel-agent") {
		if _, err := os.Stat(filepath.Join(oursBinDir, n)); err != nil {
			missing = append(missing, filepath.Join(oursBinDir, n)+" (cargo build --release --bins)")
		}
	}
	for _, n := range []string{"upstream-proxy-server", "upstream-proxy-agent"} {
		if _, err := os.Stat(filepath.Join(upstreamBinDir, n)); err != nil {
			missing = append(missing, filepath.Join(upstreamBinDir, n)+" (go build ./cmd/... in tests/interop)")
		}
	}
	for _, n := range []string{"haproxy", "nginx", "tinyproxy"} {
		if _, err := exec.LookPath(sbin(n)); err != nil {
			missing = append(missing, n+" (benches/install-deps.sh)")
		}
	}
	if nginxModule() == "" {
		missing = append(missing, "nginx stream module (benches/install-deps.sh installs libnginx-mod-stream)")
	}
	if len(missing) > 0 {
		fatalf("missing:\n  %s\nscripts/bench builds and installs all of these", strings.Join(missing, "\n  "))
	}
}

// raiseNofile raises RLIMIT_NOFILE (children inherit it): P5 holds
// 10,000 tunneled connections, i.e. 10,000 Unix sockets and 10,000 TCP
// connections in the harness and as many in the server and the agent.
// (konn-scale spreads its 50,000 over processes: see konnscale.go.)
func raiseNofile() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		fatalf("getrlimit: %v", err)
	}
	// Per process: N Unix sockets in the harness, N in the server, N TCP
	// connections in the agent and in the destination process.
	want := uint64(cfg.idle + 4096)
	if lim.Cur >= want {
		// Go raised the soft limit for itself at start and would restore
		// the original one for children unless Setrlimit is called.
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		return
	}
	next := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		// Not root: take the hard limit and size P5 to it.
		next = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next)
		n := int(lim.Max) - 4096
		if n < 100 {
			fatalf("open-files limit %d is too low for the idle-connection workload (P5); raise it (ulimit -n) to at least %d", lim.Max, want)
		}
		logf("open-files limit %d (not allowed to raise it to %d): P5 uses %d connections instead of %d", lim.Max, want, n, cfg.idle)
		cfg.idle = n
		return
	}
	logf("open-files limit raised from %d to %d for the children", lim.Cur, want)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(sbin(name), args...).CombinedOutput()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

func reportHeader(started time.Time, startLoad string) string {
	var u syscall.Utsname
	_ = syscall.Uname(&u)
	rel := func(a [65]int8) string {
		var b []byte
		for _, c := range a {
			if c == 0 {
				break
			}
			b = append(b, byte(c))
		}
		return string(b)
	}
	mode := "full"
	if *flagQuick {
		mode = "quick (tiny sizes: a smoke test, not results)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "- date: %s; mode: %s; %d timed repeats after one warm-up; took %s\n", started.UTC().Format("2006-01-02 15:04 UTC"), mode, cfg.repeats, time.Since(started).Round(time.Second))
	fmt.Fprintf(&b, "- machine: %d cores (%s), kernel %s %s, load average at start %s, at end %s\n", runtime.NumCPU(), cpuModel(), rel(u.Sysname), rel(u.Release), startLoad, loadavg())
	fmt.Fprintf(&b, "- command: `%s`\n", strings.Join(os.Args, " "))
	fmt.Fprintf(&b, "- anchors: %s; %s; %s; upstream apiserver-network-proxy v0.36.0 (%s), upstream -v=%d\n",
		cmdOut("haproxy", "-v"), cmdOut("nginx", "-v"), cmdOut("tinyproxy", "-v"), runtime.Version(), *flagUpstreamV)
	fmt.Fprintf(&b, "- sizes: bulk %d MiB per transfer; %d connections × %d MiB in all; %d dials per latency repeat; %s per rate repeat with %d workers; %d idle connections; head-of-line download %d MiB bounded by %s; %d idle tunnels from %d agents\n",
		cfg.bulk/mib, cfg.aggConns, cfg.agg/mib, cfg.dials, cfg.rateDur, cfg.rateWorkers, cfg.idle, cfg.hol/mib, cfg.holLimit, cfg.scaleTunnels, cfg.scaleAgents)
	return b.String()
}

// --- running subjects side by side ----------------------------------------

// sampleFn runs one timed repeat against s: the value for the table and
// the bytes moved (for CPU per GiB).
type sampleFn func(s *subject) (float64, int64, error)

// compare runs warm (untimed) once per subject, then repeats rounds of
// once over all subjects, rotating the order each round. It returns each
// subject's samples and usage; peak RSS is reset before the timed rounds.
func compare(tag string, subs []*subject, warm, once sampleFn) ([][]float64, []usage, []int64, error) {
	samples := make([][]float64, len(subs))
	use := make([]usage, len(subs))
	for _, s := range subs {
		if warm != nil {
			if _, _, err := warm(s); err != nil {
				return nil, nil, nil, fmt.Errorf("warm-up: %w", err)
			}
		}
		resetPeak(s)
	}
	for r := range cfg.repeats {
		for k := range subs {
			i := (k + r) % len(subs)
			s := subs[i]
			var v float64
			var stopPerf func()
			if *flagPerf && r == 0 && (i == 0 || os.Getenv("BENCH_PERF_STAT") != "" || os.Getenv("BENCH_PERF_ALL") != "") {
				stopPerf = startPerf(tag+" "+s.name, s)
			}
			err := timed(s, &use[i], func() (int64, error) {
				val, n, err := once(s)
				v = val
				return n, err
			})
			if stopPerf != nil {
				stopPerf()
			}
			if err != nil {
				return nil, nil, nil, err
			}
			if err := s.alive(); err != nil {
				return nil, nil, nil, err
			}
			samples[i] = append(samples[i], v)
		}
	}
	peaks := make([]int64, len(subs))
	for i, s := range subs {
		_, peaks[i] = s.mem()
	}
	return samples, use, peaks, nil
}

// resetPeak resets VmHWM (echo 5 > /proc/<pid>/clear_refs) so peak RSS
// covers the timed runs of one workload only.
func resetPeak(s *subject) {
	for _, pid := range s.pids() {
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
	}
}

// rowsFor turns a compare over subs (subs[0] is ours) into one row per anchor.
func rowsFor(tmpl row, subs []*subject, samples [][]float64, use []usage, peaks []int64, withCPU bool) []*row {
	var out []*row
	for i := 1; i < len(subs); i++ {
		r := tmpl
		r.ours, r.anchor = samples[0], samples[i]
		if r.anchorName == "" {
			r.anchorName = subs[i].name
		}
		r.cpuOurs, r.cpuAnchor = -1, -1
		if withCPU {
			r.cpuOurs, r.cpuAnchor = use[0].cpuPerGiB(), use[i].cpuPerGiB()
			n := fmt.Sprintf("load generator CPU s/GiB: %s beside ours, %s beside %s", num(use[0].genPerGiB()), num(use[i].genPerGiB()), subs[i].name)
			if r.note != "" {
				n = r.note + "; " + n
			}
			r.note = n
		}
		r.rssOurs, r.rssAnchor = peaks[0], peaks[i]
		if r.perOp > 0 && use[0].bytes > 0 && use[i].bytes > 0 {
			per := func(u usage) float64 { return u.cpu / float64(u.bytes/r.perOp) * 1e6 }
			gen := func(u usage) float64 { return u.genCPU / float64(u.bytes/r.perOp) * 1e6 }
			r.opOurs, r.opAnchor = per(use[0]), per(use[i])
			n := fmt.Sprintf("CPU per connection: ours %.0f µs, %s %.0f µs; load generator %.0f µs beside ours, %.0f µs beside %s", per(use[0]), subs[i].name, per(use[i]), gen(use[0]), gen(use[i]), subs[i].name)
			if r.note != "" {
				n = r.note + "; " + n
			}
			r.note = n
		}
		if r.aimFor != "" && subs[i].name != r.aimFor {
			r.aim, r.ratioMin, r.ratioMax = "", 0, 0
		}
		out = append(out, &r)
	}
	return out
}

func errRow(tmpl row, err error) *row {
	r := tmpl
	r.err = err.Error()
	if len(r.err) > 300 {
		r.err = r.err[:300] + "…"
	}
	r.cpuOurs, r.cpuAnchor = -1, -1
	logf("ERROR %s %s: %v", r.id, r.workload, err)
	return &r
}

// run compares subs on one workload and returns its rows (errors become
// error rows).
func run(tmpl row, subs []*subject, warm, once sampleFn, withCPU bool) []*row {
	logf("%s %s", tmpl.id, tmpl.workload)
	samples, use, peaks, err := compare(tmpl.id+" "+tmpl.workload, subs, warm, once)
	if err != nil {
		return []*row{errRow(tmpl, err)}
	}
	rows := rowsFor(tmpl, subs, samples, use, peaks, withCPU)
	for _, r := range rows {
		logf("   ours %s %s, %s %s %s, ratio %s", num(median(r.ours)), r.unit, r.anchorName, num(median(r.anchor)), r.unit, num(r.ratio()))
	}
	return rows
}

// rateOpBytes is what dialRate counts per operation (64-byte echo).
const rateOpBytes = 2*64 + headerLen

func bulkFn(dst string, conns int, total int64, dir byte) sampleFn {
	return func(s *subject) (float64, int64, error) { return bulk(s, dst, conns, total, dir, cfg.limit) }
}

func warmBulk(dst string, conns int, total int64, dir byte) sampleFn {
	return bulkFn(dst, conns, max(total/8, int64(conns)*64<<10), dir)
}

func dirName(dir byte) string {
	if dir == opDownload {
		return "download (destination → client)"
	}
	return "upload (client → destination)"
}

// --- Konnectivity: P1-P4 ---------------------------------------------------

func konnGroup(mode string) []*row {
	client := "gRPC (kube-apiserver dialer, new UDS connection per dial)"
	if mode != "grpc" {
		client = "HTTP-CONNECT over UDS"
	}
	o, err := startKonn(ours, mode)
	if err != nil {
		return []*row{errRow(row{id: "P1-P4", workload: client}, err)}
	}
	defer o.stop()
	u, err := startKonn(upstream, mode)
	if err != nil {
		return []*row{errRow(row{id: "P1-P4", workload: client}, err)}
	}
	defer u.stop()
	hport := pickPort()
	h, err := startHAProxy([]haproxyFrontend{{name: "relay", port: hport, backend: dest.plainAddr()}})
	if err != nil {
		return []*row{errRow(row{id: "P1", workload: client}, err)}
	}
	defer h.stop()
	h.name = "HAProxy one hop"
	h.dial = tcpTo(goharness.Loopback(hport))
	d := dest.plainAddr()
	floor, err := startFloorChain(true, d)
	if err != nil {
		return []*row{errRow(row{id: "P1", workload: floorTLS}, err)}
	}
	defer floor.stop()
	// Debugging aid: BENCH_KONN_ROWS=P4 (or P3,P4) runs only those rows.
	want := func(id string) bool {
		v := os.Getenv("BENCH_KONN_ROWS")
		return v == "" || slices.Contains(strings.Split(v, ","), id)
	}
	var rows []*row
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("P1") {
			break
		}
		rows = append(rows, run(row{id: "P1", workload: "1 connection bulk " + dirName(dir) + ", " + client, unit: "MiB/s"},
			[]*subject{o, u, h, floor}, warmBulk(d, 1, cfg.bulk, dir), bulkFn(d, 1, cfg.bulk, dir), true)...)
	}
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("P2") {
			break
		}
		rows = append(rows, run(row{id: "P2", workload: fmt.Sprintf("%d connections aggregate %s, %s", cfg.aggConns, dirName(dir), client), unit: "MiB/s"},
			[]*subject{o, u, floor}, warmBulk(d, cfg.aggConns, cfg.agg, dir), bulkFn(d, cfg.aggConns, cfg.agg, dir), true)...)
	}
	// Issue 18.2: server + agent CPU per GiB at most 1.15× the two-hop TLS
	// chain's and at most a third of upstream's.
	for _, r := range rows {
		switch r.anchorName {
		case upstream:
			r.cpuAim, r.cpuRatioMax = "CPU ≤ 0.33×", 1.0/3
		case floorTLS:
			r.cpuAim, r.cpuRatioMax = "CPU ≤ 1.15× floor", 1.15
		}
	}
	// P3: both quantiles come from the same dials; the servers' and agents'
	// own dial histograms say where the mean dial's time went.
	p99 := map[*subject][]float64{}
	splits := map[*subject]*dialSplit{o: {}, u: {}}
	lat := func(s *subject) (float64, int64, error) {
		before, berr := readDialTimes(s)
		p50, q99, mean, err := dialLatency(s, d, cfg.dials)
		after, aerr := readDialTimes(s)
		p99[s] = append(p99[s], q99)
		splits[s].add(after.minus(before), cmp.Or(berr, aerr), mean, cfg.dials)
		return p50, 0, err
	}
	warmLat := func(s *subject) (float64, int64, error) {
		_, _, _, err := dialLatency(s, d, max(cfg.dials/4, 10))
		return 0, 0, err
	}
	var p3 []*row
	if want("P3") {
		p3 = run(row{id: "P3", workload: fmt.Sprintf("dial latency p50, %d sequential dials per repeat, %s", cfg.dials, client), unit: "ms", lowerBetter: true, aim: "≤ 0.5×", ratioMax: 0.5},
			[]*subject{o, u}, warmLat, lat, false)
	}
	if len(p3) == 1 && p3[0].err == "" {
		mo, erro := splits[o].means()
		mu, erru := splits[u].means()
		if err := cmp.Or(erro, erru); err != nil {
			logf("   no split of the dial time: %v", err)
		} else {
			p3[0].note = fmt.Sprintf("mean dial, ours / upstream: client %s / %s ms, of which the server waits for the agent's DIAL_RSP %s / %s ms, of which the agent connects %s / %s ms",
				num(mo.client), num(mu.client), num(mo.server), num(mu.server), num(mo.agent), num(mu.agent))
			logf("   %s", p3[0].note)
		}
	}
	rows = append(rows, p3...)
	if len(p3) == 1 && p3[0].err == "" {
		r := *p3[0]
		r.workload = strings.Replace(r.workload, "p50", "p99", 1)
		r.note = ""
		r.ours, r.anchor = p99[o][len(p99[o])-len(r.ours):], p99[u][len(p99[u])-len(r.anchor):]
		rows = append(rows, &r)
	}
	rate := func(s *subject) (float64, int64, error) {
		return dialRate(s, d, cfg.rateWorkers, cfg.rateDur, cfg.rateMax, 64)
	}
	warmRate := func(s *subject) (float64, int64, error) {
		return dialRate(s, d, cfg.rateWorkers, cfg.rateDur/4, cfg.rateMax, 64)
	}
	// Issue 18.2: server + agent CPU per dial (and its 64-byte exchange).
	perDial := 200.0
	if mode != "grpc" {
		perDial = 120
	}
	rows = append(rows, run(row{id: "P4", workload: fmt.Sprintf("dials/s, %d workers each: dial, 64-byte request and response, close; %s", cfg.rateWorkers, client), unit: "dials/s", perOp: rateOpBytes,
		cpuAim: fmt.Sprintf("CPU ≤ %.0f µs per dial", perDial), opMaxMicros: perDial},
		[]*subject{o, u}, warmRate, rate, false)...)
	return rows
}

// --- P5: memory per idle connection ----------------------------------------

func idleGroup() []*row {
	tmpl := row{id: "P5", workload: fmt.Sprintf("server + agent RSS growth per idle tunneled connection, N = %d, gRPC (kube-apiserver dialer)", cfg.idle), unit: "KiB", lowerBetter: true, aim: "≤ 16 KiB", oursMax: 16, anchorName: upstream}
	logf("%s %s", tmpl.id, tmpl.workload)
	var per [2][]float64
	var peaks [2]int64
	var splits [2]string
	// The destinations run in their own process: one process cannot hold
	// both ends of N connections within a 20,000 open-files limit.
	dp, l, err := startDestProc()
	if err != nil {
		return []*row{errRow(tmpl, err)}
	}
	defer dp.Kill()
	idleDest := goharness.Field(l, "plain")
	for r := range cfg.idleRepeats {
		for k := range 2 {
			i := (k + r) % 2
			impl := []string{ours, upstream}[i]
			s, err := startKonn(impl, "grpc")
			if err != nil {
				return []*row{errRow(tmpl, err)}
			}
			v, split, conns, err := idleMemory(s, idleDest, cfg.idle)
			_, hwm := s.mem()
			peaks[i] = max(peaks[i], hwm)
			// Stop the proxies first: the clients' closes then end at once.
			s.stop()
			closeAll(conns)
			dest.closeAll()
			if err != nil {
				return []*row{errRow(tmpl, err)}
			}
			per[i] = append(per[i], v)
			if len(split) == 2 {
				splits[i] = fmt.Sprintf("%s: server %.1f + agent %.1f KiB", impl, split[0], split[1])
			}
			logf("   %s: %.1f KiB per connection (%s)", impl, v, splits[i])
		}
	}
	r := tmpl
	r.ours, r.anchor = per[0], per[1]
	r.cpuOurs, r.cpuAnchor = -1, -1
	r.rssOurs, r.rssAnchor = peaks[0], peaks[1]
	r.note = "last repeat: " + splits[0] + "; " + splits[1]
	return []*row{&r}
}

// --- P6: head-of-line blocking ----------------------------------------------

func holGroup() []*row {
	tmpl := row{id: "P6", workload: fmt.Sprintf("share of solo throughput one %d MiB download keeps while another connection on the same agent has a reader that stopped (bounded by %s), gRPC", cfg.hol/mib, cfg.holLimit), unit: "%", anchorName: upstream, aim: "≥ 95 % kept", oursMin: 95}
	logf("%s %s", tmpl.id, tmpl.workload)
	var kept [2][]float64
	var peaks [2]int64
	var maxGap [2]time.Duration
	var stuckCPU [2]float64
	var unfinished [2]int
	for r := range cfg.holRepeats {
		for k := range 2 {
			i := (k + r) % 2
			impl := []string{ours, upstream}[i]
			s, err := startKonn(impl, "grpc")
			if err != nil {
				return []*row{errRow(tmpl, err)}
			}
			d := dest.plainAddr()
			if _, _, err := bulk(s, d, 1, cfg.hol/4, opDownload, cfg.limit); err != nil { // warm-up
				s.stop()
				return []*row{errRow(tmpl, err)}
			}
			h, err := holOnce(s, d, cfg.hol, cfg.holLimit)
			_, hwm := s.mem()
			peaks[i] = max(peaks[i], hwm)
			s.stop()
			dest.closeAll()
			if err != nil {
				return []*row{errRow(tmpl, err)}
			}
			kept[i] = append(kept[i], h.kept())
			stuckCPU[i] = max(stuckCPU[i], h.stuckCPU)
			maxGap[i] = max(maxGap[i], h.gap)
			if h.finished {
				logf("   %s: solo %.0f MiB/s, beside the stuck reader %.0f MiB/s, solo again %.0f MiB/s (%.0f %% kept), longest stall %s, CPU while stuck %.0f ms/s", impl, h.soloBefore, h.beside, h.soloAfter, h.kept(), h.gap.Round(time.Millisecond), 1000*h.stuckCPU)
			} else {
				unfinished[i]++
				logf("   %s: solo %.0f MiB/s, beside the stuck reader only %.1f of %d MiB within %s, longest stall %s", impl, h.soloBefore, float64(h.moved)/mib, cfg.hol/mib, cfg.holLimit, h.gap.Round(time.Millisecond))
			}
		}
	}
	r := tmpl
	r.ours, r.anchor = kept[0], kept[1]
	r.cpuOurs, r.cpuAnchor = -1, -1
	r.rssOurs, r.rssAnchor = peaks[0], peaks[1]
	var notes []string
	for i, impl := range []string{ours, upstream} {
		n := fmt.Sprintf("%s: longest stall of the measured download %s, server + agent CPU while only the stuck connection was open %.0f ms/s", impl, maxGap[i].Round(10*time.Millisecond), 1000*stuckCPU[i])
		if unfinished[i] > 0 {
			n += fmt.Sprintf(", %d of %d runs unfinished within %s", unfinished[i], cfg.holRepeats, cfg.holLimit)
		}
		notes = append(notes, n)
	}
	r.note = strings.Join(notes, "; ")
	return []*row{&r}
}

// --- P9: start-to-ready and idle RSS ----------------------------------------

func startGroup() []*row {
	logf("P9 start-to-ready and idle RSS")
	type m struct{ ready, rss []float64 }
	res := map[string]*m{}
	add := func(k string, ready time.Duration, pids []int) {
		if res[k] == nil {
			res[k] = &m{}
		}
		rss, _ := memKiB(pids)
		res[k].ready = append(res[k].ready, float64(ready)/float64(time.Millisecond))
		res[k].rss = append(res[k].rss, float64(rss)/1024)
	}
	var errs []error
	for range cfg.starts {
		for _, impl := range []string{ours, upstream} {
			t0 := time.Now()
			srv, _, addrs, err := startServer(impl, "grpc")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			add(impl+" proxy-server", time.Since(t0), goharness.Tree(srv.Pid()))
			t0 = time.Now()
			ag, _, _, err := startAgent(impl, addrs)
			if err != nil {
				errs = append(errs, err)
				srv.Kill()
				continue
			}
			add(impl+" proxy-agent", time.Since(t0), goharness.Tree(ag.Pid()))
			ag.Kill()
			srv.Kill()
		}
		t0 := time.Now()
		np, pp, err := startNodeportProxy(dest.tlsAddr(), dest.plainAddr())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		add("ours nodeport-proxy", time.Since(t0), np.pids())
		t0 = time.Now()
		ta, _, err := startTunnelAgent(pp.tunnel, tlsAuthority)
		if err != nil {
			errs = append(errs, err)
		} else {
			add("ours tunnel-agent", time.Since(t0), goharness.Tree(ta.Pid()))
			ta.Kill()
		}
		np.stop()
		sni, plain := pickPort(), pickPort()
		t0 = time.Now()
		h, err := startHAProxy([]haproxyFrontend{{name: "sni", port: sni, backend: dest.tlsAddr(), sni: true}, {name: "plain", port: plain, backend: dest.plainAddr()}})
		if err != nil {
			errs = append(errs, err)
		} else {
			add("HAProxy", time.Since(t0), h.pids())
			h.stop()
		}
		sni, plain = pickPort(), pickPort()
		t0 = time.Now()
		n, err := startNginx(sni, dest.tlsAddr(), plain, dest.plainAddr())
		if err != nil {
			errs = append(errs, err)
		} else {
			add("nginx", time.Since(t0), n.pids())
			n.stop()
		}
	}
	var rows []*row
	if len(errs) > 0 {
		rows = append(rows, errRow(row{id: "P9", workload: "start-to-ready"}, errs[0]))
	}
	mk := func(what, ourKey, anchorKey, anchorName string) {
		o, a := res[ourKey], res[anchorKey]
		if o == nil {
			return
		}
		for _, kind := range []string{"start-to-ready", "idle RSS"} {
			r := &row{id: "P9", workload: what + " " + kind, lowerBetter: true, cpuOurs: -1, cpuAnchor: -1}
			if kind == "start-to-ready" {
				r.unit, r.ours = "ms", o.ready
				if a != nil {
					r.anchor, r.anchorName = a.ready, anchorName
				}
			} else {
				r.unit, r.ours = "MiB", o.rss
				if a != nil {
					r.anchor, r.anchorName = a.rss, anchorName
				}
			}
			rows = append(rows, r)
		}
	}
	mk("proxy-server", "ours proxy-server", "upstream proxy-server", upstream)
	mk("proxy-agent (connected to a running server)", "ours proxy-agent", "upstream proxy-agent", upstream)
	mk("nodeport-proxy (SNI + tunneling + 1 NodePort)", "ours nodeport-proxy", "HAProxy", "HAProxy (SNI + 1 relay)")
	mk("nodeport-proxy (SNI + tunneling + 1 NodePort)", "ours nodeport-proxy", "nginx", "nginx (SNI + 1 relay)")
	mk("tunnel-agent (connected)", "ours tunnel-agent", "", "")
	// The nodeport-proxy rows appear twice with different anchors; keep
	// the text unambiguous.
	return rows
}

// --- nodeport-proxy: P7, NodePort, P8 ---------------------------------------

func nodeportGroup() []*row {
	np, pp, err := startNodeportProxy(dest.tlsAddr(), dest.plainAddr())
	if err != nil {
		return []*row{errRow(row{id: "P7", workload: "nodeport-proxy"}, err)}
	}
	defer np.stop()
	hs, hp := pickPort(), pickPort()
	h, err := startHAProxy([]haproxyFrontend{{name: "sni", port: hs, backend: dest.tlsAddr(), sni: true}, {name: "plain", port: hp, backend: dest.plainAddr()}})
	if err != nil {
		return []*row{errRow(row{id: "P7", workload: "HAProxy"}, err)}
	}
	defer h.stop()
	ns, npl := pickPort(), pickPort()
	n, err := startNginx(ns, dest.tlsAddr(), npl, dest.plainAddr())
	if err != nil {
		return []*row{errRow(row{id: "P7", workload: "nginx"}, err)}
	}
	defer n.stop()
	// Issue 39: HAProxy with `option splice-auto`, and ours copying
	// through user space (-splice=false), beside the defaults.
	hss, hsp := pickPort(), pickPort()
	hsplice, err := startHAProxyWith([]haproxyFrontend{{name: "sni", port: hss, backend: dest.tlsAddr(), sni: true}, {name: "plain", port: hsp, backend: dest.plainAddr()}}, true)
	if err != nil {
		return []*row{errRow(row{id: "P7", workload: "HAProxy splice-auto"}, err)}
	}
	defer hsplice.stop()
	npCopy, cp, err := startNodeportProxy(dest.tlsAddr(), dest.plainAddr(), "-splice=false")
	if err != nil {
		return []*row{errRow(row{id: "P7", workload: "nodeport-proxy -splice=false"}, err)}
	}
	defer npCopy.stop()
	const hSpliceName, oursCopyName = "HAProxy splice-auto", "ours -splice=false"
	tp := pickPort()
	t, err := startTinyproxy(tp)
	if err != nil {
		return []*row{errRow(row{id: "P8", workload: "tinyproxy"}, err)}
	}
	defer t.stop()

	ctls := pki.clientTLS()
	via := func(s *subject, name string, d dialFunc) *subject {
		c := *s
		c.name, c.dial = name, d
		return &c
	}
	sniOurs := via(np, "ours", withTLS(tcpTo(goharness.Loopback(pp.sni)), ctls))
	sniH := via(h, "HAProxy", withTLS(tcpTo(goharness.Loopback(hs)), ctls))
	sniN := via(n, "nginx", withTLS(tcpTo(goharness.Loopback(ns)), ctls))
	sni := []*subject{sniOurs, sniH, sniN,
		via(hsplice, hSpliceName, withTLS(tcpTo(goharness.Loopback(hss)), ctls)),
		via(npCopy, oursCopyName, withTLS(tcpTo(goharness.Loopback(cp.sni)), ctls))}
	// Issue 39's CPU aims on the relays: at most 0.7x HAProxy's and nginx's
	// defaults, at most HAProxy with splicing.
	splAims := func(rs []*row) []*row {
		for _, r := range rs {
			switch r.anchorName {
			case "HAProxy", "nginx":
				r.cpuAim, r.cpuRatioMax = "CPU ≤ 0.7×", 0.7
			case hSpliceName:
				r.cpuAim, r.cpuRatioMax = "CPU ≤ 1.0×", 1
			default:
				r.cpuAim, r.cpuRatioMax = "", 0
			}
		}
		return rs
	}
	td := dest.tlsAddr()
	// Debugging aids: BENCH_NP_ROWS=P7,NP (of P7, P7-64, P7-rate, NP,
	// NP-64, NP-rate, P8) runs only those rows; BENCH_NP_BASE=<dir> adds the nodeport-proxy
	// in <dir> (an older build) as one more anchor of the P7 and NP rows, and
	// its tunnel-agent and nodeport-proxy of the P8 HTTP/2 rows, interleaved
	// with the others: a before/after in one run.
	want := func(id string) bool {
		v := os.Getenv("BENCH_NP_ROWS")
		return v == "" || slices.Contains(strings.Split(v, ","), id)
	}
	var base *subject
	var bp npPorts
	if d := os.Getenv("BENCH_NP_BASE"); d != "" {
		if base, bp, err = startNodeportProxyAt(filepath.Join(d, "nodeport-proxy"), dest.tlsAddr(), dest.plainAddr()); err != nil {
			return []*row{errRow(row{id: "P7", workload: "nodeport-proxy base"}, err)}
		}
		defer base.stop()
		sni = append(sni, via(base, "nodeport-proxy base", withTLS(tcpTo(goharness.Loopback(bp.sni)), ctls)))
	}

	var rows []*row
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("P7") {
			break
		}
		rows = append(rows, splAims(run(row{id: "P7", workload: "SNI passthrough, 1 TLS stream, " + dirName(dir), unit: "MiB/s", aim: "≥ 1.0×", ratioMin: 1, aimFor: "HAProxy", cpuAim: "CPU ≤ 1.0×", cpuRatioMax: 1},
			sni, warmBulk(td, 1, cfg.bulk, dir), bulkFn(td, 1, cfg.bulk, dir), true))...)
	}
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("P7-64") {
			break
		}
		rows = append(rows, splAims(run(row{id: "P7", workload: fmt.Sprintf("SNI passthrough, %d TLS streams, aggregate %s", cfg.aggConns, dirName(dir)), unit: "MiB/s"},
			sni, warmBulk(td, cfg.aggConns, cfg.agg, dir), bulkFn(td, cfg.aggConns, cfg.agg, dir), true))...)
	}
	rate := func(s *subject) (float64, int64, error) {
		return dialRate(s, td, cfg.rateWorkers, cfg.rateDur, cfg.rateMax, 64)
	}
	warmRate := func(s *subject) (float64, int64, error) {
		return dialRate(s, td, cfg.rateWorkers, cfg.rateDur/4, cfg.rateMax, 64)
	}
	if want("P7-rate") {
		rows = append(rows, run(row{id: "P7", workload: fmt.Sprintf("SNI passthrough, new TLS connections/s (full handshake, 64-byte echo, close), %d workers", cfg.rateWorkers), unit: "conn/s", aim: "≥ 1.2×", ratioMin: 1.2, aimFor: "HAProxy", perOp: rateOpBytes},
			sni, warmRate, rate, false)...)
	}

	pd := dest.plainAddr()
	plain := []*subject{via(np, "ours", tcpTo(goharness.Loopback(pp.nodePort))), via(h, "HAProxy", tcpTo(goharness.Loopback(hp))), via(n, "nginx", tcpTo(goharness.Loopback(npl))),
		via(hsplice, hSpliceName, tcpTo(goharness.Loopback(hsp))), via(npCopy, oursCopyName, tcpTo(goharness.Loopback(cp.nodePort)))}
	if base != nil {
		plain = append(plain, via(base, "nodeport-proxy base", tcpTo(goharness.Loopback(bp.nodePort))))
	}
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("NP") {
			break
		}
		rows = append(rows, splAims(run(row{id: "NP", workload: "NodePort plain TCP relay, 1 stream, " + dirName(dir), unit: "MiB/s"},
			plain, warmBulk(pd, 1, cfg.bulk, dir), bulkFn(pd, 1, cfg.bulk, dir), true))...)
	}
	for _, dir := range []byte{opDownload, opUpload} {
		if !want("NP-64") {
			break
		}
		rows = append(rows, splAims(run(row{id: "NP", workload: fmt.Sprintf("NodePort plain TCP relay, %d streams, aggregate %s", cfg.aggConns, dirName(dir)), unit: "MiB/s"},
			plain, warmBulk(pd, cfg.aggConns, cfg.agg, dir), bulkFn(pd, cfg.aggConns, cfg.agg, dir), true))...)
	}
	prate := func(s *subject) (float64, int64, error) {
		return dialRate(s, pd, cfg.rateWorkers, cfg.rateDur, cfg.rateMax, 64)
	}
	pwarm := func(s *subject) (float64, int64, error) {
		return dialRate(s, pd, cfg.rateWorkers, cfg.rateDur/4, cfg.rateMax, 64)
	}
	if want("NP-rate") {
		rows = append(rows, run(row{id: "NP", workload: fmt.Sprintf("NodePort plain TCP relay, new connections/s (64-byte echo, close), %d workers", cfg.rateWorkers), unit: "conn/s", perOp: rateOpBytes},
			plain, pwarm, prate, false)...)
	}
	if !want("P8") {
		return rows
	}

	// P8: 64 tunnels over one HTTP/2 connection (tunnel-agent ->
	// nodeport-proxy) against 64 SNI connections to the same TLS destination.
	ta, listen, err := startTunnelAgent(pp.tunnel, tlsAuthority)
	if err != nil {
		rows = append(rows, errRow(row{id: "P8", workload: "tunnel-agent"}, err))
	} else {
		tun := &subject{name: "ours tunnel-agent → nodeport-proxy", procs: []*proc{ta, np.procs[0]}, dial: withTLS(tcpTo(goharness.Loopback(listen)), ctls)}
		sniSelf := via(np, "our SNI, "+strconv.Itoa(cfg.aggConns)+" connections", withTLS(tcpTo(goharness.Loopback(pp.sni)), ctls))
		subs := []*subject{tun, sniSelf}
		floor, err := startFloorChain(false, td)
		if err != nil {
			rows = append(rows, errRow(row{id: "P8", workload: floorPlain}, err))
		} else {
			defer floor.stop()
			floor.dial = withTLS(floor.dial, ctls)
			subs = append(subs, floor)
		}
		if base != nil {
			bta, blisten, err := startTunnelAgentAt(filepath.Join(os.Getenv("BENCH_NP_BASE"), "tunnel-agent"), bp.tunnel, tlsAuthority)
			if err != nil {
				rows = append(rows, errRow(row{id: "P8", workload: "tunnel-agent base"}, err))
			} else {
				defer bta.Kill()
				subs = append(subs, &subject{name: "base tunnel-agent → nodeport-proxy", procs: []*proc{bta, base.procs[0]}, dial: withTLS(tcpTo(goharness.Loopback(blisten)), ctls)})
			}
		}
		for _, dir := range []byte{opDownload, opUpload} {
			p8 := run(row{id: "P8", workload: fmt.Sprintf("HTTP/2 CONNECT, %d TLS streams on one tunnel-agent connection, aggregate %s", cfg.aggConns, dirName(dir)), unit: "MiB/s"},
				subs, warmBulk(td, cfg.aggConns, cfg.agg, dir), bulkFn(td, cfg.aggConns, cfg.agg, dir), true)
			// Issue 18.2: at least 0.6× our SNI throughput, and tunnel-agent
			// + nodeport-proxy at most 1.3 CPU-seconds per GiB (shown
			// against the two-hop floor).
			for _, r := range p8 {
				switch r.anchorName {
				case sniSelf.name:
					r.aim, r.ratioMin = "≥ 0.6×", 0.6
				case floorPlain:
					r.cpuAim, r.cpuMax = "CPU ≤ 1.3 s/GiB", 1.3
				}
			}
			rows = append(rows, p8...)
		}
		ta.Kill()
	}
	conn := []*subject{via(np, "ours", httpConnectTCP(goharness.Loopback(pp.tunnel), plainAuthority)), via(t, "tinyproxy", httpConnectTCP(goharness.Loopback(tp), ""))}
	for _, dir := range []byte{opDownload, opUpload} {
		rows = append(rows, run(row{id: "P8", workload: "HTTP/1.1 CONNECT, 1 stream, " + dirName(dir), unit: "MiB/s"},
			conn, warmBulk(pd, 1, cfg.bulk, dir), bulkFn(pd, 1, cfg.bulk, dir), true)...)
	}
	rows = append(rows, run(row{id: "P8", workload: fmt.Sprintf("HTTP/1.1 CONNECT, new tunnels/s (64-byte echo, close), %d workers", cfg.rateWorkers), unit: "conn/s", perOp: rateOpBytes},
		conn, pwarm, prate, false)...)
	return rows
}
