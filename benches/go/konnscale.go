package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"konnectivity-goharness"
)

// --- konn-scale (issue 18.4, proxy-server side): many idle tunnels ----------
//
// One proxy-server, scaleAgents agents (each with an agent ID of its own,
// so the server spreads dials over them), N tunnels dialed through the
// server's Unix socket that each complete one exchange with a destination
// and then idle; meanwhile sequential dials measure the latency a new
// tunnel sees. Both implementations in turn, interleaved.
//
// The client is kube-apiserver's HTTP-CONNECT dialer, not the gRPC one:
// kube-apiserver's gRPC dialer makes a grpc-go ClientConn per tunnel, which
// costs the load generator itself around 100 KiB per tunnel (several GiB
// at 50,000, on a machine the proxies share). P5 measures the gRPC
// frontend's memory per tunnel at 10,000.

type scaleResult struct {
	serverRSS, agentsRSS float64 // MiB with the tunnels open
	perTunnel            float64 // server RSS growth per tunnel, KiB
	p50, p99             float64 // ms, while the tunnels idle
	p99Before            float64 // ms, before they were opened
	peak                 int64   // KiB, VmHWM of server + agents
}

func scaleGroup() []*row {
	n, agents := cfg.scaleTunnels, cfg.scaleAgents
	what := fmt.Sprintf("%d idle tunnels from %d agents, HTTP-CONNECT over UDS", n, agents)
	tmplRSS := row{id: "P11", workload: "proxy-server RSS with " + what, unit: "MiB", lowerBetter: true, anchorName: upstream, cpuOurs: -1, cpuAnchor: -1}
	tmplLat := row{id: "P11", workload: fmt.Sprintf("dial latency p99 (%d sequential dials, new tunnels) while %s stay open", cfg.dials, what), unit: "ms", lowerBetter: true, anchorName: upstream, cpuOurs: -1, cpuAnchor: -1}
	logf("P11 proxy-server with %s", what)
	// Upstream's server and 100 agents take several GiB at 50,000 tunnels.
	if avail := memAvailableMiB(); !*flagQuick && avail < 8192 {
		err := fmt.Errorf("only %d MiB of memory available; this workload needs about 8 GiB", avail)
		return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
	}
	// The destinations live in a child process with 8 listeners: one
	// agent reaches one listener from at most ~28,000 ephemeral ports.
	dp, err := startProc("destination", selfExe(), []string{"--dest-only", "--dest-plain=8"})
	if err != nil {
		return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
	}
	defer dp.Kill()
	l, _, err := dp.WaitLine(0, startPatience, "destination plain=")
	if err != nil {
		return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
	}
	dests := strings.Split(goharness.Field(l, "plains"), ",")
	var res [2][]scaleResult
	for r := range cfg.scaleRepeats {
		for k := range 2 {
			i := (k + r) % 2
			impl := []string{ours, upstream}[i]
			x, err := scaleOnce(impl, dests, n, agents)
			if err != nil {
				return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
			}
			res[i] = append(res[i], x)
			logf("   %s: server RSS %.0f MiB (%.1f KiB per tunnel), %d agents %.0f MiB; dial p50 %.3f ms, p99 %.3f ms while idle, p99 %.3f ms before",
				impl, x.serverRSS, x.perTunnel, agents, x.agentsRSS, x.p50, x.p99, x.p99Before)
		}
	}
	pick := func(i int, f func(scaleResult) float64) []float64 {
		var out []float64
		for _, x := range res[i] {
			out = append(out, f(x))
		}
		return out
	}
	last := func(i int) scaleResult { return res[i][len(res[i])-1] }
	rss, lat := tmplRSS, tmplLat
	rss.ours, rss.anchor = pick(0, func(x scaleResult) float64 { return x.serverRSS }), pick(1, func(x scaleResult) float64 { return x.serverRSS })
	lat.ours, lat.anchor = pick(0, func(x scaleResult) float64 { return x.p99 }), pick(1, func(x scaleResult) float64 { return x.p99 })
	for _, r := range []*row{&rss, &lat} {
		for _, x := range res[0] {
			r.rssOurs = max(r.rssOurs, x.peak)
		}
		for _, x := range res[1] {
			r.rssAnchor = max(r.rssAnchor, x.peak)
		}
	}
	rss.note = fmt.Sprintf("last repeat: server growth per tunnel ours %.1f KiB, upstream %.1f KiB; the %d agents' RSS in all ours %.0f MiB, upstream %.0f MiB; peak RSS column: server + agents",
		last(0).perTunnel, last(1).perTunnel, agents, last(0).agentsRSS, last(1).agentsRSS)
	lat.note = fmt.Sprintf("last repeat: p50 while idle ours %s ms, upstream %s ms; p99 before the idle tunnels were opened ours %s ms, upstream %s ms",
		num(last(0).p50), num(last(1).p50), num(last(0).p99Before), num(last(1).p99Before))
	return []*row{&rss, &lat}
}

// scaleOnce runs one implementation: server, agents, baseline dials, N
// idle tunnels, dials while they idle.
func scaleOnce(impl string, dests []string, n, agents int) (scaleResult, error) {
	var x scaleResult
	srv, uds, addrs, err := startServer(impl, "http-connect")
	if err != nil {
		return x, err
	}
	s := &subject{name: impl, procs: []*proc{srv}, uds: uds}
	var conns []net.Conn
	defer func() {
		// The proxies first: the clients' closes then end at once.
		s.stop()
		closeAll(conns)
	}()
	for a := range agents {
		ag, _, _, err := startAgentID(impl, addrs, fmt.Sprintf("bench-agent-%03d", a))
		if err != nil {
			return x, err
		}
		s.procs = append(s.procs, ag)
	}
	var next atomic.Uint64
	connect := connectUDS(uds)
	s.dial = func(ctx context.Context, _ string) (net.Conn, error) {
		return connect(ctx, dests[next.Add(1)%uint64(len(dests))])
	}
	if _, _, _, err := dialLatency(s, "", max(cfg.dials/4, 10)); err != nil { // warm-up
		return x, err
	}
	if _, x.p99Before, _, err = dialLatency(s, "", cfg.dials); err != nil {
		return x, err
	}
	serverRSS := func() int64 { rss, _ := memKiB(goharness.Tree(srv.Pid())); return rss }
	before := serverRSS()
	_, _, conns, err = idleMemory(s, "", n)
	if err != nil {
		return x, err
	}
	after := serverRSS()
	all, _ := s.mem()
	x.serverRSS = float64(after) / 1024
	x.agentsRSS = float64(all-after) / 1024
	x.perTunnel = float64(after-before) / float64(n)
	if x.p50, x.p99, _, err = dialLatency(s, "", cfg.dials); err != nil {
		return x, err
	}
	if err := s.alive(); err != nil {
		return x, err
	}
	_, x.peak = s.mem()
	return x, nil
}

func memAvailableMiB() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kib / 1024
		}
	}
	return 0
}
