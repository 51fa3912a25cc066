//go:build reusable

package clients

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client/metrics"
)

// The guarantees a single-use connection gives, held with many Proxy
// streams on one ReusableTunnel connection (v0.37.0, -tags reusable).

// echoAll runs n echo round trips of size bytes at once on tun; it fails
// the test when one fails or none moved a byte for a minute.
func echoAll(t *testing.T, tun client.ReusableTunnel, dest string, n, size int, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress atomic.Int64
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
			if err := echoRoundTrip(c, pattern(100+i, size), &progress); err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	if !untilStill(finished, &progress, time.Minute) {
		t.Fatalf("%s: no byte moved for a minute (%d echoed)", what, progress.Load())
	}
	close(errs)
	for err := range errs {
		t.Errorf("%s: %v", what, err)
	}
}

// TestReusableStalledReaderDoesNotStallOthers: one Proxy stream whose
// reader stops (a destination sending 64 MiB nobody reads) while 8 others
// on the same connection each echo 4 MiB. The others finish while the
// stalled one still holds its destination back (flow control reached it,
// per stream), and the stalled one then delivers all 64 MiB intact.
func TestReusableStalledReaderDoesNotStallOthers(t *testing.T) {
	const total = 64 << 20
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f)
			var written atomic.Int64
			src := sourceOnRequest(t, total, &written)
			echo := echoDest(t)
			tun := reusable(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
			defer cancel()
			stalled, err := tun.DialContext(ctx, "tcp", src)
			if err != nil {
				t.Fatalf("%s dial of the source: %v", describeReusable(f), err)
			}
			defer stalled.Close()
			if _, err := stalled.Write([]byte{1}); err != nil {
				t.Fatalf("%s the request byte: %v", describeReusable(f), err)
			}
			// The source has filled what the path buffers before the others
			// start: it stopped moving for a second short of the total.
			var last int64 = -1
			for w := written.Load(); w != last; w = written.Load() {
				if w >= total {
					t.Fatalf("%s the source wrote all %d bytes with nobody reading: the path buffers it all", describeReusable(f), w)
				}
				last = w
				time.Sleep(time.Second)
			}
			echoAll(t, tun, echo, 8, 4<<20, describeReusable(f)+" 8 × 4 MiB echoes beside a stalled stream")
			if w := written.Load(); w >= total {
				t.Errorf("%s the stalled stream's destination wrote all %d bytes during the others' echoes; want it held back by flow control", describeReusable(f), w)
			}
			got, err := io.ReadAll(stalled)
			if err != nil || !bytes.Equal(got, pattern(7, total)) {
				t.Errorf("%s the stalled stream, read at last: %d of %d bytes (%s), %v", describeReusable(f), len(got), total, divergence(got, pattern(7, total)), err)
			}
			if got := s.dialsSeen.Load(); got != 1 {
				t.Errorf("%s the client opened %d connections to the server; want 1", describeReusable(f), got)
			}
		})
	}
}

// TestReusableFailuresEndOnlyTheirStream: on a connection carrying live
// echo streams, a dial to a refused port (reason endpoint), a dial
// cancelled while the agent still dials (reason context) and a stream
// closed by its client end only themselves: the live streams go on, the
// server forgets the pending dial, the next dial works, and it is all one
// connection.
func TestReusableFailuresEndOnlyTheirStream(t *testing.T) {
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f)
			echo := echoDest(t)
			tun := reusable(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
			defer cancel()
			live := make([]net.Conn, 4)
			for i := range live {
				c, err := tun.DialContext(ctx, "tcp", echo)
				if err != nil {
					t.Fatalf("%s dial %d: %v", describeReusable(f), i, err)
				}
				defer c.Close()
				live[i] = c
			}
			roundAll := func(when string) {
				t.Helper()
				for i, c := range live[:3] {
					if err := echoRoundTrip(c, pattern(i, 64<<10), nil); err != nil {
						t.Fatalf("%s live stream %d %s: %v", describeReusable(f), i, when, err)
					}
				}
			}
			roundAll("at first")

			refused := refusedAddr(t)
			if c, err := tun.DialContext(ctx, "tcp", refused); err == nil {
				c.Close()
				t.Fatalf("%s dial of refused %s succeeded", describeReusable(f), refused)
			} else if ok, reason := client.GetDialFailureReason(err); !ok || reason != metrics.DialFailureEndpoint {
				t.Errorf("%s refused port: %v (reason %q), want reason %q", describeReusable(f), err, reason, metrics.DialFailureEndpoint)
			}
			roundAll("after a refused dial")

			hole := blackholeAddr(t)
			dctx, dcancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				c, err := tun.DialContext(dctx, "tcp", hole)
				if err == nil {
					c.Close()
				}
				done <- err
			}()
			s.waitMetric(t, "the dial pending at the server", func(m string) bool {
				return metric(m, "konnectivity_network_proxy_server_pending_backend_dials", "") == 1
			})
			dcancel()
			if err := <-done; err == nil {
				t.Errorf("%s a cancelled dial succeeded", describeReusable(f))
			} else if ok, reason := client.GetDialFailureReason(err); !ok || reason != metrics.DialFailureContext {
				t.Errorf("%s cancelled dial: %v (reason %q), want reason %q", describeReusable(f), err, reason, metrics.DialFailureContext)
			}
			s.waitMetric(t, "no pending dial left", func(m string) bool {
				return metric(m, "konnectivity_network_proxy_server_pending_backend_dials", "") == 0
			})
			roundAll("after a cancelled dial")

			live[3].Close()
			roundAll("after another stream was closed")
			c, err := tun.DialContext(ctx, "tcp", echo)
			if err != nil {
				t.Fatalf("%s a dial after the failures: %v", describeReusable(f), err)
			}
			if err := echoRoundTrip(c, pattern(9, 64<<10), nil); err != nil {
				t.Errorf("%s the stream dialled after the failures: %v", describeReusable(f), err)
			}
			c.Close()
			if got := s.dialsSeen.Load(); got != 1 {
				t.Errorf("%s the client opened %d connections to the server; want 1 (a failure ended the connection)", describeReusable(f), got)
			}
			for _, c := range live[:3] {
				c.Close()
			}
			s.waitMetric(t, "every Proxy stream but none closed, no connection left", func(m string) bool {
				return metric(m, "konnectivity_network_proxy_server_grpc_connections", `service_method="Proxy"`) == 0 &&
					metric(m, "konnectivity_network_proxy_server_established_connections", "") == 0
			})
		})
	}
}

// TestReusableDrain: SIGTERM to the server with streams open on a
// ReusableTunnel, as grpc-go's server drains (GracefulStop): GOAWAY, the
// open streams carry on and finish, a new dial is refused (the client
// sees the stream setup fail: the listener is closed, so grpc-go cannot
// reconnect), and the server exits 0 once the last stream (the frontend's
// and the agent's) ended, well before its grace period.
func TestReusableDrain(t *testing.T) {
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f, "--graceful-shutdown-timeout=5m")
			echo := echoDest(t)
			tun := reusable(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
			defer cancel()
			open := make([]net.Conn, 3)
			for i := range open {
				c, err := tun.DialContext(ctx, "tcp", echo)
				if err != nil {
					t.Fatalf("%s dial %d: %v", describeReusable(f), i, err)
				}
				defer c.Close()
				open[i] = c
				if err := echoRoundTrip(c, pattern(i, 64<<10), nil); err != nil {
					t.Fatalf("%s stream %d before SIGTERM: %v", describeReusable(f), i, err)
				}
			}
			from := s.p.Mark()
			if err := s.p.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.p.WaitLine(from, patience, "shutting down"); err != nil {
				t.Fatalf("%s SIGTERM: %v", describeReusable(f), err)
			}
			for i, c := range open {
				if err := echoRoundTrip(c, pattern(10+i, 1<<20), nil); err != nil {
					t.Errorf("%s stream %d open across SIGTERM: %v", describeReusable(f), i, err)
				}
			}
			dctx, dcancel := context.WithTimeout(ctx, patience)
			c, err := tun.DialContext(dctx, "tcp", echo)
			dcancel()
			if err == nil {
				c.Close()
				t.Errorf("%s a dial after SIGTERM succeeded; want it refused", describeReusable(f))
			} else if ok, reason := client.GetDialFailureReason(err); !ok || reason != metrics.DialFailureStreamSetup {
				t.Errorf("%s a dial after SIGTERM: %v (reason %q), want reason %q", describeReusable(f), err, reason, metrics.DialFailureStreamSetup)
			}
			for i, c := range open {
				if err := echoRoundTrip(c, pattern(20+i, 64<<10), nil); err != nil {
					t.Errorf("%s stream %d after the refused dial: %v", describeReusable(f), i, err)
				}
			}
			if s.p.Exited() {
				t.Fatalf("%s the server exited with streams open and its grace period not over\n%s", describeReusable(f), s.p.Tail(20))
			}
			for _, c := range open {
				c.Close()
			}
			// The agent's stream is a live one too (grpc-go's GracefulStop
			// waits for it as well): once it ends, nothing is left.
			s.agent.Kill()
			code, err := s.p.Wait(patience)
			if err != nil || code != 0 {
				t.Errorf("%s once the last frontend stream and the agent's ended: exit %d, %v; want exit 0 before the 5 min grace period\n%s", describeReusable(f), code, err, s.p.Tail(20))
			}
		})
	}
}

// sourceOnRequest writes total pattern bytes to each connection once the
// client has sent one byte, then closes it, counting what the kernel took
// in written. It waits for the client's byte because konnectivity-client
// registers a connection only after DialContext has taken the DIAL_RSP, so
// DATA that follows a DIAL_RSP at once can find the connection unknown
// ("Connection not recognized", a race in the client that upstream's
// server meets alike) and be dropped.
func sourceOnRequest(t testing.TB, total int, written *atomic.Int64) string {
	data := pattern(7, total)
	return listen(t, func(c net.Conn) {
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return
		}
		for off := 0; off < total; off += 32 << 10 {
			n, err := c.Write(data[off:min(total, off+32<<10)])
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
}

// TestReusableStalledStreamsStayInBudget: 32 Proxy streams on one
// ReusableTunnel connection whose readers all stop while their
// destinations each offer 16 MiB, on a server given a 16 MiB
// --flow-control-budget. What the server holds for them (parked bytes and
// the windows reserved against the budget) stays within that budget while
// their destinations are held back, an echo on the same connection still
// completes beside them, every stream then delivers its 16 MiB intact, and
// the server gives every parked byte and every connection window back.
func TestReusableStalledStreamsStayInBudget(t *testing.T) {
	const (
		streams = 32
		total   = 16 << 20
		budget  = 16 << 20
	)
	const (
		parked   = "konnectivity_network_proxy_server_flow_control_parked_bytes"
		reserved = "konnectivity_network_proxy_server_flow_control_reserved_bytes"
		windows  = "konnectivity_network_proxy_server_flow_control_window_bytes"
	)
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f, fmt.Sprintf("--flow-control-budget=%d", budget))
			var written atomic.Int64
			src := sourceOnRequest(t, total, &written)
			echo := echoDest(t)
			tun := reusable(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
			defer cancel()
			conns := make([]net.Conn, 0, streams)
			for i := range streams {
				c, err := tun.DialContext(ctx, "tcp", src)
				if err != nil {
					t.Fatalf("%s dial %d of the source: %v", describeReusable(f), i, err)
				}
				defer c.Close()
				if _, err := c.Write([]byte{1}); err != nil {
					t.Fatalf("%s stream %d: the request byte: %v", describeReusable(f), i, err)
				}
				conns = append(conns, c)
			}
			// Nobody reads: wait until the sources stop moving.
			var last int64 = -1
			for w := written.Load(); w != last; w = written.Load() {
				last = w
				time.Sleep(time.Second)
			}
			if last >= streams*total {
				t.Fatalf("%s the sources wrote all %d bytes with nobody reading: the path buffers it all", describeReusable(f), last)
			}
			m := s.metrics(t)
			t.Logf("%s with %d streams stalled: sources wrote %d bytes, the server holds %.0f parked, %.0f reserved", describeReusable(f), streams, last, metric(m, parked, ""), metric(m, reserved, ""))
			if p := metric(m, parked, ""); p > budget {
				t.Errorf("%s %s = %.0f with %d stalled streams; want at most the budget, %d", describeReusable(f), parked, p, streams, budget)
			}
			if r := metric(m, reserved, ""); r > budget {
				t.Errorf("%s %s = %.0f with %d stalled streams; want at most the budget, %d", describeReusable(f), reserved, r, streams, budget)
			}
			echoAll(t, tun, echo, 1, 1<<20, describeReusable(f)+" a 1 MiB echo beside 32 stalled streams")
			var wg sync.WaitGroup
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got, err := io.ReadAll(c)
					if err != nil || !bytes.Equal(got, pattern(7, total)) {
						t.Errorf("%s stalled stream %d, read at last: %d of %d bytes (%s), %v", describeReusable(f), i, len(got), total, divergence(got, pattern(7, total)), err)
					}
				}()
			}
			wg.Wait()
			// The connections' windows and parked bytes go with the streams;
			// what stays reserved is the agent link's HTTP/2 window, grown
			// with the traffic and kept within the budget while the link
			// lives.
			s.waitMetric(t, "nothing parked, no connection window left, the reservations within the budget", func(m string) bool {
				return metric(m, parked, "") == 0 && metric(m, windows, "") == 0 && metric(m, reserved, "") <= budget
			})
			if got := s.dialsSeen.Load(); got != 1 {
				t.Errorf("%s the client opened %d connections to the server; want 1", describeReusable(f), got)
			}
		})
	}
}
