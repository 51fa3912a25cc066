package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"konnectivity-goharness"
)

// subject is one implementation under test: its processes (whose CPU and
// memory are measured) and how a client reaches a destination through it.
type subject struct {
	name  string
	procs []*proc
	dial  dialFunc
	// what the Konnectivity subjects expose for readiness and health
	uds          string
	serverHealth string
	agentHealth  string
	serverAdmin  string // /metrics
	agentAdmin   string
}

func (s *subject) pids() []int {
	var out []int
	for _, p := range s.procs {
		if !p.Exited() {
			out = append(out, goharness.Tree(p.Pid())...)
		}
	}
	return out
}

func (s *subject) cpu() float64 { return cpuSeconds(s.pids()) }

func (s *subject) mem() (rss, hwm int64) { return memKiB(s.pids()) }

func (s *subject) stop() {
	for _, p := range s.procs {
		p.Kill()
	}
}

// alive fails when one of the subject's processes died.
func (s *subject) alive() error {
	for _, p := range s.procs {
		if p.Exited() {
			return fmt.Errorf("%s: %s exited (log: %s)\n%s", s.name, p.Name, p.logPath, p.Tail(20))
		}
	}
	return nil
}

const (
	ours     = "ours"
	upstream = "upstream"
)

// --- Konnectivity: proxy-server + proxy-agent -----------------------------

// Flags both implementations get. They follow upstream's documented
// deployment (examples/kind/konnectivity-{server,agent-ds}.yaml of v0.36.0):
// UDS frontend with --server-port=0, --keepalive-time=1h, agents with
// --sync-interval=5s --sync-interval-cap=30s --probe-interval=5s; agents
// authenticate with mTLS (--cluster-ca-cert) instead of service-account
// tokens, which need a kube-apiserver. All ports on 127.0.0.1.
func serverArgs(impl, mode, uds string, ports map[string]int) []string {
	args := []string{
		"--logtostderr=true",
		"--mode=" + mode,
		"--uds-name=" + uds,
		"--delete-existing-uds-file=true",
		"--server-port=0",
		"--cluster-cert=" + pki.ServerCert,
		"--cluster-key=" + pki.ServerKey,
		"--cluster-ca-cert=" + pki.CA,
		"--agent-bind-address=127.0.0.1",
		"--agent-port=" + strconv.Itoa(ports["agent"]),
		"--health-bind-address=127.0.0.1",
		"--health-port=" + strconv.Itoa(ports["health"]),
		"--admin-bind-address=127.0.0.1",
		"--admin-port=" + strconv.Itoa(ports["admin"]),
		"--keepalive-time=1h",
		"--server-count=1",
		"--server-id=bench-server",
	}
	// Both mains default to -v=4; the same level for both keeps logging
	// cost out of the comparison.
	args = append(args, fmt.Sprintf("-v=%d", *flagUpstreamV))
	return args
}

func agentArgs(impl string, serverAgentPort int, health, admin int) []string {
	args := []string{
		"--logtostderr=true",
		"--ca-cert=" + pki.CA,
		"--agent-cert=" + pki.AgentCert,
		"--agent-key=" + pki.AgentKey,
		"--proxy-server-host=127.0.0.1",
		"--proxy-server-port=" + strconv.Itoa(serverAgentPort),
		"--health-server-host=127.0.0.1",
		"--health-server-port=" + strconv.Itoa(health),
		"--admin-bind-address=127.0.0.1",
		"--admin-server-port=" + strconv.Itoa(admin),
		"--agent-id=bench-agent",
		"--sync-interval=5s",
		"--sync-interval-cap=30s",
		"--probe-interval=5s",
	}
	// Both mains default to -v=4; the same level for both keeps logging
	// cost out of the comparison.
	args = append(args, fmt.Sprintf("-v=%d", *flagUpstreamV))
	return args
}

func bin(impl, name string) string {
	if impl == ours {
		return filepath.Join(oursBinDir, name)
	}
	return filepath.Join(upstreamBinDir, "upstream-"+name)
}

var udsSeq int

// agentExtra: more flags for the next agents started (see startAgentWith).
var agentExtra []string

// startServer starts a proxy-server and waits until /healthz answers and
// its agent port and Unix socket accept connections.
func startServer(impl, mode string) (*proc, string, map[string]string, error) {
	udsSeq++
	uds := filepath.Join(workDir, fmt.Sprintf("k%d.sock", udsSeq))
	ports := map[string]int{"agent": 0, "health": 0, "admin": 0}
	if impl == upstream {
		// Upstream validates ports (no 0) and does not log them.
		for k := range ports {
			ports[k] = pickPort()
		}
	}
	p, err := startProc(impl+" proxy-server", bin(impl, "proxy-server"), serverArgs(impl, mode, uds, ports))
	if err != nil {
		return nil, "", nil, err
	}
	addrs := map[string]string{}
	if impl == ours {
		if addrs, err = listeningAddrs(p, "agent", "health", "admin"); err != nil {
			p.Kill()
			return nil, "", nil, err
		}
	} else {
		for k, v := range ports {
			addrs[k] = goharness.Loopback(v)
		}
	}
	err = goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error {
		if p.Exited() {
			return fmt.Errorf("exited")
		}
		if err := want200(addrs["health"], "/healthz"); err != nil {
			return err
		}
		if err := goharness.Probe("tcp", addrs["agent"]); err != nil {
			return err
		}
		return goharness.Probe("unix", uds)
	})
	if err != nil {
		p.Kill()
		return nil, "", nil, fmt.Errorf("%s proxy-server not ready: %v (log: %s)\n%s", impl, err, p.logPath, p.Tail(20))
	}
	return p, uds, addrs, nil
}

// startAgent starts a proxy-agent and waits until its /readyz is 200 (it
// holds a stream to the server) and the server's /readyz is 200 (it has a
// backend). It returns the agent's health and admin addresses.
func startAgent(impl string, serverAddrs map[string]string) (*proc, string, string, error) {
	return startAgentID(impl, serverAddrs, "bench-agent")
}

// startAgentID is startAgent with an agent ID of its own (many agents on
// one server).
func startAgentID(impl string, serverAddrs map[string]string, id string) (*proc, string, string, error) {
	health, admin := 0, 0
	if impl == upstream {
		health, admin = pickPort(), pickPort()
	}
	agentPort, _ := strconv.Atoi(serverAddrs["agent"][strings.LastIndexByte(serverAddrs["agent"], ':')+1:])
	args := agentArgs(impl, agentPort, health, admin)
	for i, a := range args {
		if strings.HasPrefix(a, "--agent-id=") {
			args[i] = "--agent-id=" + id
		}
	}
	args = append(args, agentExtra...)
	p, err := startProc(impl+" proxy-agent "+id, bin(impl, "proxy-agent"), args)
	if err != nil {
		return nil, "", "", err
	}
	healthAddr, adminAddr := goharness.Loopback(health), goharness.Loopback(admin)
	if impl == ours {
		addrs, err := listeningAddrs(p, "health", "admin")
		if err != nil {
			p.Kill()
			return nil, "", "", err
		}
		healthAddr, adminAddr = addrs["health"], addrs["admin"]
	}
	err = goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error {
		if p.Exited() {
			return fmt.Errorf("exited")
		}
		if err := want200(healthAddr, "/readyz"); err != nil {
			return err
		}
		return want200(serverAddrs["health"], "/readyz")
	})
	if err != nil {
		p.Kill()
		return nil, "", "", fmt.Errorf("%s proxy-agent not ready: %v (log: %s)\n%s", impl, err, p.logPath, p.Tail(20))
	}
	return p, healthAddr, adminAddr, nil
}

// startKonn starts a server and one agent of impl; mode is grpc or
// http-connect and decides the client (kube-apiserver's gRPC or
// HTTP-CONNECT dialer over the Unix socket).
func startKonn(impl, mode string) (*subject, error) {
	srv, uds, addrs, err := startServer(impl, mode)
	if err != nil {
		return nil, err
	}
	ag, agentHealth, agentAdmin, err := startAgent(impl, addrs)
	if err != nil {
		srv.Kill()
		return nil, err
	}
	s := &subject{name: impl, procs: []*proc{srv, ag}, uds: uds, serverHealth: addrs["health"], agentHealth: agentHealth,
		serverAdmin: addrs["admin"], agentAdmin: agentAdmin}
	if mode == "grpc" {
		s.dial = grpcUDS(uds)
	} else {
		s.dial = connectUDS(uds)
	}
	return s, nil
}

// --- HAProxy, nginx, tinyproxy -------------------------------------------

// The anchors run with their Debian packages' defaults except what a
// private instance on loopback needs (ports, foreground, no logging to
// syslog). Buffer sizes: HAProxy tune.bufsize and nginx's stream
// proxy_buffer_size default to 16 KiB, as nodeport-proxy's -buffer-size.
// Threads: HAProxy nbthread and nginx worker_processes default to one per
// core, as nodeport-proxy's -worker-threads.

type haproxyFrontend struct {
	name    string
	port    int
	unix    string // bind this Unix socket instead of port
	backend string // host:port
	sni     bool   // route on req.ssl_sni == sniName
	// TLS between two HAProxy hops (the floor chains): bindTLS terminates
	// mutual TLS with the proxy-server certificate; backendTLS connects
	// with the agent's client certificate, verifying the peer by the CA.
	bindTLS, backendTLS bool
}

func haproxyBin() string { return sbin("haproxy") }

func sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin"} {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name)
		}
	}
	return name
}

func startHAProxy(fronts []haproxyFrontend) (*subject, error) {
	return startHAProxyWith(fronts, false)
}

// startHAProxyWith is startHAProxy with `option splice-auto` in the
// defaults when splice is set (issue 39's anchor: HAProxy relaying kernel to
// kernel where it judges it worth it).
func startHAProxyWith(fronts []haproxyFrontend, splice bool) (*subject, error) {
	var b strings.Builder
	b.WriteString("global\n  # nbthread: one per core (default); no log target\n\n")
	b.WriteString("defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n")
	if splice {
		b.WriteString("  option splice-auto\n")
	}
	b.WriteString("\n")
	for _, f := range fronts {
		bind := fmt.Sprintf("127.0.0.1:%d", f.port)
		if f.unix != "" {
			bind = "unix@" + f.unix
		}
		if f.bindTLS {
			pem, err := combinedPEM(pki.ServerCert, pki.ServerKey)
			if err != nil {
				return nil, err
			}
			bind += fmt.Sprintf(" ssl crt %s ca-file %s verify required", pem, pki.CA)
		}
		fmt.Fprintf(&b, "frontend %s\n  bind %s\n", f.name, bind)
		if f.sni {
			fmt.Fprintf(&b, "  tcp-request inspect-delay 10s\n  tcp-request content accept if { req.ssl_hello_type 1 }\n")
			fmt.Fprintf(&b, "  use_backend be_%s if { req.ssl_sni -i %s }\n\n", f.name, sniName)
		} else {
			fmt.Fprintf(&b, "  default_backend be_%s\n\n", f.name)
		}
		server := f.backend
		if f.backendTLS {
			pem, err := combinedPEM(pki.AgentCert, pki.AgentKey)
			if err != nil {
				return nil, err
			}
			server += fmt.Sprintf(" ssl crt %s ca-file %s verify required", pem, pki.CA)
		}
		fmt.Fprintf(&b, "backend be_%s\n  server s1 %s\n\n", f.name, server)
	}
	cfg := filepath.Join(workDir, fmt.Sprintf("haproxy-%d.cfg", time.Now().UnixNano()))
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc("HAProxy", haproxyBin(), []string{"-db", "-f", cfg})
	if err != nil {
		return nil, err
	}
	s := &subject{name: "HAProxy", procs: []*proc{p}}
	if err := waitPorts(s, fronts2ports(fronts)...); err != nil {
		return nil, err
	}
	for _, f := range fronts {
		if f.unix == "" {
			continue
		}
		if err := goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error { return goharness.Probe("unix", f.unix) }); err != nil {
			s.stop()
			return nil, fmt.Errorf("HAProxy not ready on %s: %w", f.unix, err)
		}
	}
	return s, nil
}

func fronts2ports(fs []haproxyFrontend) []int {
	var out []int
	for _, f := range fs {
		if f.unix == "" {
			out = append(out, f.port)
		}
	}
	return out
}

// combinedPEM writes certificate and key into one file (HAProxy's crt).
func combinedPEM(cert, key string) (string, error) {
	c, err := os.ReadFile(cert)
	if err != nil {
		return "", err
	}
	k, err := os.ReadFile(key)
	if err != nil {
		return "", err
	}
	out := strings.TrimSuffix(cert, ".crt") + ".pem"
	return out, os.WriteFile(out, append(c, k...), 0o600)
}

// The floors (issue 18.1): what the same relaying costs when it is done by
// HAProxy in the same shape as our processes, measured in the same run.
const (
	floorTLS   = "HAProxy two hops + TLS"
	floorPlain = "HAProxy two hops"
)

// startFloorChain starts two HAProxy processes in series, hop 1 → hop 2 →
// dest. With withTLS (the Konnectivity shape: proxy-server, a TLS link,
// proxy-agent) the client reaches hop 1 over a Unix socket and the hops
// speak mutual TLS with the proxy-server and agent certificates; without
// it (the tunnel-agent → nodeport-proxy shape) every leg is plain TCP.
// Each client connection gets its own hop-to-hop connection (and, with
// TLS, its own handshake), which bulk transfers amortize.
func startFloorChain(withTLS bool, dest string) (*subject, error) {
	mid := pickPort()
	hop2, err := startHAProxy([]haproxyFrontend{{name: "hop2", port: mid, backend: dest, bindTLS: withTLS}})
	if err != nil {
		return nil, err
	}
	first := haproxyFrontend{name: "hop1", backend: goharness.Loopback(mid), backendTLS: withTLS}
	name := floorPlain
	if withTLS {
		udsSeq++
		first.unix = filepath.Join(workDir, fmt.Sprintf("h%d.sock", udsSeq))
		name = floorTLS
	} else {
		first.port = pickPort()
	}
	hop1, err := startHAProxy([]haproxyFrontend{first})
	if err != nil {
		hop2.stop()
		return nil, err
	}
	s := &subject{name: name, procs: []*proc{hop1.procs[0], hop2.procs[0]}}
	if withTLS {
		s.dial = unixTo(first.unix)
	} else {
		s.dial = tcpTo(goharness.Loopback(first.port))
	}
	return s, nil
}

// waitPorts waits until every port accepts connections.
func waitPorts(s *subject, ports ...int) error {
	err := goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error {
		if err := s.alive(); err != nil {
			return err
		}
		for _, port := range ports {
			if err := goharness.Probe("tcp", goharness.Loopback(port)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.stop()
		return fmt.Errorf("%s not ready: %w", s.name, err)
	}
	return nil
}

func nginxModule() string {
	for _, f := range []string{"/usr/lib/nginx/modules/ngx_stream_module.so", "/usr/share/nginx/modules/ngx_stream_module.so"} {
		if _, err := os.Stat(f); err == nil {
			return f
		}
	}
	return ""
}

// startNginx: stream {} with ssl_preread routing on $ssl_preread_server_name
// for sniPort and a plain relay on plainPort.
func startNginx(sniPort int, tlsBackend string, plainPort int, plainBackend string) (*subject, error) {
	dir := filepath.Join(workDir, fmt.Sprintf("nginx-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`load_module %s;
daemon off;
master_process on;
worker_processes auto;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 20000; }
stream {
  map $ssl_preread_server_name $sni_backend {
    %s %s;
    default 127.0.0.1:1;
  }
  server {
    listen 127.0.0.1:%d;
    ssl_preread on;
    preread_timeout 10s;
    proxy_pass $sni_backend;
  }
  server {
    listen 127.0.0.1:%d;
    proxy_pass %s;
  }
}
`, nginxModule(), dir, dir, sniName, tlsBackend, sniPort, plainPort, plainBackend)
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc("nginx", sbin("nginx"), []string{"-p", dir, "-e", dir + "/error.log", "-c", cfg})
	if err != nil {
		return nil, err
	}
	s := &subject{name: "nginx", procs: []*proc{p}}
	return s, waitPorts(s, sniPort, plainPort)
}

func startTinyproxy(port int) (*subject, error) {
	dir := filepath.Join(workDir, fmt.Sprintf("tinyproxy-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	user := ""
	if os.Getuid() == 0 {
		user = "User nobody\nGroup nogroup\n"
	}
	conf := fmt.Sprintf(`Port %d
Listen 127.0.0.1
Timeout 600
MaxClients 1000
LogLevel Warning
%s`, port, user)
	cfg := filepath.Join(dir, "tinyproxy.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc("tinyproxy", sbin("tinyproxy"), []string{"-d", "-c", cfg})
	if err != nil {
		return nil, err
	}
	s := &subject{name: "tinyproxy", procs: []*proc{p}}
	return s, waitPorts(s, port)
}

// --- nodeport-proxy and tunnel-agent ---------------------------------------

type npPorts struct{ sni, tunnel, stats, nodePort int }

const (
	tlsAuthority   = "tls.bench.svc.cluster.local:443"
	plainAuthority = "plain.bench.svc.cluster.local:7000"
)

// startNodeportProxy serves a table with a TLS Service (SNI + tunneling)
// and a plain one (NodePort + tunneling), with default flags otherwise
// (extra flags follow the ports).
func startNodeportProxy(tlsBackend, plainBackend string, extra ...string) (*subject, npPorts, error) {
	return startNodeportProxyAt(bin(ours, "nodeport-proxy"), tlsBackend, plainBackend, extra...)
}

// startNodeportProxyAt is startNodeportProxy with the binary given (an
// older build as the anchor of a before/after run, BENCH_NP_BASE).
func startNodeportProxyAt(binary, tlsBackend, plainBackend string, extra ...string) (*subject, npPorts, error) {
	pp := npPorts{sni: pickPort(), tunnel: pickPort(), stats: pickPort(), nodePort: pickPort()}
	tlsHost, tlsPort := splitHostPort(tlsBackend)
	plainHost, plainPort := splitHostPort(plainBackend)
	table := fmt.Sprintf(`services:
  - metadata:
      namespace: bench
      name: tls
      creationTimestamp: "2024-01-01T00:00:00Z"
      annotations:
        nodeport-proxy.k8s.io/expose: "SNI, Tunneling"
        nodeport-proxy.k8s.io/port-mapping: '{"https": "%s"}'
    spec:
      type: ClusterIP
      ports:
        - {name: https, port: 443, protocol: TCP}
  - metadata:
      namespace: bench
      name: plain
      creationTimestamp: "2024-01-01T00:00:00Z"
      annotations:
        nodeport-proxy.k8s.io/expose: "NodePort, Tunneling"
    spec:
      type: NodePort
      ports:
        - {name: tcp, port: 7000, nodePort: %d, protocol: TCP}
endpointSlices:
  - metadata:
      namespace: bench
      name: tls-1
      labels: {kubernetes.io/service-name: tls}
    ports: [{name: https, port: %s, protocol: TCP}]
    endpoints:
      - addresses: ["%s"]
        conditions: {ready: true}
  - metadata:
      namespace: bench
      name: plain-1
      labels: {kubernetes.io/service-name: plain}
    ports: [{name: tcp, port: %s, protocol: TCP}]
    endpoints:
      - addresses: ["%s"]
        conditions: {ready: true}
`, sniName, pp.nodePort, tlsPort, tlsHost, plainPort, plainHost)
	cfg := filepath.Join(workDir, fmt.Sprintf("nodeport-table-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(cfg, []byte(table), 0o644); err != nil {
		return nil, pp, err
	}
	p, err := startProc("nodeport-proxy", binary, append([]string{
		"-config", cfg,
		"-bind-address", "127.0.0.1",
		"-envoy-sni-port", strconv.Itoa(pp.sni),
		"-envoy-tunneling-port", strconv.Itoa(pp.tunnel),
		"-envoy-stats-port", strconv.Itoa(pp.stats),
	}, extra...))
	if err != nil {
		return nil, pp, err
	}
	s := &subject{name: "ours", procs: []*proc{p}}
	if err := waitPorts(s, pp.sni, pp.tunnel, pp.nodePort); err != nil {
		return nil, pp, err
	}
	if err := goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error { return want200(goharness.Loopback(pp.stats), "/healthz") }); err != nil {
		s.stop()
		return nil, pp, err
	}
	return s, pp, nil
}

func splitHostPort(a string) (string, string) {
	i := strings.LastIndexByte(a, ':')
	return a[:i], a[i+1:]
}

// startTunnelAgent: one local listener tunneled to authority over one h2c
// connection to nodeport-proxy's tunneling port; ready when /ready is 200.
func startTunnelAgent(tunnelPort int, authority string) (*proc, int, error) {
	return startTunnelAgentAt(bin(ours, "tunnel-agent"), tunnelPort, authority)
}

// startTunnelAgentAt is startTunnelAgent with the binary given (an older
// build as the anchor of a before/after run, BENCH_NP_BASE).
func startTunnelAgentAt(binary string, tunnelPort int, authority string) (*proc, int, error) {
	listen, stats := pickPort(), pickPort()
	p, err := startProc("tunnel-agent", binary, []string{
		"-proxy-host", "127.0.0.1",
		"-proxy-port", strconv.Itoa(tunnelPort),
		"-listener", fmt.Sprintf("127.0.0.1:%d=%s", listen, authority),
		"-stats-address", "127.0.0.1",
		"-stats-port", strconv.Itoa(stats),
	})
	if err != nil {
		return nil, 0, err
	}
	err = goharness.Eventually(context.Background(), startPatience, time.Millisecond, func() error {
		if p.Exited() {
			return fmt.Errorf("exited")
		}
		if err := want200(goharness.Loopback(stats), "/ready"); err != nil {
			return err
		}
		return goharness.Probe("tcp", goharness.Loopback(listen))
	})
	if err != nil {
		p.Kill()
		return nil, 0, fmt.Errorf("tunnel-agent not ready: %v (log: %s)\n%s", err, p.logPath, p.Tail(20))
	}
	return p, listen, nil
}
