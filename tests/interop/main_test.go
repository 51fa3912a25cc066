package interop

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// impl says whose binary plays a role.
type impl string

const (
	ours     impl = "ours"
	upstream impl = "upstream" // v0.36.0, go.mod's
)

// upstreamAt is an older upstream release, built with go.<version>.mod
// into a directory of its own (versions_test.go).
func upstreamAt(version string) impl { return impl("upstream@" + version) }

// isUpstream: any upstream release (they all pick their ports the same way).
func (i impl) isUpstream() bool { return i == upstream || strings.HasPrefix(string(i), "upstream@") }

// bin maps (impl, role) to an executable path.
var bin = map[impl]map[string]string{}

// pki is the throw-away PKI every process in the run shares.
var pki *testPKI

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if err := resolveBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, "interop: "+err.Error())
			return 1
		}
		dir, err := os.MkdirTemp("", "interop-pki-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if pki, err = newPKI(dir); err != nil {
			fmt.Fprintln(os.Stderr, "interop: PKI:", err)
			return 1
		}
		defer stopKube()
		return m.Run()
	}()
	// Every test kills its processes in t.Cleanup; one still running here
	// is a harness bug (a leak), so it fails the run after being killed.
	if n := killAllProcs(); n > 0 {
		fmt.Fprintf(os.Stderr, "interop: FAIL: %d child processes were still running at exit (killed now)\n", n)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// moduleDir is tests/interop (go test runs in the package directory).
func moduleDir() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return wd
}

func resolveBinaries() error {
	// Ours: prebuilt from INTEROP_RUST_BIN_DIR, else cargo build in the
	// workspace two levels up.
	rustDir := os.Getenv("INTEROP_RUST_BIN_DIR")
	if rustDir == "" {
		root := filepath.Clean(filepath.Join(moduleDir(), "..", ".."))
		start := time.Now()
		cmd := exec.Command("cargo", "build", "--bins", "-p", "proxy-server", "-p", "proxy-agent")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("cargo build --bins -p proxy-server -p proxy-agent in %s: %v (or set INTEROP_RUST_BIN_DIR to prebuilt binaries)", root, err)
		}
		fmt.Fprintf(os.Stderr, "interop: cargo build took %s\n", time.Since(start).Round(time.Millisecond))
		rustDir = filepath.Join(root, "target", "debug")
	}
	bin[ours] = map[string]string{
		"server": filepath.Join(rustDir, "proxy-server"),
		"agent":  filepath.Join(rustDir, "proxy-agent"),
	}

	// Upstream: prebuilt from INTEROP_UPSTREAM_BIN_DIR, else go build into
	// the cache dir (tests/interop/bin by default). go build reuses the Go
	// build cache, so a warm run only relinks.
	upDir := os.Getenv("INTEROP_UPSTREAM_BIN_DIR")
	if upDir == "" {
		upDir = os.Getenv("INTEROP_CACHE_DIR")
		if upDir == "" {
			upDir = filepath.Join(moduleDir(), "bin")
		}
		start := time.Now()
		cmd := exec.Command("go", "build", "-o", upDir+string(filepath.Separator),
			"./cmd/upstream-proxy-server", "./cmd/upstream-proxy-agent")
		cmd.Dir = moduleDir()
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build of the upstream binaries: %v", err)
		}
		fmt.Fprintf(os.Stderr, "interop: go build of upstream v0.36.0 binaries took %s\n", time.Since(start).Round(time.Millisecond))
	}
	bin[upstream] = map[string]string{
		"server": filepath.Join(upDir, "upstream-proxy-server"),
		"agent":  filepath.Join(upDir, "upstream-proxy-agent"),
	}
	// Older releases (versions_test.go): go.<version>.mod pins each; the
	// binaries go to <dir>/<version>/.
	for _, v := range olderVersions() {
		dir := filepath.Join(upDir, v)
		if os.Getenv("INTEROP_UPSTREAM_BIN_DIR") == "" {
			start := time.Now()
			cmd := exec.Command("go", "build", "-modfile=go."+v+".mod", "-o", dir+string(filepath.Separator),
				"./cmd/upstream-proxy-server", "./cmd/upstream-proxy-agent")
			cmd.Dir = moduleDir()
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("go build -modfile=go.%s.mod of the upstream %s binaries: %v", v, v, err)
			}
			fmt.Fprintf(os.Stderr, "interop: go build of upstream %s binaries took %s\n", v, time.Since(start).Round(time.Millisecond))
		}
		bin[upstreamAt(v)] = map[string]string{
			"server": filepath.Join(dir, "upstream-proxy-server"),
			"agent":  filepath.Join(dir, "upstream-proxy-agent"),
		}
	}
	var missing []string
	for _, m := range bin {
		for _, p := range m {
			if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				missing = append(missing, p)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("binaries missing or not executable: %s", strings.Join(missing, ", "))
	}
	return nil
}
