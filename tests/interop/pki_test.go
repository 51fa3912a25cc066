package interop

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"

	"konnectivity-goharness"
)

// testPKI is one CA plus the identities the run needs, as PEM files:
// the proxy server's serving certificate (agent listener and TCP frontend),
// the agents' client certificate and the frontend client (kube-apiserver's)
// certificate for HTTP-CONNECT over mTLS.
type testPKI struct {
	CA                        string
	ServerCert, ServerKey     string
	AgentCert, AgentKey       string
	FrontendCert, FrontendKey string

	caPool *x509.CertPool
}

func newPKI(dir string) (*testPKI, error) {
	ca, err := goharness.NewCA(dir, "interop-test-ca", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	p := &testPKI{CA: ca.Cert, caPool: ca.Pool}
	if p.ServerCert, p.ServerKey, err = ca.Issue("proxy-server", true, "kubernetes"); err != nil {
		return nil, err
	}
	if p.AgentCert, p.AgentKey, err = ca.Issue("proxy-agent", false); err != nil {
		return nil, err
	}
	if p.FrontendCert, p.FrontendKey, err = ca.Issue("kube-apiserver", false); err != nil {
		return nil, err
	}
	return p, nil
}

// frontendTLS is what kube-apiserver builds from an egress selector's
// tcp.tlsConfig (caBundle, clientCert, clientKey; no tlsServerName, so the
// URL's host is verified).
func (p *testPKI) frontendTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.FrontendCert, p.FrontendKey)
	if err != nil {
		return nil, fmt.Errorf("frontend client cert: %w", err)
	}
	return &tls.Config{RootCAs: p.caPool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
