package clients

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"konnectivity-goharness"
)

const clientModule = "sigs.k8s.io/apiserver-network-proxy/konnectivity-client"

var (
	// serverBin and agentBin are our binaries under test.
	serverBin, agentBin string
	// clientVersion is the konnectivity-client this build links.
	clientVersion string
	ca            *goharness.CA
	pki           struct{ serverCert, serverKey, agentCert, agentKey, frontCert, frontKey string }
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		clientVersion = linkedVersion()
		if err := resolveBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, "clients: "+err.Error())
			return 1
		}
		dir, err := os.MkdirTemp("", "kic-pki-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "clients:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if err := newPKI(dir); err != nil {
			fmt.Fprintln(os.Stderr, "clients: PKI:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "clients: konnectivity-client %s against %s\n", clientVersion, serverBin)
		return m.Run()
	}()
	// Every test kills its processes in t.Cleanup; one still running here
	// is a harness bug (a leak), so it fails the run after being killed.
	if n := goharness.KillAll(); n > 0 {
		fmt.Fprintf(os.Stderr, "clients: FAIL: %d child processes were still running at exit (killed now)\n", n)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// linkedVersion is the konnectivity-client version this build links: what
// `go list -m` says under the same GOFLAGS (run.sh selects a version with
// GOFLAGS=-modfile=…; a test binary carries no module list of its own).
func linkedVersion() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", clientModule).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// resolveBinaries takes ours from INTEROP_RUST_BIN_DIR, else builds them
// with cargo in the workspace three levels up.
func resolveBinaries() error {
	dir := os.Getenv("INTEROP_RUST_BIN_DIR")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		root := filepath.Clean(filepath.Join(wd, "..", "..", ".."))
		start := time.Now()
		cmd := exec.Command("cargo", "build", "--bins", "-p", "proxy-server", "-p", "proxy-agent")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("cargo build --bins -p proxy-server -p proxy-agent in %s: %v (or set INTEROP_RUST_BIN_DIR to prebuilt binaries)", root, err)
		}
		fmt.Fprintf(os.Stderr, "clients: cargo build took %s\n", time.Since(start).Round(time.Millisecond))
		dir = filepath.Join(root, "target", "debug")
	}
	serverBin, agentBin = filepath.Join(dir, "proxy-server"), filepath.Join(dir, "proxy-agent")
	for _, p := range []string{serverBin, agentBin} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable (INTEROP_RUST_BIN_DIR=%q)", p, os.Getenv("INTEROP_RUST_BIN_DIR"))
		}
	}
	return nil
}

func newPKI(dir string) error {
	var err error
	if ca, err = goharness.NewCA(dir, "clients-test-ca", 24*time.Hour); err != nil {
		return err
	}
	if pki.serverCert, pki.serverKey, err = ca.Issue("proxy-server", true, "kubernetes"); err != nil {
		return err
	}
	if pki.agentCert, pki.agentKey, err = ca.Issue("proxy-agent", false); err != nil {
		return err
	}
	pki.frontCert, pki.frontKey, err = ca.Issue("kube-apiserver", false)
	return err
}
