//go:build reusable

package clients

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// konnectivity-client v0.37.0's ReusableTunnel: one gRPC connection for the
// tunnel's life, one Proxy stream per DialContext. These run only in the
// build that links v0.37.0 (go.mod, -tags reusable).

func describeReusable(front frontend) string {
	return fmt.Sprintf("[konnectivity-client %s ReusableTunnel | %s | our proxy-server and proxy-agent]", clientVersion, front)
}

// reusable opens a ReusableTunnel to s, closed when the test ends.
func reusable(t testing.TB, s *server) client.ReusableTunnel {
	t.Helper()
	target, opts := s.dialOptions(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	tun, err := client.CreateGRPCTunnel(ctx, target, opts...)
	if err != nil {
		t.Fatalf("%s CreateGRPCTunnel(%s): %v", describeReusable(s.front), target, err)
	}
	t.Cleanup(func() { _ = tun.Close() })
	return tun
}

// heavy is INTEROP_HEAVY=1: the reusable-tunnel load at the size that found
// the flow-control hang (4 MiB per dial) instead of the quick one.
func heavy() bool { return os.Getenv("INTEROP_HEAVY") == "1" }

// TestReusableConcurrentDials: 300 dials at once on one ReusableTunnel,
// each echoing its own bytes. Before the fix in flow control (credit given
// back while data was in flight was not topped up again) 300 × 4 MiB hung
// in 3 of 4 runs; a run that stops moving for a minute fails with the
// server's view of its tunnels.
func TestReusableConcurrentDials(t *testing.T) {
	size := 256 << 10
	if heavy() {
		size = 4 << 20
	}
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f)
			dest := echoDest(t)
			tun := reusable(t, s)
			const n = 300
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var progress, done atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := tun.DialContext(ctx, "tcp", dest)
					if err != nil {
						errs <- fmt.Errorf("dial %d: %w", i, err)
						return
					}
					defer c.Close()
					if err := echoRoundTrip(c, pattern(i, size), &progress); err != nil {
						errs <- fmt.Errorf("connection %d: %w", i, err)
						return
					}
					done.Add(1)
				}()
			}
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			if !untilStill(finished, &progress, time.Minute) {
				_, conns, _ := httpGet(s.admin, "/debug/connections")
				t.Fatalf("%s %d concurrent dials × %d KiB echo: no byte moved for a minute with %d done (%d bytes echoed in all)\n%s\nserver tunnels:\n%s",
					describeReusable(f), n, size>>10, done.Load(), progress.Load(), grepMetrics(s.metrics(t), "konnectivity_network_proxy_server_"), truncate(conns, 4000))
			}
			close(errs)
			for err := range errs {
				t.Errorf("%s %d concurrent dials × %d KiB echo: %v", describeReusable(f), n, size>>10, err)
			}
			if got := s.dialsSeen.Load(); got != 1 {
				t.Errorf("%s the client opened %d connections to the server; want 1 (no reconnect)", describeReusable(f), got)
			}
			// 300 header blocks at once, interleaved on one connection, each
			// decoded against the client's HPACK table (and, on the Unix
			// socket, its :authority replaced).
			if bad := s.p.Grep("not rewritten"); len(bad) > 0 {
				t.Errorf("%s the server gave up following the client's header blocks: %s", describeReusable(f), strings.Join(bad, "\n"))
			}
		})
	}
}

// untilStill waits for done while progress keeps moving; false once it
// stood still for still.
func untilStill(done <-chan struct{}, progress *atomic.Int64, still time.Duration) bool {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, since := progress.Load(), time.Now()
	for {
		select {
		case <-done:
			return true
		case <-tick.C:
			if p := progress.Load(); p != last {
				last, since = p, time.Now()
			} else if time.Since(since) >= still {
				return false
			}
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// TestReusableSequentialDials: 500 dials one after another on one tunnel,
// so 500 Proxy streams' header blocks on one HTTP/2 connection, each
// referring to the client's HPACK table; over the Unix socket each carries
// the socket path as :authority, which the server rewrites. Every one must
// pass on the same connection (a table out of step would end it with a
// COMPRESSION_ERROR and grpc-go would reconnect).
func TestReusableSequentialDials(t *testing.T) {
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f)
			dest := echoDest(t)
			tun := reusable(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
			defer cancel()
			for i := range 500 {
				c, err := tun.DialContext(ctx, "tcp", dest)
				if err != nil {
					t.Fatalf("%s dial %d of 500: %v\n%s", describeReusable(f), i, err, s.p.Tail(20))
				}
				err = echoRoundTrip(c, pattern(i, 1024), nil)
				c.Close()
				if err != nil {
					t.Fatalf("%s connection %d of 500: %v", describeReusable(f), i, err)
				}
			}
			if got := s.dialsSeen.Load(); got != 1 {
				t.Errorf("%s 500 dials took %d connections to the server; want 1", describeReusable(f), got)
			}
			if bad := s.p.Grep("not rewritten"); len(bad) > 0 {
				t.Errorf("%s the server gave up following the client's header blocks: %s", describeReusable(f), strings.Join(bad, "\n"))
			}
			s.waitMetric(t, "every Proxy stream closed", func(m string) bool {
				return metric(m, "konnectivity_network_proxy_server_grpc_connections", `service_method="Proxy"`) == 0
			})
		})
	}
}
