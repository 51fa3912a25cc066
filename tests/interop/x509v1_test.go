package interop

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"konnectivity-goharness"
)

// TestX509V1ServerCertificate: a proxy server whose certificate is X.509 v1
// (what `openssl x509 -req` makes without an extensions file) serves it, and
// every agent refuses it, because a v1 certificate has no subjectAltName:
// upstream's Go agent with Go's "legacy Common Name field" error, ours with
// a sentence naming the cause and the remedy. Same decision, whoever serves.
func TestX509V1ServerCertificate(t *testing.T) {
	dir := t.TempDir()
	ssl := func(args ...string) {
		t.Helper()
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=v1-test-ca")
	ssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
	ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-out", "server.crt")
	if err := os.WriteFile(filepath.Join(dir, "agent.ext"), []byte("extendedKeyUsage=clientAuth\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "agent.key", "-out", "agent.csr", "-subj", "/CN=agent")
	ssl("x509", "-req", "-in", "agent.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-out", "agent.crt", "-extfile", "agent.ext")
	ca, cert, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")

	want := map[impl][]string{
		upstream: {"cannot connect once", "x509: certificate relies on legacy Common Name field, use SANs instead"},
		ours:     {"cannot connect to proxy server", "X.509 v1", "no subjectAltName", "reissue it as v3"},
	}
	for _, srvImpl := range []impl{ours, upstream} {
		t.Run("server="+string(srvImpl), func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, serverConfig{impl: srvImpl, front: grpcUDS, clusterCert: cert, clusterKey: key})
			for _, agImpl := range []impl{ours, upstream} {
				health, admin := 0, 0
				if agImpl.isUpstream() { // upstream refuses port 0
					var err error
					if health, err = goharness.PickPort(); err == nil {
						admin, err = goharness.PickPort()
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				args := []string{
					"--ca-cert=" + ca,
					"--agent-cert=" + filepath.Join(dir, "agent.crt"),
					"--agent-key=" + filepath.Join(dir, "agent.key"),
					"--proxy-server-host=127.0.0.1",
					"--proxy-server-port=" + strconv.Itoa(srv.agentPort),
					"--health-server-host=127.0.0.1",
					"--health-server-port=" + strconv.Itoa(health),
					"--admin-bind-address=127.0.0.1",
					"--admin-server-port=" + strconv.Itoa(admin),
					"--sync-interval=100ms",
				}
				a := startProc(t, string(agImpl)+" proxy-agent (v1 server certificate)", bin[agImpl]["agent"], args)
				if line, _, err := a.WaitLine(0, 30*time.Second, want[agImpl]...); err != nil {
					t.Errorf("[%s proxy-agent -> %s proxy-server with a v1 certificate] want a refusal with %q: %v\n%s", agImpl, srvImpl, want[agImpl], err, a.Tail(20))
				} else {
					t.Logf("%s agent: %s", agImpl, line)
				}
				if a.Exited() {
					t.Errorf("%s proxy-agent exited; it must keep retrying", agImpl)
				}
				a.kill()
			}
		})
	}
}
