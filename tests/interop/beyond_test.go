package interop

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"konnectivity-goharness"
)

// What ours does beyond upstream, checked with the real Go
// konnectivity-client (gRPC) and kube-apiserver's CONNECT handshake.

// TestDestinationPolicy: an agent started with --allowed-destinations dials
// what the list allows and refuses everything else before connecting, with a
// DIAL_RSP error the frontend reports (gRPC: the dial error; HTTP CONNECT:
// 502 with the text), and counts each refusal.
func TestDestinationPolicy(t *testing.T) {
	for _, f := range []frontend{grpcUDS, connectUDS} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			allowed := newTCPDest(t, echoHandler)
			other := newTCPDest(t, echoHandler)
			srv := startServer(t, serverConfig{impl: ours, front: f})
			a := startAgent(t, ours, srv.agentPort, "agent-policy", "--allowed-destinations=127.0.0.1/32:"+port(t, allowed.addr))
			if err := srv.waitBackends(1); err != nil {
				t.Fatalf("[setup] %v", err)
			}
			x := &sc{t: t, name: "destination policy", pair: pair{ours, ours}, front: f, srv: srv, agents: []*agent{a}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			c, err := srv.dial(ctx, allowed.addr, false)
			if err != nil {
				t.Fatalf("dial to %s, which the list allows: %v", allowed.addr, err)
			}
			if err := roundtrip(c, []byte("allowed")); err != nil {
				t.Fatalf("roundtrip through the allowed dial: %v", err)
			}
			c.Close()

			c, err = srv.dial(ctx, other.addr, false)
			if c != nil {
				c.Close()
			}
			x.wantDialError(err, 502, regexp.MustCompile(`^dial tcp `+regexp.QuoteMeta(other.addr)+`: destination not allowed by the agent's --allowed-destinations$`))
			if n := len(other.accepted); n != 0 {
				t.Errorf("the refused destination saw %d connections; want 0 (refused before connecting)", n)
			}
			m, err := a.metrics()
			if err != nil {
				t.Fatalf("agent metrics: %v", err)
			}
			if v, _ := m.get("konnectivity_network_proxy_agent_dials_denied_total", nil); v != 1 {
				t.Errorf("konnectivity_network_proxy_agent_dials_denied_total = %v; want 1", v)
			}
		})
	}
}

func port(t testing.TB, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("port of %q: %v", addr, err)
	}
	return p
}

// TestTraceContextToUpstreamAgent (issue 38.4): with --otlp-traces-endpoint
// our server puts its span's traceparent in every DIAL_REQ (field 101, not
// upstream's); upstream's agent must ignore the field and serve the dial as
// usual. The export reaching the receiver shows the dials were traced, so
// the field was on the wire.
func TestTraceContextToUpstreamAgent(t *testing.T) {
	for _, f := range []frontend{grpcUDS, connectUDS} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			var exports atomic.Int64
			rx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
					exports.Add(1)
				}
			}))
			defer rx.Close()
			dest := newTCPDest(t, echoHandler)
			srv := startServer(t, serverConfig{impl: ours, front: f, extra: []string{"--otlp-traces-endpoint=" + rx.URL}})
			startAgent(t, upstream, srv.agentPort, "agent-traced")
			if err := srv.waitBackends(1); err != nil {
				t.Fatalf("[setup] %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := 0; i < 3; i++ {
				c, err := srv.dial(ctx, dest.addr, false)
				if err != nil {
					t.Fatalf("dial %d through upstream's agent with tracing on: %v", i, err)
				}
				if err := roundtrip(c, []byte("traced")); err != nil {
					t.Fatalf("roundtrip %d: %v", i, err)
				}
				c.Close()
			}
			err := goharness.Eventually(ctx, 20*time.Second, 20*time.Millisecond, func() error {
				if exports.Load() == 0 {
					return fmt.Errorf("no span export reached the receiver")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
