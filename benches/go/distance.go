package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"konnectivity-goharness"
)

// --- P10: throughput over distance -------------------------------------------
//
// The server↔agent link (and the tunnel-agent↔nodeport-proxy link) runs
// through a delayRelay: round-trip times of 0, 10, 50 and 100 ms, one and
// 16 tunnels, download and upload, for every pairing of our and upstream's
// server and agent in one run, interleaved. Then a stalled-readers workload:
// many tunnels whose destinations stop reading while others transfer.

type distanceSizes struct {
	rtts      []time.Duration
	one       int64 // bytes of the 1-tunnel transfers
	many      int64 // bytes in all of the many-tunnel transfers
	manyConns int
	repeats   int
	limit     time.Duration
	// stalled readers
	stalled      int
	stalledRTT   time.Duration
	others       int
	othersSize   int64
	othersLimit  time.Duration
	stalledLimit time.Duration
}

func distanceCfg() distanceSizes {
	dc := distanceSizesFor(*flagQuick)
	// Debugging aid: BENCH_P10_RTTS=10ms,50ms runs only those.
	if v := os.Getenv("BENCH_P10_RTTS"); v != "" {
		dc.rtts = nil
		for _, s := range strings.Split(v, ",") {
			if d, err := time.ParseDuration(strings.TrimSpace(s)); err == nil {
				dc.rtts = append(dc.rtts, d)
			}
		}
	}
	// BENCH_P10_REPEATS=5: more interleaved repeats, for cells whose
	// pairings are within noise of each other.
	if v, err := strconv.Atoi(os.Getenv("BENCH_P10_REPEATS")); err == nil && v > 0 {
		dc.repeats = v
	}
	// Debugging aid (and for a shared machine): BENCH_P10_SCALE=2 halves
	// every transfer.
	if v, err := strconv.Atoi(os.Getenv("BENCH_P10_SCALE")); err == nil && v > 1 {
		dc.one /= int64(v)
		dc.many /= int64(v)
		dc.othersSize /= int64(v)
	}
	return dc
}

func distanceSizesFor(quick bool) distanceSizes {
	if quick {
		return distanceSizes{
			rtts: []time.Duration{0, 10 * time.Millisecond}, one: 4 * mib, many: 8 * mib, manyConns: 16,
			repeats: 1, limit: 60 * time.Second,
			stalled: 50, stalledRTT: 10 * time.Millisecond, others: 4, othersSize: 8 * mib,
			othersLimit: 20 * time.Second, stalledLimit: 20 * time.Second,
		}
	}
	return distanceSizes{
		rtts: []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
		one:  256 * mib, many: 512 * mib, manyConns: 16, repeats: 3, limit: 180 * time.Second,
		stalled: 1000, stalledRTT: 10 * time.Millisecond, others: 16, othersSize: 256 * mib,
		othersLimit: 60 * time.Second, stalledLimit: 60 * time.Second,
	}
}

type pairing struct{ server, agent string }

var pairings = []pairing{{ours, ours}, {ours, upstream}, {upstream, ours}, {upstream, upstream}}

func (p pairing) String() string {
	switch {
	case p.server == ours && p.agent == ours:
		return "ours↔ours"
	case p.server == upstream && p.agent == upstream:
		return "upstream↔upstream"
	default:
		return fmt.Sprintf("%s server + %s agent", p.server, p.agent)
	}
}

// startDistant starts a server of p.server and an agent of p.agent whose
// link to the server runs through a relay adding rtt; clients use
// HTTP-CONNECT over the server's Unix socket (kube-apiserver's
// `proxyProtocol: HTTPConnect`).
func startDistant(p pairing, rtt time.Duration) (*subject, *goharness.DelayRelay, error) {
	srv, uds, addrs, err := startServer(p.server, "http-connect")
	if err != nil {
		return nil, nil, err
	}
	relay, err := goharness.StartDelayRelay(addrs["agent"], rtt)
	if err != nil {
		srv.Kill()
		return nil, nil, err
	}
	via := map[string]string{"agent": relay.Addr(), "health": addrs["health"]}
	ag, agentHealth, agentAdmin, err := startAgent(p.agent, via)
	if err != nil {
		relay.Stop()
		srv.Kill()
		return nil, nil, err
	}
	s := &subject{name: p.String(), procs: []*proc{srv, ag}, uds: uds, serverHealth: addrs["health"],
		agentHealth: agentHealth, serverAdmin: addrs["admin"], agentAdmin: agentAdmin, dial: connectUDS(uds)}
	return s, relay, nil
}

// measuredRTT is what a ping-pong through a relay of each configured RTT
// took, for the row notes.
func measuredRTTs(rtts []time.Duration) map[time.Duration]time.Duration {
	out := map[time.Duration]time.Duration{}
	for _, rtt := range rtts {
		r, err := goharness.StartDelayRelay(dest.plainAddr(), rtt)
		if err != nil {
			continue
		}
		if m, err := goharness.MeasureRTT(r.Addr(), 7, holdExchange); err == nil {
			out[rtt] = m
			logf("   relay set to %s RTT: ping-pong through it %s", rtt, goharness.FormatRTT(m))
		}
		r.Stop()
	}
	return out
}

// distanceSummary is the P10 table in the shape, appended to the
// report: median MiB/s per pairing.
var distanceSummary strings.Builder

func distanceGroup() []*row {
	dc := distanceCfg()
	saved := cfg.repeats
	cfg.repeats = dc.repeats
	defer func() { cfg.repeats = saved }()
	logf("P10 throughput over distance (delay relay on the server↔agent link): 1 tunnel %d MiB, %d tunnels %d MiB in all, %d repeats; stalled readers: %d stalled, %d others × %d MiB",
		dc.one/mib, dc.manyConns, dc.many/mib, dc.repeats, dc.stalled, dc.others, dc.othersSize/mib)
	measured := measuredRTTs(dc.rtts)
	var rows []*row
	type key struct {
		rtt   time.Duration
		conns int
		dir   byte
	}
	med := map[key][]float64{}
	// Debugging aid: BENCH_P10_SKIP=matrix,tunnels,stalled leaves those parts out.
	skip := os.Getenv("BENCH_P10_SKIP")
	// Debugging aids: BENCH_P10_PAIRINGS=1,3 keeps those pairings (indexes
	// into pairings; keep 3, the anchor, last); BENCH_P10_CELLS=16up,1do
	// keeps those tunnel counts and directions (do: download, up: upload).
	if v := os.Getenv("BENCH_P10_PAIRINGS"); v != "" {
		var keep []pairing
		for _, f := range strings.Split(v, ",") {
			if i, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && i >= 0 && i < len(pairings) {
				keep = append(keep, pairings[i])
			}
		}
		if len(keep) > 1 {
			pairings = keep
		}
	}
	cells := os.Getenv("BENCH_P10_CELLS")
	matrix := dc.rtts
	if strings.Contains(skip, "matrix") {
		matrix = nil
	}
	for _, rtt := range matrix {
		var subs []*subject
		var relays []*goharness.DelayRelay
		var startErr error
		for _, p := range pairings {
			s, r, err := startDistant(p, rtt)
			if err != nil {
				startErr = err
				break
			}
			subs = append(subs, s)
			relays = append(relays, r)
		}
		stopAll := func() {
			for _, s := range subs {
				s.stop()
			}
			for _, r := range relays {
				r.Stop()
			}
			dest.closeAll()
		}
		if startErr != nil {
			stopAll()
			rows = append(rows, errRow(row{id: "P10", workload: fmt.Sprintf("%s RTT", rtt)}, startErr))
			continue
		}
		d := dest.plainAddr()
		for _, conns := range []int{1, dc.manyConns} {
			size := dc.one
			if conns > 1 {
				size = dc.many
			}
			for _, dir := range []byte{opDownload, opUpload} {
				if cells != "" && !strings.Contains(","+cells+",", fmt.Sprintf(",%d%s,", conns, dirName(dir)[:2])) {
					continue
				}
				what := fmt.Sprintf("%d tunnel%s bulk %s, %s RTT on the server↔agent link (relay; ping-pong %s), HTTP-CONNECT over UDS",
					conns, plural(conns), dirName(dir), rtt, goharness.FormatRTT(measured[rtt]))
				tmpl := row{id: "P10", workload: what, unit: "MiB/s", aim: "≥ 1.0×", ratioMin: 1}
				logf("P10 %s", what)
				once := func(s *subject) (float64, int64, error) {
					defer traceWindows(s)()
					return bulk(s, d, conns, size, dir, dc.limit)
				}
				warm := func(s *subject) (float64, int64, error) {
					return bulk(s, d, conns, max(size/8, int64(conns)*(1<<20)), dir, dc.limit)
				}
				samples, use, peaks, err := compare("P10 "+what, subs, warm, once)
				if err != nil {
					rows = append(rows, errRow(tmpl, err))
					continue
				}
				k := key{rtt, conns, dir}
				for i := range subs {
					med[k] = append(med[k], median(samples[i]))
				}
				up := len(subs) - 1
				for i := 0; i < up; i++ {
					r := tmpl
					r.workload = subs[i].name + ": " + what
					r.ours, r.anchor = samples[i], samples[up]
					r.anchorName = subs[up].name
					r.cpuOurs, r.cpuAnchor = use[i].cpuPerGiB(), use[up].cpuPerGiB()
					r.rssOurs, r.rssAnchor = peaks[i], peaks[up]
					logf("   %s %s MiB/s, %s %s MiB/s, ratio %s", subs[i].name, num(median(r.ours)), subs[up].name, num(median(r.anchor)), num(r.ratio()))
					rows = append(rows, &r)
				}
			}
		}
		stopAll()
	}
	if !strings.Contains(skip, "tunnels") {
		rows = append(rows, tunnelDistance(dc, measured)...)
	}
	if !strings.Contains(skip, "stalled") {
		rows = append(rows, stalledReaders(dc)...)
	}

	// The summary in the shape.
	b := &distanceSummary
	fmt.Fprintf(b, "\n### P10 at a glance (median MiB/s of %d interleaved repeats; HTTP-CONNECT over UDS; relay ping-pong:", dc.repeats)
	for _, rtt := range dc.rtts {
		fmt.Fprintf(b, " %s → %s", rtt, goharness.FormatRTT(measured[rtt]))
	}
	b.WriteString(")\n\n| RTT | tunnels | direction |")
	for _, p := range pairings {
		fmt.Fprintf(b, " %s |", p)
	}
	b.WriteString(" worst ratio to upstream↔upstream |\n|---|---|---|")
	for range pairings {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, rtt := range dc.rtts {
		for _, conns := range []int{1, dc.manyConns} {
			for _, dir := range []byte{opDownload, opUpload} {
				v := med[key{rtt, conns, dir}]
				if len(v) != len(pairings) {
					continue
				}
				dn := "download"
				if dir == opUpload {
					dn = "upload"
				}
				fmt.Fprintf(b, "| %s | %d | %s |", rtt, conns, dn)
				worst := 1e9
				for i, x := range v {
					fmt.Fprintf(b, " %s |", num(x))
					if i < len(v)-1 {
						worst = min(worst, x/v[len(v)-1])
					}
				}
				fmt.Fprintf(b, " %.2f× |\n", worst)
			}
		}
	}
	return rows
}

// holdExchange is one request and answer with the destination: a hold
// ('H') is answered with one byte at once.
func holdExchange(c net.Conn) error {
	if _, err := c.Write(header(opHold, 0)); err != nil {
		return err
	}
	return readAck(c)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// tunnelDistance: HTTP/2 CONNECT tunnels of tunnel-agent → nodeport-proxy
// with the relay on that link, against a plain TCP relay (NodePort) over
// the same delay, which no window holds back: the link's ceiling here.
func tunnelDistance(dc distanceSizes, measured map[time.Duration]time.Duration) []*row {
	var rows []*row
	for _, rtt := range dc.rtts {
		np, pp, err := startNodeportProxy(dest.tlsAddr(), dest.plainAddr())
		if err != nil {
			rows = append(rows, errRow(row{id: "P10", workload: "nodeport-proxy"}, err))
			continue
		}
		tr, err := goharness.StartDelayRelay(goharness.Loopback(pp.tunnel), rtt)
		if err != nil {
			np.stop()
			rows = append(rows, errRow(row{id: "P10", workload: "relay"}, err))
			continue
		}
		nr, err := goharness.StartDelayRelay(goharness.Loopback(pp.nodePort), rtt)
		if err != nil {
			tr.Stop()
			np.stop()
			rows = append(rows, errRow(row{id: "P10", workload: "relay"}, err))
			continue
		}
		ta, listen, err := startTunnelAgent(tr.Port(), plainAuthority)
		if err != nil {
			nr.Stop()
			tr.Stop()
			np.stop()
			rows = append(rows, errRow(row{id: "P10", workload: "tunnel-agent"}, err))
			continue
		}
		tun := &subject{name: "ours tunnel-agent → nodeport-proxy (HTTP/2 CONNECT)", procs: []*proc{ta, np.procs[0]}, dial: tcpTo(goharness.Loopback(listen))}
		plain := &subject{name: "NodePort TCP relay over the same link", procs: []*proc{np.procs[0]}, dial: tcpTo(nr.Addr())}
		d := dest.plainAddr()
		for _, conns := range []int{1, dc.manyConns} {
			size := dc.one
			if conns > 1 {
				size = dc.many
			}
			for _, dir := range []byte{opDownload, opUpload} {
				what := fmt.Sprintf("%d tunnel%s bulk %s, %s RTT on the tunnel-agent↔nodeport-proxy link (relay; ping-pong %s)", conns, plural(conns), dirName(dir), rtt, goharness.FormatRTT(measured[rtt]))
				rows = append(rows, run(row{id: "P10", workload: what, unit: "MiB/s", anchorName: "NodePort TCP relay over the same link"},
					[]*subject{tun, plain},
					func(s *subject) (float64, int64, error) {
						return bulk(s, d, conns, max(size/8, int64(conns)*(1<<20)), dir, dc.limit)
					},
					func(s *subject) (float64, int64, error) { return bulk(s, d, conns, size, dir, dc.limit) }, true)...)
			}
		}
		ta.Kill()
		nr.Stop()
		tr.Stop()
		np.stop()
		dest.closeAll()
	}
	return rows
}

// stalledReaders: dc.stalled tunnels upload into destinations that stop
// reading; once none of them moves any more, dc.others tunnels upload
// beside them. Reports the proxies' RSS growth against the budget and the
// share of their solo throughput the others keep.
func stalledReaders(dc distanceSizes) []*row {
	tmpl := row{id: "P10", workload: fmt.Sprintf("stalled readers: %d tunnels upload into destinations that stopped reading; %d others upload %d MiB beside them; %s RTT; share of solo throughput kept", dc.stalled, dc.others, dc.othersSize/mib, dc.stalledRTT),
		unit: "%", anchorName: "upstream↔upstream", aim: "≥ 95 % kept", oursMin: 95}
	logf("P10 %s", tmpl.workload)
	var kept [2][]float64
	var notes [2]string
	var peaks [2]int64
	for i, p := range []pairing{{ours, ours}, {upstream, upstream}} {
		s, relay, err := startDistant(p, dc.stalledRTT)
		if err != nil {
			return []*row{errRow(tmpl, err)}
		}
		k, note, err := stalledOnce(s, dc)
		_, peaks[i] = s.mem()
		s.stop()
		relay.Stop()
		releaseSinks()
		dest.closeAll()
		if err != nil {
			return []*row{errRow(tmpl, err)}
		}
		kept[i] = append(kept[i], k)
		notes[i] = note
		logf("   %s: %.0f %% kept; %s", p, k, note)
	}
	r := tmpl
	r.ours, r.anchor = kept[0], kept[1]
	r.cpuOurs, r.cpuAnchor = -1, -1
	r.rssOurs, r.rssAnchor = peaks[0], peaks[1]
	r.note = "ours: " + notes[0] + "; upstream: " + notes[1]
	return []*row{&r}
}

func stalledOnce(s *subject, dc distanceSizes) (float64, string, error) {
	d := dest.plainAddr()
	solo, _, err := bulk(s, d, dc.others, dc.othersSize, opUpload, dc.othersLimit)
	if err != nil {
		return 0, "", fmt.Errorf("solo: %w", err)
	}
	base, _ := s.mem()
	var perProc []int64
	for _, p := range s.procs {
		r, _ := memKiB(goharness.Tree(p.Pid()))
		perProc = append(perProc, r)
	}
	conns, err := dialAll(s, d, dc.stalled, 120*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer closeAll(conns)
	var progress atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Write(header(opSink, 0)); err != nil {
				return
			}
			buf := payload[:chunk]
			for {
				_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				n, err := c.Write(buf)
				progress.Add(int64(n))
				if err != nil {
					return // blocked (deadline) or closed
				}
			}
		}()
	}
	// Wait until the stalled uploads stop moving.
	last, lastChange := int64(-1), time.Now()
	deadline := time.Now().Add(dc.stalledLimit)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if v := progress.Load(); v != last {
			last, lastChange = v, time.Now()
		} else if time.Since(lastChange) > 700*time.Millisecond {
			break
		}
	}
	stalledAt, _ := s.mem()
	var growth []string
	for i, p := range s.procs {
		r, _ := memKiB(goharness.Tree(p.Pid()))
		growth = append(growth, fmt.Sprintf("%s +%.0f MiB", p.Name, float64(r-perProc[i])/1024))
	}
	parked := parkedBytes(s)
	beside, moved, err := bulk(s, d, dc.others, dc.othersSize, opUpload, dc.othersLimit)
	besideNote := fmt.Sprintf("%.0f MiB/s", beside)
	if err != nil {
		// Did not finish: the rate of what moved within the limit.
		beside = float64(moved) / mib / dc.othersLimit.Seconds()
		besideNote = fmt.Sprintf("only %.0f of %d MiB within %s", float64(moved)/mib, dc.othersSize/mib, dc.othersLimit)
	}
	wg.Wait()
	closeAll(conns)
	note := fmt.Sprintf("solo %.0f MiB/s, beside the stalled %s; the stalled tunnels took %.0f MiB from their clients; RSS growth while stalled %.0f MiB (%s)%s; %s",
		solo, besideNote, float64(last)/mib, float64(stalledAt-base)/1024, strings.Join(growth, ", "), parked, givenBack(s, perProc))
	return 100 * beside / solo, note, nil
}

// givenBack is each process's lowest RSS over base within 15 s after the
// stalled tunnels closed: whether what the load took is given back
// (jemalloc returns freed pages after its 10 s decay).
func givenBack(s *subject, base []int64) string {
	low := make([]int64, len(s.procs))
	for i := range low {
		low[i] = math.MaxInt64
	}
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for i, p := range s.procs {
			if r, _ := memKiB(goharness.Tree(p.Pid())); r > 0 {
				low[i] = min(low[i], r)
			}
		}
	}
	var parts []string
	for i, p := range s.procs {
		if low[i] != math.MaxInt64 {
			parts = append(parts, fmt.Sprintf("%s %+.0f MiB", p.Name, float64(low[i]-base[i])/1024))
		}
	}
	return "after they closed, lowest RSS within 15 s over that before them: " + strings.Join(parts, ", ")
}

// parkedBytes reads our flow-control metrics (ours only; upstream has none).
func parkedBytes(s *subject) string {
	var parts []string
	for _, m := range []struct{ addr, name string }{
		{s.serverAdmin, "konnectivity_network_proxy_server_flow_control_parked_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_parked_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_reserved_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_budget_bytes"},
	} {
		if v, err := gaugeValue(m.addr, m.name); err == nil {
			parts = append(parts, fmt.Sprintf("%s %.1f MiB", strings.TrimPrefix(m.name, "konnectivity_network_proxy_"), v/mib))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, ", ")
}

// gaugeValue reads one unlabelled gauge from a /metrics endpoint.
func gaugeValue(addr, name string) (float64, error) {
	return gaugeAt(addr, "/metrics", name)
}

// gaugeAt reads one unlabelled gauge from the Prometheus text at path.
func gaugeAt(addr, path, name string) (float64, error) {
	body, err := get200(addr, path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				return 0, err
			}
			return v, nil
		}
	}
	return 0, errors.New(addr + " has no " + name)
}

// Sinks ('N') hold until releaseSinks, then read to the end.
var (
	sinkMu      sync.Mutex
	sinkRelease = make(chan struct{})
)

func currentSinkRelease() chan struct{} {
	sinkMu.Lock()
	defer sinkMu.Unlock()
	return sinkRelease
}

func releaseSinks() {
	sinkMu.Lock()
	close(sinkRelease)
	sinkRelease = make(chan struct{})
	sinkMu.Unlock()
}

// traceWindows (debugging aid, BENCH_P10_TRACE=1) samples our window
// gauges every 100 ms while a transfer runs and logs their largest values
// when the returned stop is called.
func traceWindows(s *subject) func() {
	if os.Getenv("BENCH_P10_TRACE") == "" || (s.serverAdmin == "" && s.agentAdmin == "") {
		return func() {}
	}
	all := []struct{ addr, name string }{
		{s.serverAdmin, "konnectivity_network_proxy_server_flow_control_window_bytes"},
		{s.serverAdmin, "konnectivity_network_proxy_server_http2_window_bytes"},
		{s.serverAdmin, "konnectivity_network_proxy_server_flow_control_parked_bytes"},
		{s.serverAdmin, "konnectivity_network_proxy_server_flow_control_reserved_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_window_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_http2_window_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_parked_bytes"},
		{s.agentAdmin, "konnectivity_network_proxy_agent_flow_control_reserved_bytes"},
	}
	// Only our processes have these gauges (either side may be upstream's).
	var names []struct{ addr, name string }
	for _, n := range all {
		if n.addr != "" {
			names = append(names, n)
		}
	}
	peak := make([]float64, len(names))
	var series [][]float64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			row := make([]float64, len(names))
			for i, n := range names {
				if v, err := gaugeValue(n.addr, n.name); err == nil {
					row[i] = v / mib
					peak[i] = max(peak[i], v/mib)
				}
			}
			series = append(series, row)
		}
	}()
	return func() {
		close(stop)
		<-done
		var parts []string
		for i, n := range names {
			parts = append(parts, fmt.Sprintf("%s %.1f", strings.TrimPrefix(n.name, "konnectivity_network_proxy_"), peak[i]))
		}
		logf("   trace %s peaks (MiB): %s", s.name, strings.Join(parts, ", "))
		for i, r := range series {
			if i%5 == 0 {
				logf("   trace %s t=%.1fs %v", s.name, float64(i)/10, r)
			}
		}
	}
}
