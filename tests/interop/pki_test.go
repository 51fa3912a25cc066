package interop

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
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
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "interop-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
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
	p := &testPKI{CA: filepath.Join(dir, "ca.crt"), caPool: x509.NewCertPool()}
	p.caPool.AddCert(caCert)
	if err := writePEM(p.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	serial := int64(2)
	issue := func(name string, server bool) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
		}
		serial++
		if server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.DNSNames = []string{"localhost", "kubernetes"}
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
	if p.FrontendCert, p.FrontendKey, err = issue("kube-apiserver", false); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
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
