package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"konnectivity-goharness"
)

// --- np-mem (issue 15.5): nodeport-proxy memory per connection --------------
//
// One nodeport-proxy (release build, default flags but a per-listener cap
// above the largest size measured) and a loopback echo backend in a child
// process. For each kind of connection, N concurrent long-lived
// connections are opened in steps (1,000, 5,000, 10,000); each relays one
// 512-byte echo through the proxy and then stays open. At each step the
// proxy's RSS (VmRSS) and its allocator's bytes in use
// (envoy_server_memory_allocated, jemalloc's stats.allocated) are read and
// set against the same figures after 64 warm-up connections were opened and
// closed; then every connection is closed and the RSS is watched until it is
// back near where it started (memory given back).
//
// The proxy holds two sockets per connection (client and upstream) except
// on multiplexed HTTP/2 connections, and this machine's open-files hard
// limit is 20,000, so one-socket-per-connection kinds stop at what fits.
// The harness holds the client ends (or the h2c connections), the child the
// backend ends.

// npMemSummary is the np-mem table, appended to the report.
var npMemSummary strings.Builder

// npMemStreamsPerConn: tunnels per h2c connection in the multiplexed kind
// (tunnel-agent multiplexes every tunnel of a node over one connection; a
// seed sees one connection per node).
const npMemStreamsPerConn = 100

// npMemEcho is what each connection relays once before it idles.
const npMemEcho = 512

type npMemKind struct {
	name string
	// opener returns a function that opens connection i.
	opener func(pp npPorts) (open func(ctx context.Context, i int) (io.ReadWriteCloser, error), closeAll func())
	// sockets: the proxy's sockets per connection.
	sockets float64
}

type npMemStep struct {
	n                 int
	rssKiB, allocKiB  float64 // growth per connection
	rssMiB            float64 // the proxy's RSS with n open
	openSecs          float64
	given             string // after close (last step only)
	rssAfterMiB, base float64
}

func npMemSizes() []int {
	spec := cmp.Or(*flagNPMem, "1000,5000,10000")
	if *flagQuick && *flagNPMem == "" {
		spec = "200,500"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fatalf("--np-mem-sizes: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out
}

func npMemGroup() []*row {
	sizes := npMemSizes()
	largest := sizes[len(sizes)-1]
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	kinds := []npMemKind{
		{name: fmt.Sprintf("HTTP/2 CONNECT, %d tunnels per h2c connection", npMemStreamsPerConn), opener: h2Opener(npMemStreamsPerConn), sockets: 1 + 1.0/npMemStreamsPerConn},
		{name: "HTTP/2 CONNECT, one tunnel per h2c connection", opener: h2Opener(1), sockets: 2},
		{name: "HTTP/1.1 CONNECT", opener: tcpOpener(func(pp npPorts) dialFunc { return httpConnectTCP(goharness.Loopback(pp.tunnel), plainAuthority) }), sockets: 2},
		{name: "SNI passthrough (TLS to the backend)", opener: tcpOpener(func(pp npPorts) dialFunc { return withTLS(tcpTo(goharness.Loopback(pp.sni)), pki.clientTLS()) }), sockets: 2},
		{name: "NodePort TCP", opener: tcpOpener(func(pp npPorts) dialFunc { return tcpTo(goharness.Loopback(pp.nodePort)) }), sockets: 2},
	}
	if *flagNPMemKind != "" {
		var picked []npMemKind
		for _, k := range kinds {
			for _, w := range strings.Split(*flagNPMemKind, ",") {
				if w = strings.TrimSpace(w); w != "" && strings.Contains(k.name, w) {
					picked = append(picked, k)
					break
				}
			}
		}
		if len(picked) == 0 {
			fatalf("--np-mem-kinds %q names no kind of connection", *flagNPMemKind)
		}
		kinds = picked
	}
	tmpl := row{id: "NPM", workload: "nodeport-proxy memory per connection"}
	dp, l, err := startDestProc("--dest-cert", pki.DestCert, "--dest-key", pki.DestKey)
	if err != nil {
		return []*row{errRow(tmpl, err)}
	}
	defer dp.Kill()
	plainDest, tlsDest := goharness.Field(l, "plain"), goharness.Field(l, "tls")
	b := &npMemSummary
	fmt.Fprintf(b, "\n### NPM: nodeport-proxy memory per concurrent connection (issue 15.5)\n\n")
	fmt.Fprintf(b, "One nodeport-proxy (default flags, `-max-connections-per-listener=%d`, `-max-connections-per-cluster=0`), a loopback echo backend in a child process; each connection relays one %d-byte echo, then stays open. Growth is over the proxy after %d warm-up connections were opened and closed (RSS there: see the first column). Open-files hard limit %d: the proxy holds two sockets per unmultiplexed connection.\n\n", largest+1000, npMemEcho, 64, lim.Max)
	fmt.Fprintf(b, "| Connections | N open | proxy RSS before → with N open | RSS growth per connection | allocator bytes in use per connection | time to open this step | after all closed |\n|---|---|---|---|---|---|---|\n")
	for _, k := range kinds {
		// Two sockets per connection in the proxy, and 200 for the rest.
		fit := int((float64(lim.Max) - 200) / k.sockets)
		var ns []int
		for _, n := range sizes {
			ns = append(ns, min(n, fit))
		}
		logf("np-mem %s: %v", k.name, ns)
		steps, err := npMemOnce(k, tlsDest, plainDest, ns, largest+1000)
		dest.closeAll()
		if err != nil {
			fmt.Fprintf(b, "| %s | error: %s | | | | | |\n", k.name, strings.ReplaceAll(err.Error(), "|", "/"))
			failures++
			continue
		}
		for i, s := range steps {
			after := ""
			if i == len(steps)-1 {
				after = s.given
			}
			fmt.Fprintf(b, "| %s | %d | %.1f → %.1f MiB | %.1f KiB | %.1f KiB | %.1f s | %s |\n", k.name, s.n, s.base, s.rssMiB, s.rssKiB, s.allocKiB, s.openSecs, after)
			logf("   %d open: RSS %.1f MiB, %.1f KiB per connection (allocated %.1f KiB)", s.n, s.rssMiB, s.rssKiB, s.allocKiB)
		}
	}
	return nil
}

// npMemOnce runs one kind on a fresh proxy, through the sizes ns.
func npMemOnce(k npMemKind, tlsDest, plainDest string, ns []int, limit int) ([]npMemStep, error) {
	// Every connection goes to one cluster: its circuit breaker
	// (-max-connections-per-cluster, 4096) is off here.
	np, pp, err := startNodeportProxy(tlsDest, plainDest, "-max-connections-per-listener", strconv.Itoa(limit), "-max-connections-per-cluster", "0")
	if err != nil {
		return nil, err
	}
	defer np.stop()
	pid := []int{np.procs[0].Pid()}
	rss := func() float64 { r, _ := memKiB(pid); return float64(r) }
	alloc := func() float64 {
		v, _ := gaugeAt(goharness.Loopback(pp.stats), "/stats/prometheus", "envoy_server_memory_allocated")
		return v / 1024
	}
	open, closeClients := k.opener(pp)
	var mu sync.Mutex
	var conns []io.ReadWriteCloser
	closeConns := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		conns = nil
		closeClients()
	}
	defer closeConns()
	openTo := func(from, to int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var firstE error
		boundedEach(ctx, to-from, 64, func(j int) {
			c, err := open(ctx, from+j)
			if err == nil {
				if err = echoOnce(c); err != nil {
					_ = c.Close()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstE = cmp.Or(firstE, err)
				return
			}
			conns = append(conns, c)
		})
		if firstE == nil && len(conns) < to {
			firstE = ctx.Err()
		}
		if firstE != nil {
			return fmt.Errorf("%d of %d connections open: %w", len(conns), to, firstE)
		}
		return np.alive()
	}
	// Warm-up: pools that are not per connection.
	if err := openTo(0, 64); err != nil {
		return nil, err
	}
	closeConns()
	open, closeClients = k.opener(pp)
	if err := npMemSettle(rss, 0); err != nil {
		return nil, err
	}
	baseRSS, baseAlloc := rss(), alloc()
	var steps []npMemStep
	have := 0
	for _, n := range ns {
		if n <= have {
			continue
		}
		t0 := time.Now()
		if err := openTo(have, n); err != nil {
			return steps, err
		}
		have = n
		r, a := rss(), alloc()
		steps = append(steps, npMemStep{
			n: n, base: baseRSS / 1024, rssMiB: r / 1024,
			rssKiB: (r - baseRSS) / float64(n), allocKiB: (a - baseAlloc) / float64(n),
			openSecs: time.Since(t0).Seconds(),
		})
	}
	peak := rss()
	closeConns()
	t0 := time.Now()
	// Back within a tenth of the growth above the start, or the RSS after
	// 30 s.
	settled := npMemSettle(rss, baseRSS+(peak-baseRSS)/10)
	last := &steps[len(steps)-1]
	last.rssAfterMiB = rss() / 1024
	kept := 100 * (last.rssAfterMiB*1024 - baseRSS) / max(peak-baseRSS, 1)
	if settled == nil {
		last.given = fmt.Sprintf("RSS %.1f MiB within %.0f s (%.0f %% of the growth kept)", last.rssAfterMiB, time.Since(t0).Seconds(), kept)
	} else {
		last.given = fmt.Sprintf("RSS %.1f MiB after 30 s (%.0f %% of the growth kept)", last.rssAfterMiB, kept)
	}
	return steps, np.alive()
}

// npMemSettle waits (at most 30 s) until the RSS is at most target (0: until
// it stops falling for a second).
func npMemSettle(rss func() float64, target float64) error {
	prev := rss()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		r := rss()
		if (target > 0 && r <= target) || (target == 0 && r >= prev) {
			return nil
		}
		prev = r
	}
	return fmt.Errorf("RSS did not settle within 30 s")
}

// echoOnce relays npMemEcho bytes through c and reads them back; the
// backend then holds the connection until the client closes it.
func echoOnce(c io.ReadWriter) error {
	msg := append(header(opEcho, npMemEcho), payload[:npMemEcho]...)
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("writing the echo: %w", err)
	}
	back := make([]byte, npMemEcho)
	if _, err := io.ReadFull(c, back); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if !bytes.Equal(back, payload[:npMemEcho]) {
		return fmt.Errorf("the echo came back changed")
	}
	return nil
}

// tcpOpener: one client connection per proxied connection.
func tcpOpener(dial func(npPorts) dialFunc) func(npPorts) (func(context.Context, int) (io.ReadWriteCloser, error), func()) {
	return func(pp npPorts) (func(context.Context, int) (io.ReadWriteCloser, error), func()) {
		d := dial(pp)
		return func(ctx context.Context, _ int) (io.ReadWriteCloser, error) {
			return d(ctx, "")
		}, func() {}
	}
}

// h2Opener: HTTP/2 CONNECT tunnels over h2c (prior knowledge, as
// tunnel-agent and Envoy's agent speak), perConn tunnels per connection.
func h2Opener(perConn int) func(npPorts) (func(context.Context, int) (io.ReadWriteCloser, error), func()) {
	return func(pp npPorts) (func(context.Context, int) (io.ReadWriteCloser, error), func()) {
		var mu sync.Mutex
		ccs := map[int]*http2.ClientConn{}
		tr := &http2.Transport{AllowHTTP: true}
		conn := func(ctx context.Context, k int) (*http2.ClientConn, error) {
			mu.Lock()
			defer mu.Unlock()
			if cc := ccs[k]; cc != nil {
				return cc, nil
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", goharness.Loopback(pp.tunnel))
			if err != nil {
				return nil, err
			}
			cc, err := tr.NewClientConn(c)
			if err != nil {
				c.Close()
				return nil, err
			}
			ccs[k] = cc
			return cc, nil
		}
		open := func(ctx context.Context, i int) (io.ReadWriteCloser, error) {
			cc, err := conn(ctx, i/perConn)
			if err != nil {
				return nil, err
			}
			return h2Connect(ctx, cc, plainAuthority)
		}
		closeAll := func() {
			mu.Lock()
			defer mu.Unlock()
			for _, cc := range ccs {
				_ = cc.Close()
			}
			clear(ccs)
		}
		return open, closeAll
	}
}

// h2Tunnel is one CONNECT stream: writes go to the request body, reads
// come from the response body.
type h2Tunnel struct {
	w      *io.PipeWriter
	r      io.ReadCloser
	cancel context.CancelFunc
}

func (t *h2Tunnel) Read(p []byte) (int, error)  { return t.r.Read(p) }
func (t *h2Tunnel) Write(p []byte) (int, error) { return t.w.Write(p) }
func (t *h2Tunnel) Close() error {
	_ = t.w.Close()
	err := t.r.Close()
	t.cancel()
	return err
}

// h2Connect opens one CONNECT stream to authority on cc; ctx bounds the
// wait for the answer only (the stream lives until Close).
func h2Connect(ctx context.Context, cc *http2.ClientConn, authority string) (*h2Tunnel, error) {
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(sctx, http.MethodConnect, "http://"+authority, pr)
	if err != nil {
		cancel()
		return nil, err
	}
	res, err := cc.RoundTrip(req)
	if err != nil {
		cancel()
		pw.Close()
		return nil, fmt.Errorf("CONNECT %s: %w", authority, err)
	}
	if res.StatusCode != 200 {
		res.Body.Close()
		cancel()
		pw.Close()
		return nil, fmt.Errorf("CONNECT %s: %s", authority, res.Status)
	}
	return &h2Tunnel{w: pw, r: res.Body, cancel: cancel}, nil
}
