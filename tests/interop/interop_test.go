package interop

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"konnectivity-goharness"
)

var pairs = []pair{
	{server: ours, agent: ours},
	{server: ours, agent: upstream},     // upstream proxy-agent -> our proxy-server (mTLS)
	{server: upstream, agent: ours},     // our proxy-agent -> upstream proxy-server
	{server: upstream, agent: upstream}, // control: the expectations hold for upstream itself
}

// snapshot is what an environment's server and agents expose after its
// scenarios, for the cross-implementation metrics comparison.
type snapshot struct {
	server metrics
	agents []metrics
}

func TestInterop(t *testing.T) {
	var mu sync.Mutex
	snaps := map[string]snapshot{}
	key := func(p pair, f frontend) string { return p.String() + "/" + string(f) }

	t.Run("pairs", func(t *testing.T) {
		for _, p := range pairs {
			for _, f := range allFronts {
				t.Run(key(p, f), func(t *testing.T) {
					t.Parallel()
					if s, ok := runEnv(t, p, f); ok {
						mu.Lock()
						snaps[key(p, f)] = s
						mu.Unlock()
					}
				})
			}
			t.Run(p.String()+"/lifecycle", func(t *testing.T) {
				t.Parallel()
				runLifecycle(t, p)
			})
		}
	})

	// After the scenarios: our server's (and agent's) /metrics carry
	// upstream's names, HELP, types and label sets, and the counters moved
	// as upstream's did for the same scenarios with the same agent
	// (resp. server).
	t.Run("metrics", func(t *testing.T) {
		for _, f := range allFronts {
			for _, cmp := range []struct{ ours, ref pair }{
				{pair{ours, ours}, pair{upstream, ours}},
				{pair{ours, upstream}, pair{upstream, upstream}},
			} {
				t.Run(fmt.Sprintf("server/%s/agent=%s", f, cmp.ours.agent), func(t *testing.T) {
					o, ok1 := snaps[key(cmp.ours, f)]
					r, ok2 := snaps[key(cmp.ref, f)]
					if !ok1 || !ok2 {
						t.Fatalf("[metrics | %s vs %s | %s] an environment did not finish its scenarios; nothing to compare", cmp.ours, cmp.ref, f)
					}
					where := fmt.Sprintf("[metrics after the scenarios | our proxy-server (agent=%s) vs upstream proxy-server (agent=%s) | frontend %s]", cmp.ours.agent, cmp.ref.agent, f)
					compareMetrics(t, where, "konnectivity_network_proxy_server_", o.server, r.server, serverExact, oursPairDeviation(cmp.ours, f, map[string]float64{
						`konnectivity_network_proxy_server_dial_failure_count{reason="unrecognized_response"}`:                -1,
						`konnectivity_network_proxy_server_stream_packets_total{packet_type="DIAL_RSP",segment="from_agent"}`: -1,
					}))
				})
			}
			for _, cmp := range []struct{ ours, ref pair }{
				{pair{ours, ours}, pair{ours, upstream}},
				{pair{upstream, ours}, pair{upstream, upstream}},
			} {
				t.Run(fmt.Sprintf("agent/%s/server=%s", f, cmp.ours.server), func(t *testing.T) {
					o, ok1 := snaps[key(cmp.ours, f)]
					r, ok2 := snaps[key(cmp.ref, f)]
					if !ok1 || !ok2 {
						t.Fatalf("[metrics | %s vs %s | %s] an environment did not finish its scenarios; nothing to compare", cmp.ours, cmp.ref, f)
					}
					where := fmt.Sprintf("[metrics after the scenarios | our proxy-agents (server=%s) vs upstream proxy-agents (server=%s) | frontend %s]", cmp.ours.server, cmp.ref.server, f)
					compareMetrics(t, where, "konnectivity_network_proxy_agent_", sumAgents(o.agents), sumAgents(r.agents), agentExact, oursPairDeviation(cmp.ours, f, map[string]float64{
						`konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason="timeout"}`:                     -1,
						`konnectivity_network_proxy_agent_stream_packets_total{packet_type="DIAL_RSP",segment="from_agent"}`: -1,
					}))
				})
			}
		}
	})
}

// runEnv starts a server and two agents for pair p with frontend f and runs
// every scenario for f in order. It returns the metrics afterwards.
func runEnv(t *testing.T, p pair, f frontend) (snapshot, bool) {
	srv := startServer(t, serverConfig{impl: p.server, front: f})
	agents := []*agent{
		startAgent(t, p.agent, srv.agentPort, "agent-a"),
		startAgent(t, p.agent, srv.agentPort, "agent-b"),
	}
	if err := srv.waitBackends(2); err != nil {
		t.Fatalf("%s: %v\n%s", describe("setup", p, f), err, srv.p.Tail(40))
	}
	web := httpDest(t)
	for _, s := range scenarios {
		if !contains(s.fronts, f) {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			x := &sc{t: t, name: s.name, pair: p, front: f, srv: srv, agents: agents, web: web}
			runScenario(x, s)
			if t.Failed() {
				logTails(t, srv, agents)
			}
		})
	}
	var snap snapshot
	var err error
	if snap.server, err = srv.metrics(); err != nil {
		t.Errorf("%s: final server metrics: %v", describe("metrics", p, f), err)
		return snap, false
	}
	for _, a := range agents {
		m, err := a.metrics()
		if err != nil {
			t.Errorf("%s: final agent metrics: %v", describe("metrics", p, f), err)
			return snap, false
		}
		snap.agents = append(snap.agents, m)
	}
	return snap, true
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func logTails(t *testing.T, srv *server, agents []*agent) {
	t.Helper()
	var b strings.Builder
	b.WriteString(srv.p.Tail(60))
	for _, a := range agents {
		b.WriteString(a.p.Tail(30))
	}
	t.Log("\n" + b.String())
}

// runLifecycle: agent restart while idle, then server restart with the
// agent reconnecting, over the gRPC frontend with one agent.
func runLifecycle(t *testing.T, p pair) {
	srv := startServer(t, serverConfig{impl: p.server, front: grpcUDS})
	a := startAgent(t, p.agent, srv.agentPort, "agent-life")
	if err := srv.waitBackends(1); err != nil {
		t.Fatalf("%s: %v", describe("setup", p, grpcUDS), err)
	}
	web := httpDest(t)
	basic := func(x *sc, when string) {
		x.t.Helper()
		resp, err := x.srv.httpClient().Get(web.URL + "/hello")
		if err != nil {
			x.fatalf("%s: GET /hello: %v; want 200 \"hello\"", when, err)
		}
		body, err := readBody(resp)
		if err != nil || resp.StatusCode != 200 || string(body) != "hello" {
			x.fatalf("%s: GET /hello: %d %q (%v); want 200 \"hello\"", when, resp.StatusCode, body, err)
		}
	}

	outer := t // processes started in a step outlive it

	t.Run("agent drains on its first SIGTERM and still serves", func(t *testing.T) {
		x := &sc{t: t, name: "agent drain", pair: p, front: grpcUDS, srv: srv, agents: []*agent{a}, web: web}
		defer func() {
			if t.Failed() {
				logTails(t, srv, []*agent{a})
			}
		}()
		// A connection held open across the signal, used after the drain.
		d := newTCPDest(t, echoHandler)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hold, err := srv.dial(ctx, d.addr, false)
		if err != nil {
			x.fatalf("dial: %v", err)
		}
		defer hold.Close()
		from, afrom := srv.p.Mark(), a.p.Mark()
		if err := a.p.Signal(syscall.SIGTERM); err != nil {
			x.fatalf("SIGTERM: %v", err)
		}
		// The agent has taken the signal: ours says so; upstream's sync
		// loop says it skips connecting because it is draining.
		drained := map[impl]string{ours: "draining: no new servers", upstream: "Skipping connectOnce - agent is draining"}[p.agent]
		if _, _, err := a.p.WaitLine(afrom, 20*time.Second, drained); err != nil {
			x.fatalf("want the agent to start draining on SIGTERM: %v", err)
		}
		// Upstream's agent sends DRAIN only after its next packet from the
		// server (Client.Serve checks drainCh between reads), so a request
		// goes first; it must be served either way.
		basic(x, "after SIGTERM")
		// Both servers log this when the DRAIN packet arrives.
		if _, _, err := srv.p.WaitLine(from, 20*time.Second, "agent is draining"); err != nil {
			x.fatalf("want the server to receive the agent's DRAIN packet: %v", err)
		}
		m, err := srv.metrics()
		if err != nil {
			x.fatalf("server metrics: %v", err)
		}
		if v, _ := m.get("konnectivity_network_proxy_server_stream_packets_total", map[string]string{"segment": "from_agent", "packet_type": "DRAIN"}); v != 1 {
			x.errorf("server stream_packets_total{segment=\"from_agent\",packet_type=\"DRAIN\"} = %g; want 1", v)
		}
		// A draining agent is still used when it is the only one.
		basic(x, "after the agent drained")
		if err := roundtrip(hold, []byte("held across the drain")); err != nil {
			x.fatalf("echo on the connection held across SIGTERM: %v", err)
		}
		// Idle, it keeps serving as the only agent (both agents wait for a
		// second signal; ours at most --graceful-shutdown-timeout), and the
		// second signal ends it; a new one takes over.
		hold.Close()
		basic(x, "after the drained agent's last connection closed")
		if err := a.p.Signal(syscall.SIGTERM); err != nil {
			x.fatalf("second SIGTERM: %v", err)
		}
		exited := goharness.Eventually(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
			if !a.p.Exited() {
				return fmt.Errorf("%s proxy-agent still running after the second SIGTERM", p.agent)
			}
			return nil
		})
		if exited != nil {
			x.fatalf("want the drained agent to exit on the second signal: %v", exited)
		}
		if err := srv.waitBackends(0); err != nil {
			x.fatalf("want the server to drop the agent that exited: %v", err)
		}
		a = startAgent(outer, p.agent, srv.agentPort, "agent-life")
		if err := srv.waitBackends(1); err != nil {
			x.fatalf("after starting a new agent, want the server to count it: %v", err)
		}
	})

	t.Run("agent killed with an established connection", func(t *testing.T) {
		x := &sc{t: t, name: "agent killed with an established connection", pair: p, front: grpcUDS, srv: srv, agents: []*agent{a}, web: web}
		defer func() {
			if t.Failed() {
				logTails(t, srv, []*agent{a})
			}
		}()
		d := newTCPDest(t, echoHandler)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := srv.dial(ctx, d.addr, false)
		if err != nil {
			x.fatalf("dial: %v", err)
		}
		defer c.Close()
		if err := roundtrip(c, []byte("before the agent dies")); err != nil {
			x.fatalf("echo: %v", err)
		}
		a.p.kill()
		// The server sends CLOSE_RSP to every frontend of the dead
		// agent's stream: the client reads EOF and the tunnel ends.
		var n int
		err = within(15*time.Second, c, func() error {
			buf := make([]byte, 64)
			var err error
			n, err = c.Read(buf)
			return err
		})
		if err != io.EOF {
			x.fatalf("client read (%d bytes, %v) after the agent was killed; want EOF within 15 s", n, err)
		}
		if !waitClosed(c.(*grpcConn).tunnel.Done(), 10*time.Second) {
			x.errorf("tunnel not done within 10 s of the agent dying")
		}
		if err := srv.waitBackends(0); err != nil {
			x.fatalf("want the server to drop the killed agent: %v", err)
		}
		a = startAgent(outer, p.agent, srv.agentPort, "agent-life")
		if err := srv.waitBackends(1); err != nil {
			x.fatalf("after restarting the agent, want the server to count it: %v", err)
		}
	})

	t.Run("agent restart while idle", func(t *testing.T) {
		x := &sc{t: t, name: "agent restart while idle", pair: p, front: grpcUDS, srv: srv, agents: []*agent{a}, web: web}
		defer func() {
			if t.Failed() {
				logTails(t, srv, []*agent{a})
			}
		}()
		basic(x, "before the restart")
		a.p.kill()
		if err := srv.waitBackends(0); err != nil {
			x.fatalf("after killing the agent, want the server to drop it (ready_backends 0, /readyz 500): %v", err)
		}
		a = startAgent(outer, p.agent, srv.agentPort, "agent-life")
		x.agents = []*agent{a}
		if err := srv.waitBackends(1); err != nil {
			x.fatalf("after restarting the agent, want the server to count it: %v", err)
		}
		basic(x, "after the agent restarted")
	})

	t.Run("server restart with the agent reconnecting", func(t *testing.T) {
		x := &sc{t: t, name: "server restart with the agent reconnecting", pair: p, front: grpcUDS, srv: srv, agents: []*agent{a}, web: web}
		defer func() {
			if t.Failed() {
				logTails(t, x.srv, []*agent{a})
			}
		}()
		basic(x, "before the restart")
		srv.p.kill()
		if err := a.waitConnected(0); err != nil {
			x.fatalf("after killing the server, want the agent to notice (/readyz not 200, open_server_connections 0): %v", err)
		}
		srv2 := startServer(outer, serverConfig{impl: p.server, front: grpcUDS, dir: srv.dir, agentPort: srv.agentPort})
		x.srv = srv2
		if err := a.waitConnected(1); err != nil {
			x.fatalf("after restarting the server on the same agent port, want the agent to reconnect: %v", err)
		}
		if err := srv2.waitBackends(1); err != nil {
			x.fatalf("after restarting the server, want it to count the reconnected agent: %v", err)
		}
		basic(x, "after the server restarted")
	})
}

// Counters whose values must match upstream's exactly after the same
// scenarios (label -> which label values; nil = all).
var serverExact = map[string]func(map[string]string) bool{
	mServerDialFailures: nil,
	mServerPending:      nil,
	"konnectivity_network_proxy_server_stream_packets_total": func(l map[string]string) bool {
		return l["packet_type"] == "DIAL_REQ" || l["packet_type"] == "DIAL_RSP"
	},
	mServerReady: nil,
	// Gauges at rest: 2 agents, no frontend left, nothing queued.
	mServerGRPCConns: nil,
	"konnectivity_network_proxy_server_http_connections":          nil,
	"konnectivity_network_proxy_server_ready_backend_connections": nil,
	"konnectivity_network_proxy_server_full_receive_channels":     nil,
	// Every gRPC tunnel kube-apiserver closes ends with a Canceled read.
	"konnectivity_network_proxy_server_stream_errors_total": nil,
}

var agentExact = map[string]func(map[string]string) bool{
	mAgentDialFailures:  nil,
	mAgentOpenEndpoints: nil,
	mAgentOpenServers:   nil,
	mAgentDialDuration:  nil,
	"konnectivity_network_proxy_agent_known_server_count": nil,
	"konnectivity_network_proxy_agent_stream_packets_total": func(l map[string]string) bool {
		return l["packet_type"] == "DIAL_REQ" || l["packet_type"] == "DIAL_RSP"
	},
}

// sumAgents merges the agents' scrapes: same families, values added.
func sumAgents(list []metrics) metrics {
	out := metrics{}
	for _, m := range list {
		for name, f := range m {
			g, ok := out[name]
			if !ok {
				g = &dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type}
				out[name] = g
			}
			for _, s := range f.Metric {
				var into *dto.Metric
				for _, have := range g.Metric {
					if labelKey(have) == labelKey(s) {
						into = have
						break
					}
				}
				if into == nil {
					into = &dto.Metric{Label: s.Label}
					v := 0.0
					into.Untyped = &dto.Untyped{Value: &v}
					g.Metric = append(g.Metric, into)
				}
				v := into.Untyped.GetValue() + sampleValue(s)
				into.Untyped.Value = &v
			}
		}
	}
	return out
}

// oursPairDeviation is the one known difference between our pair and any
// pair with an upstream side: our server passes a client's DIAL_CLS on and
// our agent then stops dialing, so each dial the client cancelled (the
// scenarios with oursServerFailures) has no late DIAL_RSP and no dial
// timeout. perCancel gives the change per such dial, by "name{labels}".
func oursPairDeviation(p pair, f frontend, perCancel map[string]float64) map[string]float64 {
	if p != (pair{ours, ours}) {
		return nil
	}
	n := 0.0
	for _, s := range scenarios {
		if s.oursServerFailures != nil && contains(s.fronts, f) {
			n++
		}
	}
	out := map[string]float64{}
	for k, v := range perCancel {
		out[k] = v * n
	}
	return out
}

// compareMetrics checks ours against the upstream reference: every family
// with the prefix exists with the same TYPE and HELP, every series (label
// set) exists, and the values in exact agree, give or take the deviation
// given per "name{labels}".
func compareMetrics(t *testing.T, where, prefix string, got, ref metrics, exact map[string]func(map[string]string) bool, deviation map[string]float64) {
	t.Helper()
	var names []string
	for name := range ref {
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatalf("%s: the upstream reference has no %s* metrics", where, prefix)
	}
	for _, name := range names {
		rf, gf := ref[name], got[name]
		// A series ours never moved is absent, as client_golang's is until
		// its first change. That is a difference only where upstream's value
		// says something happened: a gauge upstream raised and lowered again
		// under load (a receive channel that filled for a moment) is 0 at rest
		// in both, and a counter upstream moves where ours, by a documented
		// difference (deviation), does not, is 0 in ours.
		absentOK := func(rm *dto.Metric) bool {
			d, deviates := deviation[name+"{"+labelKey(rm)+"}"]
			want := sampleValue(rm) + d
			return want == 0 && (deviates || rf.GetType() == dto.MetricType_GAUGE)
		}
		if gf == nil {
			var series []string
			for _, rm := range rf.Metric {
				if !absentOK(rm) {
					series = append(series, fmt.Sprintf("{%s} %g", labelKey(rm), sampleValue(rm)))
				}
			}
			if len(series) > 0 {
				t.Errorf("%s: %s missing from ours; upstream has it (%s, HELP %q): %s", where, name, rf.GetType(), rf.GetHelp(), strings.Join(series, ", "))
			}
			continue
		}
		if rf.GetType() != gf.GetType() && !(gf.GetType() == dto.MetricType_UNTYPED || rf.GetType() == dto.MetricType_UNTYPED) {
			t.Errorf("%s: %s is a %s in ours; upstream's is a %s", where, name, gf.GetType(), rf.GetType())
		}
		if rf.GetHelp() != gf.GetHelp() {
			t.Errorf("%s: # HELP %s is %q in ours; upstream's is %q", where, name, gf.GetHelp(), rf.GetHelp())
		}
		gotSeries := map[string]*dto.Metric{}
		for _, m := range gf.Metric {
			gotSeries[labelKey(m)] = m
		}
		sel, isExact := exact[name]
		for _, rm := range rf.Metric {
			k := labelKey(rm)
			gm := gotSeries[k]
			if gm == nil {
				if !absentOK(rm) {
					t.Errorf("%s: series %s{%s} missing from ours; upstream has it = %g", where, name, k, sampleValue(rm))
				}
				continue
			}
			want := sampleValue(rm) + deviation[name+"{"+k+"}"]
			if isExact && (sel == nil || sel(labelsOf(rm))) && sampleValue(gm) != want {
				t.Errorf("%s: %s{%s} = %g in ours; upstream's moved to %g for the same scenarios (we expect %g)", where, name, k, sampleValue(gm), sampleValue(rm), want)
			}
		}
		// Exact series we have and upstream lacks (e.g. a reason upstream
		// never counted here) are differences too.
		if isExact {
			refSeries := map[string]bool{}
			for _, rm := range rf.Metric {
				refSeries[labelKey(rm)] = true
			}
			for k, gm := range gotSeries {
				if !refSeries[k] && (sel == nil || sel(labelsOf(gm))) && sampleValue(gm) != 0 {
					t.Errorf("%s: %s{%s} = %g in ours; upstream has no such series after the same scenarios", where, name, k, sampleValue(gm))
				}
			}
		}
	}
}
