package main

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"konnectivity-goharness"
)

// benchPKI is one CA (ECDSA P-256, as the interop suite uses) and the
// identities of the run, as PEM files: the proxy-server's serving
// certificate, the agents' client certificate, and the TLS destination's
// certificate for the SNI name the nodeport workloads route on.
type benchPKI struct {
	CA                    string
	ServerCert, ServerKey string
	AgentCert, AgentKey   string
	DestCert, DestKey     string

	caPool *x509.CertPool
}

const sniName = "bench.sni.example"

func newPKI(dir string) (*benchPKI, error) {
	ca, err := goharness.NewCA(dir, "bench-ca", 7*24*time.Hour)
	if err != nil {
		return nil, err
	}
	p := &benchPKI{CA: ca.Cert, caPool: ca.Pool}
	if p.ServerCert, p.ServerKey, err = ca.Issue("proxy-server", true); err != nil {
		return nil, err
	}
	if p.AgentCert, p.AgentKey, err = ca.Issue("proxy-agent", false); err != nil {
		return nil, err
	}
	if p.DestCert, p.DestKey, err = ca.Issue("destination", true, sniName); err != nil {
		return nil, err
	}
	return p, nil
}

// destTLS is the TLS destination's server config (Go defaults: TLS 1.3,
// X25519, AES-128-GCM on CPUs with AES instructions).
func (p *benchPKI) destTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.DestCert, p.DestKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// clientTLS verifies the destination by sniName; no session cache, so every
// connection is a full handshake.
func (p *benchPKI) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: p.caPool, ServerName: sniName, MinVersion: tls.VersionTLS12}
}
