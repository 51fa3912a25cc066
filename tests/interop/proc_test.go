package interop

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one child process with its combined output kept line by line so
// tests can wait for log lines and show the tail of the log on failure.
type proc struct {
	name string // e.g. "ours proxy-server"
	test string // the test that started it
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every new line and on exit
	exited  bool
	waitErr error
	done    chan struct{}
}

var (
	procsMu sync.Mutex
	procs   = map[*proc]struct{}{}
)

// killAllProcs kills every child still running (end of the run, or a test
// that died without its cleanup). It returns how many it had to kill.
func killAllProcs() int {
	procsMu.Lock()
	list := make([]*proc, 0, len(procs))
	for p := range procs {
		list = append(list, p)
	}
	procsMu.Unlock()
	n := 0
	for _, p := range list {
		if !p.hasExited() {
			n++
		}
		p.kill()
	}
	return n
}

// startProc starts path with args. The child is killed by the kernel if the
// test binary dies (Pdeathsig), by t.Cleanup, and by TestMain at the end.
func startProc(t testing.TB, name, path string, args []string) *proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	for _, kv := range os.Environ() {
		// Our binaries' default log filter, as an operator runs them.
		if !strings.HasPrefix(kv, "RUST_LOG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "NO_COLOR=1")
	if lvl := os.Getenv("INTEROP_RUST_LOG"); lvl != "" {
		cmd.Env = append(cmd.Env, "RUST_LOG="+lvl) // debugging our binaries
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &proc{name: name, test: t.Name(), cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s (%s): %v", name, path, err)
	}
	procsMu.Lock()
	procs[p] = struct{}{}
	procsMu.Unlock()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			if len(p.lines) > 50000 {
				p.lines = append([]string(nil), p.lines[25000:]...)
			}
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		p.mu.Lock()
		p.exited, p.waitErr = true, err
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *proc) kill() {
	if !p.hasExited() {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	procsMu.Lock()
	_, first := procs[p]
	delete(procs, p)
	procsMu.Unlock()
	if dir := os.Getenv("INTEROP_LOG_DIR"); dir != "" && first {
		p.mu.Lock()
		text := strings.Join(p.lines, "\n") + "\n"
		p.mu.Unlock()
		name := strings.NewReplacer(" ", "_", "/", "_", ",", "_", "=", "-").Replace(p.test + "_" + p.name)
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, p.pid())), []byte(text), 0o644)
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// mark is the number of lines seen so far; waitLine(from=mark) only looks
// at lines logged afterwards.
func (p *proc) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// waitLine waits for a line at index >= from that contains every needle;
// it returns the line and the index after it.
func (p *proc) waitLine(from int, timeout time.Duration, needles ...string) (string, int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		if from > len(p.lines) {
			from = 0 // the buffer was trimmed
		}
		for ; from < len(p.lines); from++ {
			l := p.lines[from]
			ok := true
			for _, n := range needles {
				if !strings.Contains(l, n) {
					ok = false
					break
				}
			}
			if ok {
				p.mu.Unlock()
				return l, from + 1, nil
			}
		}
		exited, werr, ch := p.exited, p.waitErr, p.changed
		p.mu.Unlock()
		if exited {
			return "", 0, fmt.Errorf("%s exited (%v) before logging %q\n%s", p.name, werr, needles, p.tail(40))
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", 0, fmt.Errorf("%s logged no line with %q within %s\n%s", p.name, needles, timeout, p.tail(40))
		}
	}
}

// tail is the last n lines, indented, for failure messages.
func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := len(p.lines)
	for kept := 0; start > 0 && kept < n; start-- {
		if !strings.Contains(p.lines[start-1], "Determined server count") {
			kept++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "--- last lines of %s (pid %d) ---\n", p.name, p.cmd.Process.Pid)
	for _, l := range p.lines[start:] {
		if strings.Contains(l, "Determined server count") {
			continue // upstream agent's per-sync noise
		}
		b.WriteString("    ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// grep returns every kept line containing s.
func (p *proc) grep(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// eventually polls cond every interval until it returns nil or timeout
// passes; it returns cond's last error. This is how the suite waits on
// readiness signals that are endpoints (/readyz, /metrics), never a sleep.
func eventually(ctx context.Context, timeout, interval time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var err error
	for {
		if err = cond(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}

// Upstream's binaries validate ports to 1024..49151 (server) and do not log
// the ports they bound, so they get ports picked here: below Linux's
// ephemeral range, never handed out twice in one run, and free when picked.
// A start that loses a race for a port is retried with new ports.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

func pickPort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 500 {
		p := 20000 + rand.IntN(12000)
		if portsUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		portsUsed[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port found")
}

// portOf is the port of a logged bind address like "[::]:1234", "0.0.0.0:1234".
func portOf(addr string) (int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	return strconv.Atoi(addr[i+1:])
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
