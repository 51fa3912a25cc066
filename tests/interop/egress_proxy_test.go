package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"konnectivity-goharness"
)

// TestAgentThroughEgressProxy (issue 38.3, apiserver-network-proxy #127):
// our agent behind a corporate forward proxy (tinyproxy, Debian's, with
// basic authentication) reaches upstream's proxy-server, and ours, with
// --proxy-server-http-proxy: the tunnel is a CONNECT to the server's
// address, the Go client's dials cross it, and when the server restarts
// the agent comes back to it through the proxy. (Upstream's agent has no
// such flag; it follows HTTPS_PROXY through grpc-go, which never proxies a
// loopback server, so it has no counterpart on this loopback-only harness.)
func TestAgentThroughEgressProxy(t *testing.T) {
	for _, im := range []impl{upstream, ours} {
		t.Run("server="+string(im), func(t *testing.T) {
			t.Parallel()
			agentThroughEgressProxy(t, im)
		})
	}
}

func agentThroughEgressProxy(t *testing.T, im impl) {
	proxy, proxyPort := startTinyproxy(t, "BasicAuth alice s3cret\n")
	srv := startServer(t, serverConfig{impl: im, front: grpcUDS})
	a := startAgent(t, ours, srv.agentPort, "agent-egress-"+string(im),
		"--proxy-server-http-proxy=http://alice:s3cret@127.0.0.1:"+strconv.Itoa(proxyPort))
	connectLine := "CONNECT " + goharness.Loopback(srv.agentPort)
	if _, _, err := proxy.WaitLine(0, startPatience, connectLine); err != nil {
		t.Fatalf("tinyproxy never saw the agent's tunnel to the %s server: %v", im, err)
	}
	if _, _, err := a.p.WaitLine(0, startPatience, "opened through the HTTP proxy", "http://127.0.0.1:"+strconv.Itoa(proxyPort)); err != nil {
		t.Fatalf("our agent did not say it went through the proxy: %v", err)
	}
	dest := newTCPDest(t, echoHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	check := func(what string) {
		t.Helper()
		if err := srv.waitBackends(1); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c, err := srv.dial(ctx, dest.addr, false)
		if err != nil {
			t.Fatalf("%s: dial through the %s server and the agent behind the proxy: %v", what, im, err)
		}
		defer c.Close()
		if err := roundtrip(c, []byte(what)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	check("through the proxy")

	// The server restarts on its port: the agent's new stream goes through
	// the proxy again.
	mark := proxy.Mark()
	port, dir := srv.agentPort, srv.dir
	srv.p.kill()
	srv = startServer(t, serverConfig{impl: im, front: grpcUDS, agentPort: port, dir: dir})
	if _, _, err := proxy.WaitLine(mark, startPatience, connectLine); err != nil {
		t.Fatalf("no tunnel through the proxy after the %s server restarted: %v", im, err)
	}
	check("through the proxy after the restart")
	for _, l := range a.p.Lines() {
		if strings.Contains(l, "s3cret") {
			t.Fatalf("our agent logged the proxy password: %s", l)
		}
	}
}

// startTinyproxy runs tinyproxy on a picked loopback port with extra
// configuration lines, and returns it once it is listening.
func startTinyproxy(t testing.TB, extra string) (*proc, int) {
	t.Helper()
	bin, err := exec.LookPath("tinyproxy")
	if err != nil {
		for _, p := range []string{"/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		t.Fatalf("tinyproxy is not installed: run benches/install-deps.sh (apt-get install -y tinyproxy) or scripts/test, which does")
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := goharness.PickPort()
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(t.TempDir(), "tinyproxy.conf")
		text := fmt.Sprintf("Port %d\nListen 127.0.0.1\nTimeout 600\nLogLevel Connect\nUser nobody\nGroup nogroup\n%s", port, extra)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startProc(t, "tinyproxy", bin, []string{"-d", "-c", conf})
		if _, _, err := p.WaitLine(0, startPatience, "Reloading config file finished"); err != nil {
			lastErr = err
			p.kill()
			continue
		}
		// Listening once it accepts (a port taken meanwhile fails here).
		err = goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
			if p.Exited() {
				return fmt.Errorf("tinyproxy exited")
			}
			return goharness.Probe("tcp", goharness.Loopback(port))
		})
		if err == nil {
			return p, port
		}
		lastErr = fmt.Errorf("%v\n%s", err, p.Tail(20))
		p.kill()
	}
	t.Fatalf("[setup of %s] start tinyproxy: %v", t.Name(), lastErr)
	return nil, 0
}
