// This file is ours, not upstream's: run.sh adds it to upstream's tests/
// package (apiserver-network-proxy v0.36.0) with `go test -overlay`, so that
// upstream's own test suite can run its proxy servers as an external binary
// (our proxy-server), as it can already run an external agent
// (-agent-path). Upstream's framework has no such runner; nothing of
// upstream's is changed or copied.

package tests

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	metricstest "sigs.k8s.io/apiserver-network-proxy/pkg/testing/metrics"
	"sigs.k8s.io/apiserver-network-proxy/tests/framework"
)

// With UPSTREAM_SUITE_SERVER_PATH set, every proxy server of the suite is
// that binary. (init runs before TestMain, which only picks the agent.)
func init() {
	if p := os.Getenv("UPSTREAM_SUITE_SERVER_PATH"); p != "" {
		Framework.ProxyServerRunner = &externalServerRunner{path: p}
	}
}

type externalServerRunner struct{ path string }

type externalServer struct {
	cmd                 *exec.Cmd
	exited              chan struct{}
	uds, agentAddr      string
	healthAddr, adminAd string
	stopOnce            sync.Once
}

// Start runs the binary with the options upstream's in-process runner uses
// (its flags have upstream's names and meaning): the frontend on a Unix
// socket in the framework's certificate directory, the agent port on
// 127.0.0.1 with the framework's test certificates, health and admin on
// 127.0.0.1. Ports are 0 (the binary logs what it bound) unless the test
// asks for an agent port (a server restarted in place).
func (r *externalServerRunner) Start(t testing.TB, opts framework.ProxyServerOpts) (framework.ProxyServer, error) {
	uds := filepath.Join(framework.CertsDir, fmt.Sprintf("server-%s.sock", uuid.New().String()))
	args := []string{
		"--mode=" + opts.Mode,
		"--server-count=" + strconv.Itoa(opts.ServerCount),
		"--server-id=" + uuid.New().String(),
		"--uds-name=" + uds,
		"--server-port=0",
		"--cluster-cert=" + filepath.Join(framework.CertsDir, framework.TestServerCertFile),
		"--cluster-key=" + filepath.Join(framework.CertsDir, framework.TestServerKeyFile),
		"--cluster-ca-cert=" + filepath.Join(framework.CertsDir, framework.TestCAFile),
		"--agent-bind-address=127.0.0.1",
		"--agent-port=" + strconv.Itoa(opts.AgentPort),
		"--health-bind-address=127.0.0.1",
		"--health-port=0",
		"--admin-bind-address=127.0.0.1",
		"--admin-port=0",
	}
	cmd := exec.Command(r.path, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &externalServer{cmd: cmd, exited: make(chan struct{}), uds: uds}
	bound := make(chan map[string]string, 1)
	go s.follow(out, bound)
	go func() { _ = cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.Stop)
	select {
	case addrs := <-bound:
		s.agentAddr, s.healthAddr, s.adminAd = addrs["agent"], addrs["health"], addrs["admin"]
	case <-s.exited:
		return nil, fmt.Errorf("%s exited before listening", r.path)
	case <-time.After(framework.ForeverTestTimeout):
		s.Stop()
		return nil, fmt.Errorf("%s did not log its listeners within %s", r.path, framework.ForeverTestTimeout)
	}
	deadline := time.Now().Add(framework.ForeverTestTimeout)
	for !s.get("/healthz") {
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("%s: /healthz never answered 200", r.path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, nil
}

// follow forwards the binary's log to ours and reports the addresses of
// its `listening listener=… addr=…` lines once agent, health and admin are
// known.
func (s *externalServer) follow(r io.Reader, bound chan<- map[string]string) {
	addrs := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(os.Stdout, "proxy-server: "+line)
		if sent || !strings.Contains(line, "listening") {
			continue
		}
		name, addr := field(line, "listener"), field(line, "addr")
		if name == "" || addr == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(addr); err == nil {
			addrs[name] = net.JoinHostPort("127.0.0.1", port)
		}
		if addrs["agent"] != "" && addrs["health"] != "" && addrs["admin"] != "" {
			bound <- addrs
			sent = true
		}
	}
}

func field(line, key string) string {
	for _, w := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func (s *externalServer) get(path string) bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.healthAddr + path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Stop is what closing the in-process server's stop channel is: SIGTERM,
// then SIGKILL if it has not exited within 10 s.
func (s *externalServer) Stop() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	})
}

func (s *externalServer) AgentAddr() string { return s.agentAddr }
func (s *externalServer) FrontAddr() string { return s.uds }
func (s *externalServer) Ready() bool       { return s.get("/readyz") }

// ConnectedBackends is the number of agents the server holds a stream to
// (upstream counts its backend managers' agent ids).
func (s *externalServer) ConnectedBackends() (int, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.adminAd + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	const name = "konnectivity_network_proxy_server_ready_backend_connections "
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", strings.TrimSpace(name))
}

func (s *externalServer) Metrics() metricstest.ServerTester {
	return &metricstest.Tester{Endpoint: "http://" + s.adminAd + "/metrics"}
}
