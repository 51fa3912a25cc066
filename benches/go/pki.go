package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
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
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bench-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &benchPKI{CA: filepath.Join(dir, "ca.crt"), caPool: x509.NewCertPool()}
	p.caPool.AddCert(caCert)
	if err := writePEM(p.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	serial := int64(2)
	issue := func(name string, server bool, dns ...string) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(7 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
		}
		serial++
		if server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.DNSNames = append([]string{"localhost"}, dns...)
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", "", err
		}
		cert, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if err := writePEM(cert, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		if err := writePEM(keyPath, "PRIVATE KEY", keyDER); err != nil {
			return "", "", err
		}
		return cert, keyPath, nil
	}
	if p.ServerCert, p.ServerKey, err = issue("proxy-server", true); err != nil {
		return nil, err
	}
	if p.AgentCert, p.AgentKey, err = issue("proxy-agent", false); err != nil {
		return nil, err
	}
	if p.DestCert, p.DestKey, err = issue("destination", true, sniName); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
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
