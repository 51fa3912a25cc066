package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"konnectivity-goharness"
)

// oursOnly lists the families our binaries may expose beyond upstream's,
// each a deliberate addition listed in docs/konnectivity.md's differences
// table. The rule: an added family never changes an upstream family, is
// named konnectivity_network_proxy_{server,agent}_*, and is listed both
// here and in the docs; anything else that upstream does not expose fails
// TestMetricsExposition.
var oursOnly = map[string]string{
	"konnectivity_network_proxy_agent_dials_denied_total":                        "dials refused by --allowed-destinations",
	"konnectivity_network_proxy_server_certificate_expiration_timestamp_seconds": "expiry of the loaded TLS files (certificate reload)",
	"konnectivity_network_proxy_agent_certificate_expiration_timestamp_seconds":  "expiry of the loaded TLS files (certificate reload)",
	"konnectivity_network_proxy_server_tls_reloads_total":                        "reloads of changed TLS files",
	"konnectivity_network_proxy_agent_tls_reloads_total":                         "reloads of changed TLS files",
	"konnectivity_network_proxy_server_flow_control_window_bytes":                "current flow-control windows (windows that follow the link)",
	"konnectivity_network_proxy_server_flow_control_parked_bytes":                "bytes parked against the flow-control budget",
	"konnectivity_network_proxy_server_flow_control_reserved_bytes":              "bytes reserved against --flow-control-budget",
	"konnectivity_network_proxy_server_flow_control_budget_bytes":                "--flow-control-budget",
	"konnectivity_network_proxy_server_http2_window_bytes":                       "current HTTP/2 receive windows on the agent link",
	"konnectivity_network_proxy_agent_flow_control_window_bytes":                 "current flow-control windows (windows that follow the link)",
	"konnectivity_network_proxy_agent_flow_control_parked_bytes":                 "bytes parked against the flow-control budget",
	"konnectivity_network_proxy_agent_flow_control_reserved_bytes":               "bytes reserved against --flow-control-budget",
	"konnectivity_network_proxy_agent_flow_control_budget_bytes":                 "--flow-control-budget",
	"konnectivity_network_proxy_agent_http2_window_bytes":                        "current HTTP/2 receive windows on the agent link",
	"konnectivity_network_proxy_server_connection_duration_seconds":              "upstream's after v0.36.0 (#899): how long established connections lived",
	"konnectivity_network_proxy_server_dials_resent_total":                       "dials sent to another agent when theirs left or drained before answering",
	"konnectivity_network_proxy_server_connections_closed_total":                 "tunnels closed, by frontend and close reason (issue 38.4)",
	"konnectivity_network_proxy_agent_connections_closed_total":                  "destination connections closed, by close reason (issue 38.4)",
	"konnectivity_network_proxy_agent_connection_duration_seconds":               "the server's connection_duration_seconds, on the agent (issue 38.4)",
}

// exempt families: Go's runtime collector has no counterpart in a Rust
// process (docs/konnectivity.md says so).
func exempt(family string) bool { return strings.HasPrefix(family, "go_") }

// TestMetricsExposition runs one scenario against upstream's proxy-server
// and proxy-agent and against ours (agent connects, a dial succeeds, one is
// refused, one times out in the agent, a lease cycle with a real
// kube-apiserver: the server's lease controller and garbage collection, the
// agent counting servers by their leases), then compares the two
// expositions, server with server and agent with agent, normalized to what
// must agree: every family's HELP and TYPE line and every sample line
// without its value (name, label names and values as written, `le`
// included). Values may differ; go_* families are exempt.
func TestMetricsExposition(t *testing.T) {
	k := sharedKube(t)
	var mu sync.Mutex
	got := map[impl][2]string{}
	t.Run("scenario", func(t *testing.T) {
		for _, im := range []impl{ours, upstream} {
			t.Run(string(im), func(t *testing.T) {
				t.Parallel()
				srv, agent := expositionScenario(t, k, im)
				mu.Lock()
				got[im] = [2]string{srv, agent}
				mu.Unlock()
			})
		}
	})
	o, ok1 := got[ours]
	u, ok2 := got[upstream]
	if !ok1 || !ok2 {
		t.Fatal("a scenario did not finish; nothing to compare")
	}
	for i, role := range []string{"proxy-server", "proxy-agent"} {
		if dir := os.Getenv("INTEROP_LOG_DIR"); dir != "" {
			for im, texts := range got {
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("exposition-%s-%s.txt", role, im)), []byte(texts[i]), 0o644)
			}
		}
		t.Run(role, func(t *testing.T) {
			diffExpositions(t, role, normalize(o[i]), normalize(u[i]))
		})
	}
}

// expositionScenario runs the scenario on impl's server and agent and
// returns their /metrics texts.
func expositionScenario(t *testing.T, k *kube, im impl) (string, string) {
	ns := "interop-exposition-" + string(im)
	if out, err := k.kubectl("create", "namespace", ns); err != nil && !strings.Contains(out, "AlreadyExists") {
		t.Fatalf("[setup] %v", err)
	}
	leaseFlags := []string{"--kubeconfig=" + k.kubeconfig, "--lease-namespace=" + ns}
	srv := startServer(t, serverConfig{impl: im, front: grpcUDS, extra: append([]string{"--enable-lease-controller"}, leaseFlags...)})
	a := startAgent(t, im, srv.agentPort, "agent-exposition", append([]string{"--count-server-leases"}, leaseFlags...)...)
	if err := srv.waitBackends(1); err != nil {
		t.Fatalf("[setup %s] %v", im, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	echo := newTCPDest(t, echoHandler)
	c, err := srv.dial(ctx, echo.addr, false)
	if err != nil {
		t.Fatalf("[%s] dial %s: %v", im, echo.addr, err)
	}
	if err := roundtrip(c, []byte("exposition")); err != nil {
		t.Fatalf("[%s] roundtrip: %v", im, err)
	}
	c.Close()

	if c, err := srv.dial(ctx, refusedAddr(t), false); err == nil {
		c.Close()
		t.Fatalf("[%s] a dial to a refused port succeeded", im)
	}
	if c, err := srv.dial(ctx, blackholeAddr(t), false); err == nil {
		c.Close()
		t.Fatalf("[%s] a dial to a never-answering destination succeeded", im)
	}

	// The lease cycle: an expired lease is culled by the server's garbage
	// collection (every 15 s, as upstream's); the agent has listed leases.
	if err := k.apply(expiredLease(ns, "konnectivity-proxy-server-gone")); err != nil {
		t.Fatalf("[setup %s] %v", im, err)
	}
	err = goharness.Eventually(ctx, 45*time.Second, 200*time.Millisecond, func() error {
		sm, err := srv.metrics()
		if err != nil {
			return err
		}
		if v, _ := sm.get("konnectivity_network_proxy_server_culled_leases_count", nil); v < 1 {
			return fmt.Errorf("culled_leases_count = %g, want 1", v)
		}
		am, err := a.metrics()
		if err != nil {
			return err
		}
		if v, _ := am.get("konnectivity_network_proxy_agent_lease_lists_total", nil); v < 1 {
			return fmt.Errorf("agent lease_lists_total = %g", v)
		}
		return idle(srv, []*agent{a})
	})
	if err != nil {
		t.Fatalf("[%s] after the lease cycle: %v\n%s\n%s", im, err, srv.p.Tail(20), a.p.Tail(20))
	}
	_, stext, err := httpGet(srv.healthAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_, atext, err := httpGet(a.healthAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return stext, atext
}

// normalized is an exposition reduced to what must agree, by family.
type normalized map[string][]string

// normalize keeps HELP and TYPE lines and sample lines without values.
func normalize(text string) normalized {
	out := normalized{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		var family, kept string
		switch {
		case strings.HasPrefix(line, "# HELP "), strings.HasPrefix(line, "# TYPE "):
			family = strings.Fields(line)[2]
			kept = line
		case strings.HasPrefix(line, "#"):
			continue
		default:
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				continue
			}
			kept = line[:i]
			family = kept
			if j := strings.IndexByte(family, '{'); j >= 0 {
				family = family[:j]
			}
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base := strings.TrimSuffix(family, suffix); base != family {
					if _, ok := out[base]; ok {
						family = base
					}
				}
			}
		}
		out[family] = append(out[family], kept)
	}
	for f := range out {
		sort.Strings(out[f])
	}
	return out
}

func diffExpositions(t *testing.T, role string, ours, ref normalized) {
	var names []string
	for f := range ref {
		names = append(names, f)
	}
	for f := range ours {
		if _, ok := ref[f]; !ok {
			names = append(names, f)
		}
	}
	sort.Strings(names)
	compared := 0
	for _, f := range names {
		if exempt(f) {
			continue
		}
		o, inOurs := ours[f]
		r, inRef := ref[f]
		switch {
		case !inOurs:
			t.Errorf("[%s metrics after the same scenario] family %s missing from ours; upstream writes:\n  %s", role, f, strings.Join(r, "\n  "))
		case !inRef:
			if _, ok := oursOnly[f]; !ok {
				t.Errorf("[%s metrics after the same scenario] family %s is ours only and not in the oursOnly list (docs/konnectivity.md):\n  %s", role, f, strings.Join(o, "\n  "))
			}
		default:
			compared++
			if missing, extra := setDiff(r, o), setDiff(o, r); len(missing)+len(extra) > 0 {
				t.Errorf("[%s metrics after the same scenario] family %s differs (values aside)\n  upstream only:\n    %s\n  ours only:\n    %s", role, f, strings.Join(missing, "\n    "), strings.Join(extra, "\n    "))
			}
		}
	}
	if compared < 5 {
		t.Errorf("[%s] only %d families in common; the scenario did not run", role, compared)
	}
	t.Logf("[%s] %d families compared", role, compared)
}

// setDiff is what a has and b lacks.
func setDiff(a, b []string) []string {
	in := map[string]bool{}
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}
