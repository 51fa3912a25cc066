package clients

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"konnectivity-goharness"
)

// frontend is how the client reaches our server: gRPC over the Unix socket
// (kube-apiserver's egress selector) or gRPC over mTLS TCP.
type frontend string

const (
	uds frontend = "grpc-uds"
	tcp frontend = "grpc-mtls-tcp"
)

const patience = 60 * time.Second

// server is one running proxy-server of ours with one agent connected.
type server struct {
	p          *goharness.Proc
	agent      *goharness.Proc
	front      frontend
	uds        string // socket path (uds)
	addr       string // host:port (tcp)
	admin      string
	health     string
	agentPort  int
	dialsSeen  atomic.Int64 // connections the clients opened to the frontend
	dir        string
	serverArgs []string
}

// startProc starts a child that the test kills when it ends, with our
// binaries' default log filter.
func startProc(t testing.TB, name, path string, args []string) *goharness.Proc {
	t.Helper()
	p, err := goharness.Start(name, path, args, goharness.Options{Drop: []string{"RUST_LOG="}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// startServer starts our proxy-server (gRPC mode on front) and one agent of
// ours, and waits until the server counts the agent. extra goes to the
// server's command line.
func startServer(t testing.TB, front frontend, extra ...string) *server {
	t.Helper()
	// Short path: sun_path holds 108 bytes.
	dir, err := os.MkdirTemp("", "kic")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &server{front: front, dir: dir}
	args := []string{
		"--mode=grpc",
		"--cluster-cert=" + pki.serverCert, "--cluster-key=" + pki.serverKey, "--cluster-ca-cert=" + ca.Cert,
		"--agent-bind-address=127.0.0.1", "--agent-port=0",
		"--health-bind-address=127.0.0.1", "--health-port=0",
		"--admin-bind-address=127.0.0.1", "--admin-port=0",
		"--server-count=1",
	}
	names := []string{"agent", "health", "admin"}
	if front == uds {
		s.uds = filepath.Join(dir, "konnectivity-server.socket")
		args = append(args, "--uds-name="+s.uds, "--server-port=0")
	} else {
		args = append(args, "--server-bind-address=127.0.0.1", "--server-port=0",
			"--server-cert="+pki.serverCert, "--server-key="+pki.serverKey, "--server-ca-cert="+ca.Cert)
		names = append(names, "frontend")
	}
	s.serverArgs = append(args, extra...)
	s.p = startProc(t, "proxy-server", serverBin, s.serverArgs)
	addrs, err := goharness.LoopbackAddrs(s.p, patience, names...)
	if err != nil {
		t.Fatalf("[setup] our proxy-server (%s) did not log its listeners: %v", front, err)
	}
	s.admin, s.health, s.addr = addrs["admin"], addrs["health"], addrs["frontend"]
	if s.agentPort, err = goharness.PortOf(addrs["agent"]); err != nil {
		t.Fatal(err)
	}
	s.agent = s.startAgent(t, "agent-1")
	return s
}

// startAgent starts one of our agents and waits until the server is ready
// with it.
func (s *server) startAgent(t testing.TB, id string, extra ...string) *goharness.Proc {
	t.Helper()
	args := append([]string{
		"--ca-cert=" + ca.Cert, "--agent-cert=" + pki.agentCert, "--agent-key=" + pki.agentKey,
		"--proxy-server-host=127.0.0.1", "--proxy-server-port=" + strconv.Itoa(s.agentPort),
		"--health-server-host=127.0.0.1", "--health-server-port=0",
		"--admin-bind-address=127.0.0.1", "--admin-server-port=0",
		"--agent-id=" + id,
		"--sync-interval=100ms", "--probe-interval=100ms", "--sync-interval-cap=1s",
	}, extra...)
	a := startProc(t, "proxy-agent "+id, agentBin, args)
	if _, _, err := a.WaitLine(0, patience, "connected to proxy server"); err != nil {
		t.Fatalf("[setup] our proxy-agent %s: %v", id, err)
	}
	err := goharness.Eventually(context.Background(), patience, 20*time.Millisecond, func() error {
		code, body, err := httpGet(s.health, "/readyz")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("[setup] proxy-server never ready with agent %s: %v\n%s", id, err, s.p.Tail(30))
	}
	return a
}

// dialOptions are what kube-apiserver's egress selector passes for the
// Unix socket (a context dialer, insecure credentials, the path as the
// target), or mTLS credentials for TCP. The dialer counts the connections
// grpc-go opens.
func (s *server) dialOptions(t testing.TB) (target string, opts []grpc.DialOption) {
	t.Helper()
	if s.front == uds {
		return s.uds, []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				s.dialsSeen.Add(1)
				var d net.Dialer
				return d.DialContext(ctx, "unix", s.uds)
			}),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		}
	}
	cert, err := tls.LoadX509KeyPair(pki.frontCert, pki.frontKey)
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return s.addr, []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			s.dialsSeen.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithTransportCredentials(creds),
	}
}

// metrics is the server's /metrics text.
func (s *server) metrics(t testing.TB) string {
	t.Helper()
	code, body, err := httpGet(s.admin, "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("proxy-server /metrics: %d %v", code, err)
	}
	return body
}

// metric is the value of the sample `name{labels}` (labels exactly as
// rendered, e.g. `service_method="Proxy"`), 0 when absent.
func metric(text, name, labels string) float64 {
	want := name
	if labels != "" {
		want += "{" + labels + "}"
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, want+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

// waitMetric waits until cond holds for the server's metrics text.
func (s *server) waitMetric(t testing.TB, what string, cond func(text string) bool) {
	t.Helper()
	var last string
	err := goharness.Eventually(context.Background(), patience, 20*time.Millisecond, func() error {
		code, body, err := httpGet(s.admin, "/metrics")
		if err != nil || code != 200 {
			return fmt.Errorf("/metrics: %d %v", code, err)
		}
		last = body
		if !cond(body) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("proxy-server metrics: want %s: %v\n%s", what, err, grepMetrics(last, "konnectivity_network_proxy_server_"))
	}
}

func grepMetrics(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) && !strings.Contains(l, "_bucket") {
			out = append(out, "    "+l)
		}
	}
	return strings.Join(out, "\n")
}

func httpGet(addr, path string) (int, string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// listen is a loopback listener closed when the test ends, serving each
// connection with handle.
func listen(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return l.Addr().String()
}

// echoDest writes back what it reads.
func echoDest(t testing.TB) string {
	return listen(t, func(c net.Conn) {
		defer c.Close()
		_, _ = io.Copy(c, c)
	})
}

// refusedAddr is a loopback port that refuses connections until the test
// ends (goharness.RefusedAddr).
func refusedAddr(t testing.TB) string {
	addr, release, err := goharness.RefusedAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}

// blackholeAddr never completes a TCP handshake until the test ends
// (goharness.BlackholeAddr).
func blackholeAddr(t testing.TB) string {
	addr, release, err := goharness.BlackholeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}

// pattern is n deterministic bytes for seed.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// divergence says where got first differs from want: equal, a clean
// prefix (bytes lost at the end) or a difference at an offset (bytes lost
// or changed in the middle), so a failure tells truncation from reordering.
func divergence(got, want []byte) string {
	n := min(len(got), len(want))
	for i := 0; i < n; i++ {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	switch {
	case len(got) == len(want):
		return "equal"
	case len(got) < len(want):
		return fmt.Sprintf("a clean prefix: the last %d bytes are missing", len(want)-len(got))
	default:
		return fmt.Sprintf("%d bytes too many after the expected end", len(got)-len(want))
	}
}

// echoRoundTrip writes data in 64 KiB writes while reading it back, and
// reports each read's size to progress (may be nil).
func echoRoundTrip(c net.Conn, data []byte, progress *atomic.Int64) error {
	werr := make(chan error, 1)
	go func() {
		for off := 0; off < len(data); off += 64 << 10 {
			if _, err := c.Write(data[off:min(len(data), off+64<<10)]); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 64<<10)
	for len(got) < len(data) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if progress != nil {
			progress.Add(int64(n))
		}
		if err != nil {
			return fmt.Errorf("read %d of %d echoed bytes: %w", len(got), len(data), err)
		}
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	for i := range data {
		if got[i] != data[i] {
			return fmt.Errorf("echoed byte %d differs", i)
		}
	}
	return nil
}
