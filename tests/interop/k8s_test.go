package interop

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"konnectivity-goharness"
)

// kube is a real etcd and kube-apiserver for the lease scenarios, from the
// harness binaries tests/k8s/build.sh builds ($K8S_BIN_DIR, else
// tests/k8s/bin). Admin access is a static token.
type kube struct {
	bin        string
	kubeconfig string
}

var (
	kubeOnce sync.Once
	kubeErr  error
	kubeOne  *kube
	// kubeProcs live as long as the test binary; killAllProcs ends them.
	kubeProcs []*goharness.Proc
	// kubeDir holds etcd's data and the cluster's files (about 120 MB).
	kubeDir string
)

// stopKube ends the shared cluster and removes its files (TestMain, before
// it counts leaks).
func stopKube() {
	for _, p := range kubeProcs {
		p.Kill()
	}
	if kubeDir != "" {
		os.RemoveAll(kubeDir)
	}
}

// sharedKube starts one cluster per test binary, on first use.
func sharedKube(t testing.TB) *kube {
	t.Helper()
	kubeOnce.Do(func() { kubeOne, kubeErr = startKube() })
	if kubeErr != nil {
		t.Fatalf("[setup] kube-apiserver for the lease scenarios: %v", kubeErr)
	}
	return kubeOne
}

func k8sBinDir() string {
	if d := os.Getenv("K8S_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(moduleDir(), "..", "k8s", "bin")
}

func startKube() (*kube, error) {
	bin := k8sBinDir()
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s missing in %s: run tests/interop/run.sh (it builds them there when missing), or tests/k8s/build.sh, or set K8S_BIN_DIR", b, bin)
		}
	}
	dir, err := os.MkdirTemp("", "interop-kube-")
	if err != nil {
		return nil, err
	}
	kubeDir = dir
	etcd, err := goharness.Start("etcd", filepath.Join(bin, "etcd"), []string{"--data-dir=" + filepath.Join(dir, "etcd")}, goharness.Options{})
	if err != nil {
		return nil, err
	}
	kubeProcs = append(kubeProcs, etcd)
	line, _, err := etcd.WaitLine(0, 60*time.Second, "etcd ready")
	if err != nil {
		return nil, fmt.Errorf("etcd: %v\n%s", err, etcd.Tail(20))
	}
	etcdURL := strings.TrimSpace(strings.SplitN(line, "client=", 2)[1])
	// The service-account signing key, in the SEC1 form kube-apiserver reads.
	saKey := filepath.Join(dir, "sa.key")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	const token = "interop-admin-token"
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}
	var api *goharness.Proc
	var port int
	for attempt := 0; attempt < 3; attempt++ {
		if port, err = goharness.PickPort(); err != nil {
			return nil, err
		}
		api, err = goharness.Start("kube-apiserver", filepath.Join(bin, "kube-apiserver"), []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(dir, "certs"),
			"--tls-cert-file=" + pki.ServerCert,
			"--tls-private-key-file=" + pki.ServerKey,
			"--client-ca-file=" + pki.CA,
			"--token-auth-file=" + tokens,
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + saKey,
			"--service-account-signing-key-file=" + saKey,
			"--service-cluster-ip-range=10.96.0.0/16",
			"--authorization-mode=RBAC",
			"--enable-priority-and-fairness=false",
			"--profiling=false",
			"--v=1",
		}, goharness.Options{})
		if err != nil {
			return nil, err
		}
		kubeProcs = append(kubeProcs, api)
		if _, _, err = api.WaitLine(0, 90*time.Second, "Serving securely on"); err == nil {
			break
		}
		api.Kill()
	}
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %v\n%s", err, api.Tail(30))
	}
	k := &kube{bin: bin, kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:%d\n    certificate-authority: %s\nusers:\n- name: u\n  user:\n    token: %s\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n", port, pki.CA, token)
	if err := os.WriteFile(k.kubeconfig, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// Ready when the API answers.
	err = goharness.Eventually(context.Background(), 90*time.Second, 200*time.Millisecond, func() error {
		_, err := k.kubectl("get", "--raw=/readyz")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver never ready: %v\n%s", err, api.Tail(30))
	}
	return k, nil
}

// kubectl runs kubectl against the cluster and returns its output.
func (k *kube) kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(k.bin, "kubectl"), append([]string{"--kubeconfig=" + k.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// apply applies a manifest given as text.
func (k *kube) apply(manifest string) error {
	cmd := exec.Command(filepath.Join(k.bin, "kubectl"), "--kubeconfig="+k.kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %v: %s", err, out)
	}
	return nil
}

// expiredLease is a proxy-server Lease whose holder stopped renewing it an
// hour ago: the servers' garbage collection deletes it.
func expiredLease(ns, name string) string {
	renewed := time.Now().Add(-time.Hour).UTC().Format("2006-01-02T15:04:05.000000Z")
	return fmt.Sprintf(`apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: %s
  namespace: %s
  labels:
    k8s-app: konnectivity-server
spec:
  holderIdentity: gone
  leaseDurationSeconds: 30
  renewTime: "%s"
`, name, ns, renewed)
}
