package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	clientmetrics "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client/metrics"

	"konnectivity-goharness"
)

// sc is one scenario run in one environment; its failure messages name the
// scenario, the pair and the frontend.
type sc struct {
	t      *testing.T
	name   string
	pair   pair
	front  frontend
	srv    *server
	agents []*agent
	web    *httptest.Server
}

func (x *sc) prefix() string { return describe(x.name, x.pair, x.front) }

func (x *sc) fatalf(format string, a ...any) {
	x.t.Helper()
	x.t.Fatalf(x.prefix()+": "+format, a...)
}

func (x *sc) errorf(format string, a ...any) {
	x.t.Helper()
	x.t.Errorf(x.prefix()+": "+format, a...)
}

// scenario is one behaviour checked for a pair over the frontends listed.
type scenario struct {
	name   string
	fronts []frontend
	// How upstream's counters move: the server's dial_failure_count and
	// the agents' endpoint_dial_failure_total, by reason.
	serverFailures map[string]float64
	agentFailures  map[string]float64
	// When both server and agent are ours, if different: our server passes
	// the client's DIAL_CLS on and our agent stops dialing, so there is no
	// late DIAL_RSP (no unrecognized_response) and no dial timeout.
	oursServerFailures map[string]float64
	oursAgentFailures  map[string]float64
	run                func(x *sc)
}

var allFronts = []frontend{grpcUDS, connectUDS, connectTLS}

var scenarios = []scenario{
	{name: "basic request/response", fronts: allFronts, run: runBasic},
	{name: "10 x 1 MiB response", fronts: allFronts, run: runLargeResponse},
	{name: "10 MiB request", fronts: allFronts, run: runLargeRequest},
	{name: "100 concurrent requests over 2 agents", fronts: allFronts, run: runConcurrent},
	{
		name: "dial to a refused port", fronts: allFronts, run: runRefused,
		serverFailures: map[string]float64{"error_response": 1},
		agentFailures:  map[string]float64{"unknown": 1},
	},
	{
		// One lookup of one name under .invalid per pair and frontend.
		name: "DNS failure", fronts: []frontend{grpcUDS, connectUDS}, run: runDNSFailure,
		serverFailures: map[string]float64{"error_response": 1},
		agentFailures:  map[string]float64{"unknown": 1},
	},
	{
		name: "never-answering destination fails by the agent's 5 s timeout", fronts: []frontend{grpcUDS, connectUDS}, run: runNeverAnswers,
		serverFailures: map[string]float64{"error_response": 1},
		agentFailures:  map[string]float64{"timeout": 1},
	},
	{
		// The client sends DIAL_CLS (server: frontend_close); an upstream
		// agent ignores it, times out after 5 s and its DIAL_RSP is then
		// unknown to the server (unrecognized_response). Between our server
		// and our agent the dial is cancelled instead.
		name: "request context cancelled while dialing", fronts: []frontend{grpcUDS}, run: runCancelWhileDialing,
		serverFailures:     map[string]float64{"frontend_close": 1, "unrecognized_response": 1},
		agentFailures:      map[string]float64{"timeout": 1},
		oursServerFailures: map[string]float64{"frontend_close": 1},
		oursAgentFailures:  map[string]float64{},
	},
	{
		name: "request deadline exceeded while dialing", fronts: []frontend{grpcUDS}, run: runDeadlineWhileDialing,
		serverFailures:     map[string]float64{"frontend_close": 1, "unrecognized_response": 1},
		agentFailures:      map[string]float64{"timeout": 1},
		oursServerFailures: map[string]float64{"frontend_close": 1},
		oursAgentFailures:  map[string]float64{},
	},
	{name: "tunnel context cancelled mid-stream", fronts: []frontend{grpcUDS}, run: runTunnelCancelled},
	{name: "client closes first", fronts: allFronts, run: runClientClosesFirst},
	{name: "destination closes first", fronts: allFronts, run: runDestinationClosesFirst},
	{name: "raw TCP echo, server speaks first", fronts: allFronts, run: runServerSpeaksFirst},
	{name: "raw TCP echo, client speaks first", fronts: allFronts, run: runClientSpeaksFirst},
}

// runScenario runs sc.run between two metric snapshots and then waits until
// the counters moved as upstream's do and the pair is idle again (no
// pending dial, no established connection, no open endpoint connection,
// no frontend connection left).
func runScenario(x *sc, s scenario) {
	x.t.Helper()
	before, err := failureCounts(x.srv, x.agents)
	if err != nil {
		x.fatalf("metrics before the scenario: %v", err)
	}
	s.run(x)
	if x.t.Failed() {
		return
	}
	wantS, wantA := s.serverFailures, s.agentFailures
	if x.pair.server == ours && x.pair.agent == ours && s.oursServerFailures != nil {
		wantS, wantA = s.oursServerFailures, s.oursAgentFailures
	}
	if wantS == nil {
		wantS = map[string]float64{}
	}
	if wantA == nil {
		wantA = map[string]float64{}
	}
	var gotS, gotA map[string]float64
	err = goharness.Eventually(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		after, err := failureCounts(x.srv, x.agents)
		if err != nil {
			return err
		}
		gotS, gotA = delta(before.server, after.server), delta(before.agent, after.agent)
		if !sameCounts(gotS, wantS) || !sameCounts(gotA, wantA) {
			return fmt.Errorf("counters not there yet")
		}
		return idle(x.srv, x.agents)
	})
	if err != nil {
		x.errorf("after the scenario: want server %s{reason} to move by %s (saw %s) and agents' %s{reason} by %s (saw %s), then an idle pair: %v",
			mServerDialFailures, fmtCounts(wantS), fmtCounts(gotS), mAgentDialFailures, fmtCounts(wantA), fmtCounts(gotA), err)
	}
}

type counts struct{ server, agent map[string]float64 }

func failureCounts(s *server, agents []*agent) (counts, error) {
	m, err := s.metrics()
	if err != nil {
		return counts{}, err
	}
	c := counts{server: m.byLabel(mServerDialFailures, "reason"), agent: map[string]float64{}}
	for _, a := range agents {
		am, err := a.metrics()
		if err != nil {
			return counts{}, err
		}
		for k, v := range am.byLabel(mAgentDialFailures, "reason") {
			c.agent[k] += v
		}
	}
	return c, nil
}

// idle checks the gauges that say nothing is left over.
func idle(s *server, agents []*agent) error {
	m, err := s.metrics()
	if err != nil {
		return err
	}
	gauges := []struct {
		name   string
		labels map[string]string
	}{
		{mServerPending, nil},
		{mServerGRPCConns, map[string]string{"service_method": "Proxy"}},
		{"konnectivity_network_proxy_server_http_connections", nil},
	}
	if s.impl == ours {
		// Upstream v0.36.0 leaves established_connections raised when a
		// frontend stream ends with its connection established
		// (removeEstablishedForStream deletes without updating the gauge),
		// so the control pair cannot hold it to 0; ours must.
		gauges = append(gauges, struct {
			name   string
			labels map[string]string
		}{mServerEstablished, nil})
	}
	for _, g := range gauges {
		if v, _ := m.get(g.name, g.labels); v != 0 {
			return fmt.Errorf("server %s%v = %g, want 0", g.name, g.labels, v)
		}
	}
	for _, a := range agents {
		am, err := a.metrics()
		if err != nil {
			return err
		}
		if v, _ := am.get(mAgentOpenEndpoints, nil); v != 0 {
			return fmt.Errorf("%s agent %s %s = %g, want 0", a.impl, a.id, mAgentOpenEndpoints, v)
		}
	}
	return nil
}

// --- helpers ---

func readBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// within runs f, closing c (unblocking its reads) if f takes longer than d.
func within(d time.Duration, c io.Closer, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		c.Close()
		<-done
		return fmt.Errorf("no result within %s", d)
	}
}

func roundtrip(c net.Conn, msg []byte) error {
	return within(20*time.Second, c, func() error {
		errc := make(chan error, 1)
		go func() { _, err := c.Write(msg); errc <- err }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return fmt.Errorf("reading the echo of %d bytes: %w", len(msg), err)
		}
		if err := <-errc; err != nil {
			return fmt.Errorf("writing %d bytes: %w", len(msg), err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo of %d bytes differs (sha256 %s, want %s)", len(msg), sha(got), sha(msg))
		}
		return nil
	})
}

func waitClosed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// --- scenarios ---

func runBasic(x *sc) {
	resp, err := x.srv.httpClient().Get(x.web.URL + "/hello")
	if err != nil {
		x.fatalf("GET /hello through the tunnel: %v; want 200 \"hello\"", err)
	}
	body, err := readBody(resp)
	if err != nil || resp.StatusCode != 200 || string(body) != "hello" {
		x.fatalf("GET /hello: %d %q (read error %v); want 200 \"hello\"", resp.StatusCode, body, err)
	}
}

func runLargeResponse(x *sc) {
	resp, err := x.srv.httpClient().Get(x.web.URL + "/large")
	if err != nil {
		x.fatalf("GET /large: %v; want 200 with 10 x 1 MiB", err)
	}
	body, err := readBody(resp)
	want := bytes.Repeat(pattern(1, largeChunk), largeCount)
	if err != nil || resp.StatusCode != 200 || len(body) != len(want) || sha(body) != sha(want) {
		x.fatalf("GET /large: status %d, %d bytes sha256 %s (read error %v); want 200, %d bytes sha256 %s",
			resp.StatusCode, len(body), sha(body), err, len(want), sha(want))
	}
}

func runLargeRequest(x *sc) {
	body := pattern(2, 10*mib)
	resp, err := x.srv.httpClient().Post(x.web.URL+"/sink", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		x.fatalf("POST 10 MiB to /sink: %v; want the destination to receive all of it", err)
	}
	got, err := readBody(resp)
	want := fmt.Sprintf("%d %s", len(body), sha(body))
	if err != nil || resp.StatusCode != 200 || string(got) != want {
		x.fatalf("POST 10 MiB: destination saw %q (status %d, read error %v); want %q", got, resp.StatusCode, err, want)
	}
}

func runConcurrent(x *sc) {
	if len(x.agents) != 2 {
		x.fatalf("needs 2 agents, env has %d", len(x.agents))
	}
	dials := func() ([]float64, error) {
		var out []float64
		for _, a := range x.agents {
			m, err := a.metrics()
			if err != nil {
				return nil, err
			}
			v, _ := m.get(mAgentDialDuration, nil)
			out = append(out, v)
		}
		return out, nil
	}
	before, err := dials()
	if err != nil {
		x.fatalf("agent metrics: %v", err)
	}
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := "request-" + strconv.Itoa(i)
			resp, err := x.srv.httpClient().Post(x.web.URL+"/echo", "text/plain", strings.NewReader(want))
			if err != nil {
				errs <- fmt.Errorf("request %d: %v", i, err)
				return
			}
			got, err := readBody(resp)
			if err != nil || string(got) != want {
				errs <- fmt.Errorf("request %d: got %q (%v), want %q", i, got, err, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var failed []string
	for err := range errs {
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 {
		x.fatalf("%d of %d concurrent requests failed; want all to echo their body. First ones: %s", len(failed), n, strings.Join(failed[:min(5, len(failed))], "; "))
	}
	after, err := dials()
	if err != nil {
		x.fatalf("agent metrics: %v", err)
	}
	d0, d1 := after[0]-before[0], after[1]-before[1]
	if d0+d1 != n || d0 == 0 || d1 == 0 {
		x.errorf("agents' %s_count moved by %g and %g; want both > 0 (the server spreads dials over both agents) summing to %d",
			mAgentDialDuration, d0, d1, n)
	}
}

// wantDialError checks a failed dial against what upstream's agent sends:
// Go's net error text (want matches all of it). The gRPC client's error
// carries that text with reason "endpoint"; HTTP-CONNECT answers status
// (upstream maps the text to it) as Go's http.Response writes it:
// text/plain; charset=utf-8, Connection: close, the text as the body.
func (x *sc) wantDialError(err error, status int, want *regexp.Regexp) {
	x.t.Helper()
	if err == nil {
		x.fatalf("dial succeeded; want it to fail with %q", want)
	}
	if x.front == grpcUDS {
		isDF, reason := client.GetDialFailureReason(err)
		if !isDF || reason != clientmetrics.DialFailureEndpoint || !want.MatchString(err.Error()) {
			x.fatalf("dial error %q (dial failure %v, reason %q); want reason %q with the agent's Go error text matching %q", err, isDF, reason, clientmetrics.DialFailureEndpoint, want)
		}
		return
	}
	var ce *connectError
	if !errors.As(err, &ce) {
		x.fatalf("CONNECT failed with %v; want an HTTP %d answer", err, status)
	}
	wantLine := fmt.Sprintf("HTTP/1.1 %d %s", status, http.StatusText(status))
	if ce.StatusLine != wantLine || !want.MatchString(ce.Body) {
		x.fatalf("CONNECT answered %q with body %q; want %q with the agent's Go error text matching %q as the body", ce.StatusLine, ce.Body, wantLine, want)
	}
	if ce.ContentType != "text/plain; charset=utf-8" || !ce.Close {
		x.errorf("CONNECT's %d answer has Content-Type %q, Connection: close %v; want \"text/plain; charset=utf-8\" and close, as upstream writes it", status, ce.ContentType, ce.Close)
	}
}

func runRefused(x *sc) {
	addr := refusedAddr(x.t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, addr, false)
	if c != nil {
		c.Close()
	}
	x.wantDialError(err, 502, regexp.MustCompile(`^dial tcp `+regexp.QuoteMeta(addr)+`: connect: connection refused$`))
}

func runDNSFailure(x *sc) {
	host := "konnectivity-interop-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".invalid"
	addr := host + ":80"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, addr, false)
	if c != nil {
		c.Close()
	}
	// Go: "dial tcp: lookup <host> on <nameserver>: no such host" (the
	// " on <nameserver>" part depends on the resolver).
	x.wantDialError(err, 502, regexp.MustCompile(`^dial tcp: lookup `+regexp.QuoteMeta(host)+`( on [^ ]+)?: no such host$`))
}

func runNeverAnswers(x *sc) {
	addr := blackholeAddr(x.t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := x.srv.dial(ctx, addr, false)
	took := time.Since(start)
	if c != nil {
		c.Close()
	}
	// Go's net error text; upstream's HTTP-CONNECT maps "timeout" to 504.
	x.wantDialError(err, 504, regexp.MustCompile(`^dial tcp `+regexp.QuoteMeta(addr)+`: i/o timeout$`))
	if took < 4*time.Second || took > 9*time.Second {
		x.fatalf("the dial failed after %s; want about 5 s (the agent's dial timeout)", took.Round(time.Millisecond))
	}
}

// dialPending starts a kube-apiserver dial to a never-answering
// destination with ctx and returns its tunnel and result channel once the
// server holds the dial as pending (the DIAL_REQ went to the agent).
func (x *sc) dialPending(ctx context.Context) (client.Tunnel, <-chan error) {
	x.t.Helper()
	addr := blackholeAddr(x.t)
	tunnel, err := grpcTunnel(ctx, context.Background(), x.srv.uds)
	if err != nil {
		x.fatalf("creating the tunnel: %v", err)
	}
	res := make(chan error, 1)
	go func() {
		c, err := tunnel.DialContext(ctx, "tcp", addr)
		if c != nil {
			c.Close()
			err = fmt.Errorf("dial to a never-answering destination succeeded")
		}
		res <- err
	}()
	err = goharness.Eventually(context.Background(), 4*time.Second, 5*time.Millisecond, func() error {
		m, err := x.srv.metrics()
		if err != nil {
			return err
		}
		if v, _ := m.get(mServerPending, nil); v != 1 {
			return fmt.Errorf("%s = %g, want 1", mServerPending, v)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		x.fatalf("waiting for the dial to be pending on the server: %v", err)
	}
	return tunnel, res
}

func (x *sc) wantContextFailure(tunnel client.Tunnel, res <-chan error, maxWait time.Duration) {
	x.t.Helper()
	select {
	case err := <-res:
		isDF, reason := client.GetDialFailureReason(err)
		if !isDF || reason != clientmetrics.DialFailureContext {
			x.fatalf("dial error %v (dial failure %v, reason %q); want reason %q", err, isDF, reason, clientmetrics.DialFailureContext)
		}
	case <-time.After(maxWait):
		x.fatalf("the dial did not fail within %s of its context ending; want a %q failure at once", maxWait, clientmetrics.DialFailureContext)
	}
	if !waitClosed(tunnel.Done(), 10*time.Second) {
		x.fatalf("the tunnel did not close within 10 s after the cancelled dial")
	}
}

func runCancelWhileDialing(x *sc) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tunnel, res := x.dialPending(ctx)
	cancel()
	x.wantContextFailure(tunnel, res, 2*time.Second)
}

func runDeadlineWhileDialing(x *sc) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	tunnel, res := x.dialPending(ctx)
	x.wantContextFailure(tunnel, res, 3*time.Second)
}

func runTunnelCancelled(x *sc) {
	d := newTCPDest(x.t, echoHandler)
	tctx, tcancel := context.WithCancel(context.Background())
	defer tcancel()
	tunnel, err := grpcTunnel(context.Background(), tctx, x.srv.uds)
	if err != nil {
		x.fatalf("creating the tunnel: %v", err)
	}
	c, err := tunnel.DialContext(context.Background(), "tcp", d.addr)
	if err != nil {
		x.fatalf("dial: %v", err)
	}
	defer c.Close()
	if err := roundtrip(c, []byte("ping")); err != nil {
		x.fatalf("echo before cancelling: %v", err)
	}
	tcancel()
	if !waitClosed(tunnel.Done(), 10*time.Second) {
		x.fatalf("tunnel not done within 10 s of cancelling its context")
	}
	select {
	case <-d.closed:
	case <-time.After(15 * time.Second):
		x.fatalf("the destination connection is still open 15 s after the tunnel's context was cancelled; want the agent to close it (server sends CLOSE_REQ when the frontend stream ends)")
	}
}

func runClientClosesFirst(x *sc) {
	d := newTCPDest(x.t, echoHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, d.addr, false)
	if err != nil {
		x.fatalf("dial: %v", err)
	}
	if err := roundtrip(c, []byte("hello before close")); err != nil {
		c.Close()
		x.fatalf("echo: %v", err)
	}
	start := time.Now()
	err = c.Close()
	took := time.Since(start)
	if x.front == grpcUDS {
		// konnectivity-client's Close waits up to 10 s for CLOSE_RSP.
		if err != nil || took > 5*time.Second {
			x.errorf("conn.Close() = %v after %s; want nil at once (CLOSE_REQ answered by CLOSE_RSP)", err, took.Round(time.Millisecond))
		}
		if !waitClosed(c.(*grpcConn).tunnel.Done(), 10*time.Second) {
			x.errorf("tunnel not done within 10 s of Close")
		}
	}
	select {
	case err := <-d.closed:
		if err != nil {
			x.errorf("the destination saw %v; want a clean EOF", err)
		}
	case <-time.After(15 * time.Second):
		x.fatalf("the destination connection is still open 15 s after the client closed; want the agent to close it")
	}
}

func runDestinationClosesFirst(x *sc) {
	goAhead := x.speakFirstGate()
	d := newTCPDest(x.t, gated(goAhead, closerHandler("bye")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, d.addr, true)
	goAhead.open()
	if err != nil {
		x.fatalf("dial: %v", err)
	}
	defer c.Close()
	var got []byte
	err = within(15*time.Second, c, func() error {
		var err error
		got, err = io.ReadAll(c)
		return err
	})
	if err != nil || string(got) != "bye" {
		x.fatalf("read %q then %v; want \"bye\" then EOF", got, err)
	}
	if x.front == grpcUDS {
		// (conn.Close() after that returns nil or "tunnel closed" at
		// random in konnectivity-client, so its result proves nothing.)
		if !waitClosed(c.(*grpcConn).tunnel.Done(), 10*time.Second) {
			x.errorf("tunnel not done within 10 s of the destination closing (CLOSE_RSP ends it)")
		}
	}
}

// speakFirstGate opens when a destination that speaks first may speak.
//
// With our server behind HTTP-CONNECT it is open at once: the server must
// write its 200 before any byte from the destination, or kube-apiserver's
// dialer fails. Otherwise it opens when the client's dial has returned,
// because two upstream races lose or misorder such bytes whoever the other
// party is:
//   - konnectivity-client v0.36.0 registers a connection only after
//     DialContext's caller took the DIAL_RSP result and drops DATA that
//     arrives in between ("Connection not recognized", client.go serve());
//   - upstream's HTTP-CONNECT server writes the 200 from the tunnel
//     goroutine while serveRecvBackend writes DATA to the same socket, so
//     the destination's bytes can come first (tunnel.go ServeHTTP).
func (x *sc) speakFirstGate() *gate {
	g := &gate{ch: make(chan struct{})}
	if x.front != grpcUDS && x.pair.server == ours {
		g.open()
	}
	return g
}

type gate struct {
	once sync.Once
	ch   chan struct{}
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// gated runs h once g is open.
func gated(g *gate, h func(net.Conn) error) func(net.Conn) error {
	return func(c net.Conn) error {
		<-g.ch
		return h(c)
	}
}

func runServerSpeaksFirst(x *sc) {
	const greeting = "220 interop.test ESMTP ready\r\n"
	goAhead := x.speakFirstGate()
	d := newTCPDest(x.t, gated(goAhead, greeterHandler(greeting)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, d.addr, true)
	goAhead.open()
	if err != nil {
		x.fatalf("dial: %v", err)
	}
	defer c.Close()
	got := make([]byte, len(greeting))
	err = within(15*time.Second, c, func() error { _, err := io.ReadFull(c, got); return err })
	if err != nil || string(got) != greeting {
		x.fatalf("read %q (%v) before writing anything; want the greeting %q", got, err, greeting)
	}
	if err := roundtrip(c, []byte("EHLO client\r\n")); err != nil {
		x.fatalf("echo after the greeting: %v", err)
	}
}

func runClientSpeaksFirst(x *sc) {
	d := newTCPDest(x.t, echoHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := x.srv.dial(ctx, d.addr, false)
	if err != nil {
		x.fatalf("dial: %v", err)
	}
	defer c.Close()
	// Upstream's TestEchoServer sequence: 25 bytes in, read in 10-byte
	// pieces, 7 more in.
	msg, msg2 := "1234567890123456789012345", "1234567"
	err = within(15*time.Second, c, func() error {
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		buf := make([]byte, 25)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			return fmt.Errorf("read %q (%v), want %q", buf, err, msg)
		}
		if _, err := io.WriteString(c, msg2); err != nil {
			return err
		}
		buf = buf[:7]
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg2 {
			return fmt.Errorf("read %q (%v), want %q", buf, err, msg2)
		}
		return nil
	})
	if err != nil {
		x.fatalf("small echoes: %v", err)
	}
	if err := roundtrip(c, pattern(3, 256<<10)); err != nil {
		x.fatalf("256 KiB echo: %v", err)
	}
}
