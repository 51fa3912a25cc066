package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"konnectivity-goharness"
)

// proc is a child process started by one test. Killing it (t.Cleanup) also
// saves its log to $INTEROP_LOG_DIR when that is set.
type proc struct {
	*goharness.Proc
	test  string
	saved sync.Once
}

// killAllProcs kills every child still running (a test that died without
// its cleanup) and returns how many there were.
func killAllProcs() int { return goharness.KillAll() }

// upstreamNoise is the upstream agent's per-sync log line, left out of the
// log tails in failure messages.
func upstreamNoise(line string) bool { return strings.Contains(line, "Determined server count") }

// startProc starts path with args, with our binaries' default log filter
// (as an operator runs them) unless INTEROP_RUST_LOG asks for more.
func startProc(t testing.TB, name, path string, args []string) *proc {
	t.Helper()
	opts := goharness.Options{Drop: []string{"RUST_LOG="}, Noise: upstreamNoise}
	if lvl := os.Getenv("INTEROP_RUST_LOG"); lvl != "" {
		opts.Env = []string{"RUST_LOG=" + lvl}
	}
	hp, err := goharness.Start(name, path, args, opts)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Proc: hp, test: t.Name()}
	t.Cleanup(p.kill)
	return p
}

func (p *proc) kill() {
	p.Kill()
	dir := os.Getenv("INTEROP_LOG_DIR")
	if dir == "" {
		return
	}
	p.saved.Do(func() {
		name := strings.NewReplacer(" ", "_", "/", "_", ",", "_", "=", "-").Replace(p.test + "_" + p.Name)
		text := strings.Join(p.Lines(), "\n") + "\n"
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, p.Pid())), []byte(text), 0o644)
	})
}
