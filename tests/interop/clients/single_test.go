package clients

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client/metrics"
)

// Every client version runs these: the single-use tunnel, dialed exactly as
// kube-apiserver's egress selector dials it (a new gRPC connection and one
// Proxy stream per dial; blocking, 30 s).

// singleUse is one dial through a new single-use tunnel.
func singleUse(ctx context.Context, t testing.TB, s *server, addr string) (net.Conn, error) {
	target, opts := s.dialOptions(t)
	//nolint:staticcheck // kube-apiserver uses these (deprecated) options.
	opts = append(opts, grpc.WithBlock(), grpc.WithReturnConnectionError(), grpc.WithTimeout(30*time.Second))
	tun, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), target, opts...)
	if err != nil {
		return nil, fmt.Errorf("creating the tunnel: %w", err)
	}
	return tun.DialContext(ctx, "tcp", addr)
}

func describe(t testing.TB, front frontend) string {
	return fmt.Sprintf("[konnectivity-client %s single-use | %s | our proxy-server and proxy-agent]", clientVersion, front)
}

func fronts() []frontend { return []frontend{uds, tcp} }

// TestSingleUseEcho: 1 MiB there and back through one tunnel, byte for byte.
func TestSingleUseEcho(t *testing.T) {
	for _, f := range fronts() {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, f)
			dest := echoDest(t)
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			c, err := singleUse(ctx, t, s, dest)
			if err != nil {
				t.Fatalf("%s dial %s: %v", describe(t, f), dest, err)
			}
			defer c.Close()
			if err := echoRoundTrip(c, pattern(1, 1<<20), nil); err != nil {
				t.Fatalf("%s 1 MiB echo: %v", describe(t, f), err)
			}
		})
	}
}

// TestSingleUseConcurrent: 100 tunnels at once, each its own echo.
func TestSingleUseConcurrent(t *testing.T) {
	t.Parallel()
	s := startServer(t, uds)
	dest := echoDest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := singleUse(ctx, t, s, dest)
			if err != nil {
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			defer c.Close()
			if err := echoRoundTrip(c, pattern(i, 64<<10), nil); err != nil {
				errs <- fmt.Errorf("tunnel %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%s %d concurrent 64 KiB echoes: %v", describe(t, uds), n, err)
	}
	s.waitMetric(t, "no Proxy stream and no established connection left", func(m string) bool {
		return metric(m, "konnectivity_network_proxy_server_grpc_connections", `service_method="Proxy"`) == 0 &&
			metric(m, "konnectivity_network_proxy_server_established_connections", "") == 0
	})
}

// TestSingleUseRefusedPort: the agent's dial error reaches the client as
// Go's text, typed as an endpoint failure.
func TestSingleUseRefusedPort(t *testing.T) {
	t.Parallel()
	s := startServer(t, uds)
	addr := refusedAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, err := singleUse(ctx, t, s, addr)
	if err == nil {
		c.Close()
		t.Fatalf("%s dial of refused %s succeeded", describe(t, uds), addr)
	}
	want := "dial tcp " + addr + ": connect: connection refused"
	if err.Error() != want {
		t.Errorf("%s refused port: error %q, want %q", describe(t, uds), err, want)
	}
	if ok, reason := client.GetDialFailureReason(err); !ok || reason != metrics.DialFailureEndpoint {
		t.Errorf("%s refused port: GetDialFailureReason = %v %q, want true %q", describe(t, uds), ok, reason, metrics.DialFailureEndpoint)
	}
}

// TestSingleUseCancelledWhileDialing: the request context ends while the
// agent still dials; the client gives up at once and the server forgets
// the dial.
func TestSingleUseCancelledWhileDialing(t *testing.T) {
	t.Parallel()
	s := startServer(t, uds)
	addr := blackholeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		c, err := singleUse(ctx, t, s, addr)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	s.waitMetric(t, "the dial pending at the server", func(m string) bool {
		return metric(m, "konnectivity_network_proxy_server_pending_backend_dials", "") == 1
	})
	cancel()
	select {
	case err := <-done:
		if ok, reason := client.GetDialFailureReason(err); !ok || reason != metrics.DialFailureContext {
			t.Errorf("%s cancelled dial: error %v (reason %q), want one of reason %q", describe(t, uds), err, reason, metrics.DialFailureContext)
		}
	case <-time.After(patience):
		t.Fatalf("%s the dial did not return after its context was cancelled", describe(t, uds))
	}
	s.waitMetric(t, "no pending dial left", func(m string) bool {
		return metric(m, "konnectivity_network_proxy_server_pending_backend_dials", "") == 0
	})
}

// TestSingleUseDestinationClosesFirst: the destination's last bytes arrive,
// then EOF.
func TestSingleUseDestinationClosesFirst(t *testing.T) {
	t.Parallel()
	s := startServer(t, uds)
	// konnectivity-client registers a connection only after DialContext's
	// caller took the DIAL_RSP and drops DATA that arrives in between
	// ("Connection not recognized", every version): the destination speaks
	// once the dial has returned.
	dialed := make(chan struct{})
	dest := listen(t, func(c net.Conn) {
		<-dialed
		_, _ = io.WriteString(c, "bye")
		c.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, err := singleUse(ctx, t, s, dest)
	close(dialed)
	if err != nil {
		t.Fatalf("%s dial: %v", describe(t, uds), err)
	}
	defer c.Close()
	got, err := io.ReadAll(c)
	if string(got) != "bye" || (err != nil && !errors.Is(err, io.EOF)) {
		t.Errorf("%s destination closed after %q: read %q, %v; want the bytes, then EOF", describe(t, uds), "bye", got, err)
	}
}
