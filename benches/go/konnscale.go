package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	konnproto "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"konnectivity-goharness"
)

// --- konn-scale (issue 18.4, proxy-server side): many idle tunnels ----------
//
// One proxy-server (gRPC frontend), scaleAgents agents (each with an agent
// ID of its own, so the server spreads dials over them), N tunnels that
// each complete one exchange with a destination and then idle; meanwhile
// kube-apiserver's own dialer (a new Unix-socket gRPC connection per dial)
// measures the latency a new tunnel sees. Both implementations in turn,
// interleaved.
//
// The idle tunnels are Proxy streams multiplexed over scaleConns gRPC
// connections, not one connection each as kube-apiserver opens them: a
// process may hold at most 20,000 open files here (the hard limit, and the
// harness may not raise it: no CAP_SYS_RESOURCE), and a server holding
// 50,000 kube-apiserver tunnels holds 50,000 sockets. P5 measures what one
// connection per tunnel costs, at 10,000. The destinations' 50,000 sockets
// are spread over scaleDestProcs child processes for the same reason.

const (
	scaleConns     = 100
	scaleDestProcs = 4
)

type scaleResult struct {
	serverRSS, agentsRSS float64 // MiB with the tunnels open
	perTunnel            float64 // server RSS growth per tunnel, KiB
	p50, p99             float64 // ms, while the tunnels idle
	p99Before            float64 // ms, before they were opened
	peak                 int64   // KiB, VmHWM of server + agents
}

func scaleGroup() []*row {
	n, agents := cfg.scaleTunnels, cfg.scaleAgents
	what := fmt.Sprintf("%d idle tunnels from %d agents (gRPC frontend, %d streams on each of %d connections)", n, agents, n/scaleConns, scaleConns)
	tmplRSS := row{id: "P11", workload: "proxy-server RSS with " + what, unit: "MiB", lowerBetter: true, anchorName: upstream, cpuOurs: -1, cpuAnchor: -1}
	tmplLat := row{id: "P11", workload: fmt.Sprintf("dial latency p99 (%d sequential dials, kube-apiserver's gRPC dialer) while %s stay open", cfg.dials, what), unit: "ms", lowerBetter: true, anchorName: upstream, cpuOurs: -1, cpuAnchor: -1}
	logf("P11 proxy-server with %s", what)
	// Upstream's server and 100 agents take several GiB at 50,000 tunnels.
	if avail := memAvailableMiB(); !*flagQuick && avail < 8192 {
		err := fmt.Errorf("only %d MiB of memory available; this workload needs about 8 GiB", avail)
		return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
	}
	// Destinations: scaleDestProcs child processes with two listeners
	// each (one agent reaches one listener from at most ~28,000 ephemeral
	// ports).
	var dests []string
	for range scaleDestProcs {
		dp, l, err := startDestProc("--dest-plain=2")
		if err != nil {
			return []*row{errRow(tmplRSS, err), errRow(tmplLat, err)}
		}
		defer dp.Kill()
		dests = append(dests, strings.Split(goharness.Field(l, "plains"), ",")...)
	}
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
	srv, uds, addrs, err := startServer(impl, "grpc")
	if err != nil {
		return x, err
	}
	s := &subject{name: impl, procs: []*proc{srv}, uds: uds}
	var idle *idleStreams
	defer func() {
		// The proxies first: the clients' closes then end at once.
		s.stop()
		idle.close()
	}()
	for a := range agents {
		ag, _, _, err := startAgentID(impl, addrs, fmt.Sprintf("bench-agent-%03d", a))
		if err != nil {
			return x, err
		}
		s.procs = append(s.procs, ag)
	}
	var next atomic.Uint64
	single := grpcUDS(uds)
	s.dial = func(ctx context.Context, _ string) (net.Conn, error) {
		return single(ctx, dests[next.Add(1)%uint64(len(dests))])
	}
	if _, _, _, err := dialLatency(s, "", max(cfg.dials/4, 10)); err != nil { // warm-up
		return x, err
	}
	if _, x.p99Before, _, err = dialLatency(s, "", cfg.dials); err != nil {
		return x, err
	}
	serverRSS := func() int64 { rss, _ := memKiB(goharness.Tree(srv.Pid())); return rss }
	before := serverRSS()
	if idle, err = openIdleStreams(uds, dests, n, scaleConns); err != nil {
		return x, fmt.Errorf("%s: %w", impl, err)
	}
	if err := s.alive(); err != nil {
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

// idleStreams are Proxy streams multiplexed over a few gRPC connections,
// each dialed to a destination that answered one 'H' exchange.
type idleStreams struct {
	conns   []*grpc.ClientConn
	cancels []context.CancelFunc
}

func (t *idleStreams) close() {
	if t == nil {
		return
	}
	for _, c := range t.cancels {
		c()
	}
	for _, c := range t.conns {
		_ = c.Close()
	}
}

// openIdleStreams opens n tunnels over conns gRPC connections to the
// server's Unix socket (64 dials in flight, bounded to 5 minutes in all):
// DIAL_REQ, DIAL_RSP, a 'H' header as DATA, the destination's 'K' back.
func openIdleStreams(uds string, dests []string, n, conns int) (*idleStreams, error) {
	t := &idleStreams{}
	for range conns {
		cc, err := grpc.NewClient("passthrough:///"+uds,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", uds)
			}),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.close()
			return nil, err
		}
		t.conns = append(t.conns, cc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var firstErr error
	boundedEach(ctx, n, 64, func(i int) {
		cancelStream, err := holdStream(ctx, t.conns[i%len(t.conns)], dests[i%len(dests)])
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			return
		}
		t.cancels = append(t.cancels, cancelStream)
	})
	if firstErr == nil && len(t.cancels) < n {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		err := fmt.Errorf("%d of %d idle tunnels opened: %w", len(t.cancels), n, firstErr)
		t.close()
		return nil, err
	}
	return t, nil
}

// holdStream opens one Proxy stream on cc, dials dest through it and
// completes one 'H' exchange; the stream stays open until cancelled.
func holdStream(ctx context.Context, cc *grpc.ClientConn, dest string) (context.CancelFunc, error) {
	sctx, cancel := context.WithCancel(context.Background())
	fail := func(err error) (context.CancelFunc, error) {
		cancel()
		return nil, err
	}
	// The stream outlives ctx (it idles until cancelled); ctx bounds the
	// exchange.
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	stream, err := konnproto.NewProxyServiceClient(cc).Proxy(sctx)
	if err != nil {
		return fail(err)
	}
	random := rand.Int64()
	if err := stream.Send(&konnproto.Packet{Type: konnproto.PacketType_DIAL_REQ, Payload: &konnproto.Packet_DialRequest{
		DialRequest: &konnproto.DialRequest{Protocol: "tcp", Address: dest, Random: random}}}); err != nil {
		return fail(err)
	}
	pkt, err := stream.Recv()
	if err != nil {
		return fail(fmt.Errorf("waiting for DIAL_RSP: %w", err))
	}
	rsp := pkt.GetDialResponse()
	if pkt.Type != konnproto.PacketType_DIAL_RSP || rsp == nil || rsp.Random != random || rsp.Error != "" {
		return fail(fmt.Errorf("dial %s: unexpected answer %v", dest, pkt))
	}
	if err := stream.Send(&konnproto.Packet{Type: konnproto.PacketType_DATA, Payload: &konnproto.Packet_Data{
		Data: &konnproto.Data{ConnectID: rsp.ConnectID, Data: header(opHold, 0)}}}); err != nil {
		return fail(err)
	}
	if pkt, err = stream.Recv(); err != nil {
		return fail(fmt.Errorf("waiting for the destination's ack: %w", err))
	}
	if d := pkt.GetData(); d == nil || string(d.Data) != "K" {
		return fail(fmt.Errorf("dial %s: %v instead of the destination's ack", dest, pkt))
	}
	return cancel, nil
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
