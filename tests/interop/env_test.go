package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"konnectivity-goharness"
)

// frontend is how the Go client reaches the proxy server.
type frontend string

const (
	grpcUDS    frontend = "grpc-uds"    // kube-apiserver's GRPC + uds egress
	connectUDS frontend = "connect-uds" // HTTPConnect + uds
	connectTLS frontend = "connect-tls" // HTTPConnect + tcp with mTLS
)

func (f frontend) mode() string {
	if f == grpcUDS {
		return "grpc"
	}
	return "http-connect"
}

// pair is who runs the server and who runs the agents; the client is
// always the Go konnectivity-client / kube-apiserver's dialer.
type pair struct{ server, agent impl }

func (p pair) String() string { return fmt.Sprintf("server=%s,agent=%s", p.server, p.agent) }

// describe is the prefix of every failure message.
func describe(scenario string, p pair, f frontend) string {
	return fmt.Sprintf("[scenario %q | Go client -> %s proxy-server -> %s proxy-agent | frontend %s]", scenario, p.server, p.agent, f)
}

const startPatience = 60 * time.Second

// server is one running proxy-server.
type server struct {
	impl  impl
	front frontend
	p     *proc
	id    string

	uds        string // frontend socket (uds frontends)
	frontAddr  string // frontend host:port (connect-tls)
	agentPort  int
	healthAddr string
	adminAddr  string

	// what a restart reuses
	dir string
}

type serverConfig struct {
	impl      impl
	front     frontend
	dir       string // holds the socket; a restart passes the old one
	agentPort int    // 0: ours binds port 0, upstream gets a picked port
	// the agent listener's certificate and key; empty: the PKI's
	clusterCert, clusterKey string
	// a directory with tls.crt, tls.key and ca.crt (a Secret volume) used
	// for both listeners instead of the PKI's files
	tlsDir string
	// --server-count; 0 means 1
	count int
	extra []string // more flags, last
}

func startServer(t testing.TB, cfg serverConfig) *server {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := tryStartServer(t, cfg)
		if err == nil {
			return s
		}
		lastErr = err
		if cfg.impl == ours || cfg.agentPort != 0 {
			break // no port race to retry
		}
	}
	t.Fatalf("[setup of %s] start %s proxy-server (frontend %s): want it listening and healthy: %v", t.Name(), cfg.impl, cfg.front, lastErr)
	return nil
}

func tryStartServer(t testing.TB, cfg serverConfig) (*server, error) {
	s := &server{impl: cfg.impl, front: cfg.front, dir: cfg.dir, id: "server-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if s.dir == "" {
		// Short path: sun_path holds 108 bytes.
		d, err := os.MkdirTemp("", "kio")
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		s.dir = d
	}
	ports := map[string]int{"agent": cfg.agentPort, "health": 0, "admin": 0, "frontend": 0}
	if cfg.impl.isUpstream() {
		for k, v := range ports {
			if v == 0 {
				p, err := goharness.PickPort()
				if err != nil {
					return nil, err
				}
				ports[k] = p
			}
		}
	}
	clusterCert, clusterKey, ca := pki.ServerCert, pki.ServerKey, pki.CA
	serverCert, serverKey := pki.ServerCert, pki.ServerKey
	if cfg.clusterCert != "" {
		clusterCert, clusterKey = cfg.clusterCert, cfg.clusterKey
	}
	if cfg.tlsDir != "" {
		clusterCert, clusterKey = filepath.Join(cfg.tlsDir, "tls.crt"), filepath.Join(cfg.tlsDir, "tls.key")
		serverCert, serverKey, ca = clusterCert, clusterKey, filepath.Join(cfg.tlsDir, "ca.crt")
	}
	args := []string{
		"--mode=" + cfg.front.mode(),
		"--cluster-cert=" + clusterCert,
		"--cluster-key=" + clusterKey,
		"--cluster-ca-cert=" + ca,
		"--agent-bind-address=127.0.0.1",
		"--agent-port=" + strconv.Itoa(ports["agent"]),
		"--health-bind-address=127.0.0.1",
		"--health-port=" + strconv.Itoa(ports["health"]),
		"--admin-bind-address=127.0.0.1",
		"--admin-port=" + strconv.Itoa(ports["admin"]),
		"--server-count=" + strconv.Itoa(max(cfg.count, 1)),
		"--server-id=" + s.id,
	}
	if cfg.front == connectTLS {
		args = append(args,
			"--server-bind-address=127.0.0.1",
			"--server-port="+strconv.Itoa(ports["frontend"]),
			"--server-cert="+serverCert,
			"--server-key="+serverKey,
			"--server-ca-cert="+ca,
		)
	} else {
		s.uds = filepath.Join(s.dir, "konnectivity-server.socket")
		args = append(args, "--uds-name="+s.uds, "--server-port=0")
	}
	args = append(args, cfg.extra...)
	s.p = startProc(t, string(cfg.impl)+" proxy-server", bin[cfg.impl]["server"], args)

	if cfg.impl == ours {
		names := []string{"agent", "health", "admin"}
		if cfg.front == connectTLS {
			names = append(names, "frontend") // else the Unix socket, whose path we chose
		}
		tcp, err := goharness.LoopbackAddrs(s.p.Proc, startPatience, names...)
		if err != nil {
			return nil, err
		}
		if s.agentPort, err = goharness.PortOf(tcp["agent"]); err != nil {
			return nil, err
		}
		s.healthAddr, s.adminAddr, s.frontAddr = tcp["health"], tcp["admin"], tcp["frontend"]
	} else {
		s.agentPort = ports["agent"]
		s.healthAddr = goharness.Loopback(ports["health"])
		s.adminAddr = goharness.Loopback(ports["admin"])
		if cfg.front == connectTLS {
			s.frontAddr = goharness.Loopback(ports["frontend"])
		}
	}
	// Readiness of every socket: /healthz answers, the agent port and the
	// frontend accept connections.
	err := goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
		if s.p.Exited() {
			return fmt.Errorf("exited")
		}
		if bad := s.p.Grep("could not listen"); len(bad) > 0 {
			return fmt.Errorf("bind failed: %s", bad[0])
		}
		if code, _, err := httpGet(s.healthAddr, "/healthz"); err != nil || code != 200 {
			return fmt.Errorf("/healthz: %d %v", code, err)
		}
		if code, _, err := httpGet(s.adminAddr, "/metrics"); err != nil || code != 200 {
			return fmt.Errorf("admin /metrics: %d %v", code, err)
		}
		network, addr := "tcp", goharness.Loopback(s.agentPort)
		if err := goharness.Probe(network, addr); err != nil {
			return err
		}
		if s.uds != "" {
			network, addr = "unix", s.uds
		} else {
			addr = s.frontAddr
		}
		return goharness.Probe(network, addr)
	})
	if err != nil {
		s.p.kill()
		return nil, fmt.Errorf("%v\n%s", err, s.p.Tail(40))
	}
	return s, nil
}

func (s *server) metrics() (metrics, error) {
	if s.impl == upstreamAt("v0.33.0") {
		// v0.33.0 serves /metrics on the admin port only; later releases
		// (and ours) on the health port too.
		return scrape(s.adminAddr)
	}
	return scrape(s.healthAddr)
}

// readyBackends is ready_backends{proxy_strategy="default"}.
func (s *server) readyBackends() (float64, error) {
	m, err := s.metrics()
	if err != nil {
		return 0, err
	}
	if s.impl == upstreamAt("v0.33.0") {
		// v0.34.0 replaced it with ready_backends{proxy_strategy}.
		v, _ := m.get("konnectivity_network_proxy_server_ready_backend_connections", nil)
		return v, nil
	}
	v, _ := m.get(mServerReady, map[string]string{"proxy_strategy": "default"})
	return v, nil
}

// waitBackends waits until the server counts n agents.
func (s *server) waitBackends(n int) error {
	return goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
		v, err := s.readyBackends()
		if err != nil {
			return err
		}
		if int(v) != n {
			return fmt.Errorf("%s proxy-server ready_backends{proxy_strategy=\"default\"} = %g, want %d", s.impl, v, n)
		}
		code, body, err := httpGet(s.healthAddr, "/readyz")
		if err != nil {
			return err
		}
		if (n > 0) != (code == 200) {
			return fmt.Errorf("%s proxy-server /readyz = %d %q with %d agents", s.impl, code, body, n)
		}
		return nil
	})
}

// agent is one running proxy-agent.
type agent struct {
	impl       impl
	id         string
	p          *proc
	healthAddr string
	adminAddr  string
}

func startAgent(t testing.TB, im impl, serverAgentPort int, id string, extra ...string) *agent {
	t.Helper()
	return startAgentWith(t, im, serverAgentPort, id, 1, extra...)
}

// startAgentWith starts an agent and waits until it holds streams to
// servers servers.
func startAgentWith(t testing.TB, im impl, serverAgentPort int, id string, servers int, extra ...string) *agent {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		a, err := tryStartAgent(t, im, serverAgentPort, id, servers, extra...)
		if err == nil {
			return a
		}
		lastErr = err
		if im == ours {
			break
		}
	}
	t.Fatalf("[setup of %s] start %s proxy-agent %s: want it connected (/readyz 200, open_server_connections %d): %v", t.Name(), im, id, servers, lastErr)
	return nil
}

func tryStartAgent(t testing.TB, im impl, serverAgentPort int, id string, servers int, extra ...string) (*agent, error) {
	a := &agent{impl: im, id: id}
	health, admin := 0, 0
	if im.isUpstream() {
		var err error
		if health, err = goharness.PickPort(); err != nil {
			return nil, err
		}
		if admin, err = goharness.PickPort(); err != nil {
			return nil, err
		}
	}
	args := []string{
		"--ca-cert=" + pki.CA,
		"--agent-cert=" + pki.AgentCert,
		"--agent-key=" + pki.AgentKey,
		"--proxy-server-host=127.0.0.1",
		"--proxy-server-port=" + strconv.Itoa(serverAgentPort),
		"--health-server-host=127.0.0.1",
		"--health-server-port=" + strconv.Itoa(health),
		"--admin-bind-address=127.0.0.1",
		"--admin-server-port=" + strconv.Itoa(admin),
		"--agent-id=" + id,
		// upstream's test framework values: quick reconnects.
		"--sync-interval=100ms",
		"--probe-interval=100ms",
		"--sync-interval-cap=1s",
	}
	args = append(args, extra...)
	a.p = startProc(t, string(im)+" proxy-agent "+id, bin[im]["agent"], args)
	if im == ours {
		addrs, err := goharness.LoopbackAddrs(a.p.Proc, startPatience, "health", "admin")
		if err != nil {
			return nil, err
		}
		a.healthAddr, a.adminAddr = addrs["health"], addrs["admin"]
		if _, _, err := a.p.WaitLine(0, startPatience, "connected to proxy server"); err != nil {
			return nil, err
		}
	} else {
		a.healthAddr, a.adminAddr = goharness.Loopback(health), goharness.Loopback(admin)
	}
	if err := a.waitConnected(servers); err != nil {
		a.p.kill()
		return nil, err
	}
	return a, nil
}

// waitConnected waits until /readyz is 200 (n>0) or not (n==0) and the
// open_server_connections gauge is n.
func (a *agent) waitConnected(n int) error {
	err := goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
		if a.p.Exited() {
			return fmt.Errorf("exited")
		}
		if bad := a.p.Grep("could not listen"); len(bad) > 0 {
			return fmt.Errorf("bind failed: %s", bad[0])
		}
		code, body, err := httpGet(a.healthAddr, "/readyz")
		if err != nil {
			return err
		}
		if (n > 0) != (code == 200) {
			return fmt.Errorf("/readyz = %d %q, want ready=%v", code, body, n > 0)
		}
		m, err := scrape(a.healthAddr)
		if err != nil {
			return err
		}
		if v, _ := m.get(mAgentOpenServers, nil); int(v) != n {
			return fmt.Errorf("%s = %g, want %d", mAgentOpenServers, v, n)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s proxy-agent %s: %v\n%s", a.impl, a.id, err, a.p.Tail(40))
	}
	return nil
}

func (a *agent) metrics() (metrics, error) { return scrape(a.healthAddr) }
