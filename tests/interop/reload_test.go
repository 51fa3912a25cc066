package interop

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"konnectivity-goharness"
)

// Certificate and CA hot reload (issue 17.5), against real peers: the Go
// TLS stack as kube-apiserver dials the frontend, upstream's agent on our
// server's agent port, and upstream's server for our agent. The files live
// in a Secret-volume layout (tls.crt -> ..data/tls.crt, ..data -> vN) and
// are rotated the way kubelet does it: a new ..data symlink renamed over the
// old one.

const (
	mServerCertExpiry = "konnectivity_network_proxy_server_certificate_expiration_timestamp_seconds"
	mServerTLSReloads = "konnectivity_network_proxy_server_tls_reloads_total"
	mAgentCertExpiry  = "konnectivity_network_proxy_agent_certificate_expiration_timestamp_seconds"
	mAgentTLSReloads  = "konnectivity_network_proxy_agent_tls_reloads_total"
)

// secret is a directory laid out as kubelet lays out a Secret volume.
type secret struct {
	t       testing.TB
	dir     string
	version int
}

func newSecret(t testing.TB, cert, key, ca string) *secret {
	s := &secret{t: t, dir: t.TempDir()}
	s.update(cert, key, ca)
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(s.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *secret) path(f string) string { return filepath.Join(s.dir, f) }

// update writes the files (paths to copy) into a new version directory and
// swaps ..data to it atomically.
func (s *secret) update(cert, key, ca string) {
	s.version++
	v := "..v" + strconv.Itoa(s.version)
	if err := os.Mkdir(filepath.Join(s.dir, v), 0o700); err != nil {
		s.t.Fatal(err)
	}
	for name, from := range map[string]string{"tls.crt": cert, "tls.key": key, "ca.crt": ca} {
		b, err := os.ReadFile(from)
		if err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.dir, v, name), b, 0o600); err != nil {
			s.t.Fatal(err)
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		s.t.Fatal(err)
	}
}

// notAfter is the expiry of the first certificate in a PEM file.
func notAfter(t testing.TB, path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return float64(c.NotAfter.Unix())
}

// waitMetric waits until every series named in want has its value.
func waitMetric(scrapeAddr string, name string, want map[string]float64, labels func(string) map[string]string) error {
	return goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
		m, err := scrape(scrapeAddr)
		if err != nil {
			return err
		}
		for k, w := range want {
			if v, _ := m.get(name, labels(k)); v != w {
				return fmt.Errorf("%s%v = %v, want %v", name, labels(k), v, w)
			}
		}
		return nil
	})
}

// dialConnectTLS is dialConnect over TCP with a given client TLS config.
func dialConnectTLS(ctx context.Context, cfg *tls.Config, proxy, addr string) (net.Conn, error) {
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", proxy)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(40 * time.Second)); err != nil {
		c.Close()
		return nil, err
	}
	if err := connectHandshake(c, addr, false); err != nil {
		c.Close()
		return nil, err
	}
	return c, c.SetDeadline(time.Time{})
}

func TestCertificateReload(t *testing.T) {
	caB, err := goharness.NewCA(t.TempDir(), "reload-ca-b", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bServer, bServerKey, err := caB.Issue("proxy-server", true, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	bFront, bFrontKey, err := caB.Issue("kube-apiserver", false)
	if err != nil {
		t.Fatal(err)
	}
	bAgent, bAgentKey, err := caB.Issue("proxy-agent", false)
	if err != nil {
		t.Fatal(err)
	}

	// Our server: both listeners' certificate, key and CA rotated from CA A
	// to CA B while a tunnel and an agent stream are open.
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		sec := newSecret(t, pki.ServerCert, pki.ServerKey, pki.CA)
		srv := startServer(t, serverConfig{impl: ours, front: connectTLS, tlsDir: sec.dir})
		startAgent(t, upstream, srv.agentPort, "agent-ca-a")
		if err := srv.waitBackends(1); err != nil {
			t.Fatalf("[setup] %v", err)
		}
		byKey := func(k string) map[string]string {
			tlsName, flag, _ := strings.Cut(k, "/")
			return map[string]string{"tls": tlsName, "flag": flag}
		}
		aExp, bExp := notAfter(t, pki.ServerCert), notAfter(t, bServer)
		if aExp == bExp {
			t.Fatalf("[setup] both certificates expire at %v", aExp)
		}
		if err := waitMetric(srv.healthAddr, mServerCertExpiry, map[string]float64{
			"frontend/server-cert": aExp, "frontend/server-ca-cert": notAfter(t, pki.CA),
			"agent/cluster-cert": aExp, "agent/cluster-ca-cert": notAfter(t, pki.CA),
		}, byKey); err != nil {
			t.Fatalf("expiry of the certificates loaded at start: %v", err)
		}

		dest := newTCPDest(t, echoHandler)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		aCfg, err := pki.frontendTLS()
		if err != nil {
			t.Fatal(err)
		}
		old, err := dialConnectTLS(ctx, aCfg, srv.frontAddr, dest.addr)
		if err != nil {
			t.Fatalf("dial with CA A's client certificate before the rotation: %v", err)
		}
		defer old.Close()
		if err := roundtrip(old, []byte("before")); err != nil {
			t.Fatal(err)
		}

		sec.update(bServer, bServerKey, caB.Cert)
		if err := waitMetric(srv.healthAddr, mServerCertExpiry, map[string]float64{
			"frontend/server-cert": bExp, "frontend/server-ca-cert": notAfter(t, caB.Cert),
			"agent/cluster-cert": bExp, "agent/cluster-ca-cert": notAfter(t, caB.Cert),
		}, byKey); err != nil {
			t.Fatalf("after the ..data swap to CA B's files: %v\n%s", err, srv.p.Tail(20))
		}
		if err := roundtrip(old, []byte("after the rotation")); err != nil {
			t.Errorf("the tunnel opened before the rotation: %v", err)
		}
		if err := srv.waitBackends(1); err != nil {
			t.Errorf("the agent stream opened before the rotation: %v", err)
		}

		// New handshakes use the new material: CA A's client no longer
		// trusts the server (and the server no longer trusts it) ...
		if c, err := dialConnectTLS(ctx, aCfg, srv.frontAddr, dest.addr); err == nil {
			c.Close()
			t.Errorf("a client of CA A was still accepted after the rotation to CA B")
		}
		// ... while CA B's client and CA B's (upstream) agent get in.
		cert, err := tls.LoadX509KeyPair(bFront, bFrontKey)
		if err != nil {
			t.Fatal(err)
		}
		bCfg := &tls.Config{RootCAs: caB.Pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		c, err := dialConnectTLS(ctx, bCfg, srv.frontAddr, dest.addr)
		if err != nil {
			t.Fatalf("dial with CA B's client certificate after the rotation: %v", err)
		}
		if err := roundtrip(c, []byte("new")); err != nil {
			t.Error(err)
		}
		c.Close()
		startAgent(t, upstream, srv.agentPort, "agent-ca-b",
			"--ca-cert="+caB.Cert, "--agent-cert="+bAgent, "--agent-key="+bAgentKey)
		if err := srv.waitBackends(2); err != nil {
			t.Errorf("an agent of CA B after the rotation: %v", err)
		}

		// A broken certificate: refused, logged, counted; B stays in use.
		broken := filepath.Join(t.TempDir(), "broken.crt")
		if err := os.WriteFile(broken, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		mark := srv.p.Mark()
		sec.update(broken, bServerKey, caB.Cert)
		results := func(k string) map[string]string {
			tlsName, result, _ := strings.Cut(k, "/")
			return map[string]string{"tls": tlsName, "result": result}
		}
		if err := waitMetric(srv.healthAddr, mServerTLSReloads, map[string]float64{
			"frontend/success": 1, "frontend/failure": 1, "agent/success": 1, "agent/failure": 1,
		}, results); err != nil {
			t.Fatalf("after a broken certificate: %v", err)
		}
		if _, _, err := srv.p.WaitLine(mark, startPatience, "cannot be loaded", "--server-cert", "holds no PEM certificate"); err != nil {
			t.Errorf("no log line naming the flag and the cause: %v", err)
		}
		c, err = dialConnectTLS(ctx, bCfg, srv.frontAddr, dest.addr)
		if err != nil {
			t.Fatalf("dial with CA B's client after a broken certificate was written: %v", err)
		}
		c.Close()
		if err := waitMetric(srv.healthAddr, mServerCertExpiry, map[string]float64{"frontend/server-cert": bExp}, byKey); err != nil {
			t.Error(err)
		}
	})

	// Our agent, against upstream's server: its identity and CA rotated to
	// CA B while connected; the stream stays, and the next connection (to a
	// server of CA B that accepts only CA B's clients) uses the new files.
	t.Run("agent", func(t *testing.T) {
		t.Parallel()
		srvA := startServer(t, serverConfig{impl: upstream, front: grpcUDS})
		sec := newSecret(t, pki.AgentCert, pki.AgentKey, pki.CA)
		a := startAgent(t, ours, srvA.agentPort, "agent-reload",
			"--agent-cert="+sec.path("tls.crt"), "--agent-key="+sec.path("tls.key"), "--ca-cert="+sec.path("ca.crt"))
		if err := srvA.waitBackends(1); err != nil {
			t.Fatalf("[setup] %v", err)
		}
		byFlag := func(k string) map[string]string { return map[string]string{"tls": "server", "flag": k} }
		if err := waitMetric(a.healthAddr, mAgentCertExpiry, map[string]float64{
			"agent-cert": notAfter(t, pki.AgentCert), "ca-cert": notAfter(t, pki.CA),
		}, byFlag); err != nil {
			t.Fatal(err)
		}
		sec.update(bAgent, bAgentKey, caB.Cert)
		if err := waitMetric(a.healthAddr, mAgentCertExpiry, map[string]float64{
			"agent-cert": notAfter(t, bAgent), "ca-cert": notAfter(t, caB.Cert),
		}, byFlag); err != nil {
			t.Fatalf("after the ..data swap: %v\n%s", err, a.p.Tail(20))
		}
		if err := a.waitConnected(1); err != nil {
			t.Errorf("the stream opened before the rotation: %v", err)
		}
		// Replace the server by one of CA B on the same port.
		port := srvA.agentPort
		srvA.p.kill()
		if err := a.waitConnected(0); err != nil {
			t.Fatal(err)
		}
		secB := newSecret(t, bServer, bServerKey, caB.Cert)
		srvB := startServer(t, serverConfig{impl: upstream, front: grpcUDS, agentPort: port, tlsDir: secB.dir})
		if err := srvB.waitBackends(1); err != nil {
			t.Fatalf("our agent did not reach the CA B server with its reloaded files: %v\n%s", err, a.p.Tail(20))
		}
		m, err := a.metrics()
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := m.get(mAgentTLSReloads, map[string]string{"tls": "server", "result": "success"}); v != 1 {
			t.Errorf("%s{result=success} = %v, want 1", mAgentTLSReloads, v)
		}
	})
}
