package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process (a proxy under test). Its output goes to a log
// file and is kept line by line so readiness can wait on log lines.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time

	mu      sync.Mutex
	lines   []string
	changed chan struct{}
	exited  bool
	waitErr error
	done    chan struct{}
}

var (
	procsMu sync.Mutex
	procs   = map[*proc]struct{}{}
	logSeq  int
)

// startProc starts path with args; the kernel kills it if the harness dies
// (Pdeathsig) and killAll kills it at the end.
func startProc(name, path string, args []string, extraEnv ...string) (*proc, error) {
	cmd := exec.Command(path, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RUST_LOG=") && !strings.HasPrefix(kv, "GODEBUG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "NO_COLOR=1")
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	procsMu.Lock()
	logSeq++
	seq := logSeq
	procsMu.Unlock()
	logPath := filepath.Join(workDir, "logs", fmt.Sprintf("%03d-%s.log", seq, strings.NewReplacer(" ", "-", "/", "-").Replace(name)))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &proc{name: name, cmd: cmd, logPath: logPath, changed: make(chan struct{}), done: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	procsMu.Lock()
	procs[p] = struct{}{}
	procsMu.Unlock()
	go func() {
		defer f.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		w := bufio.NewWriter(f)
		for sc.Scan() {
			line := sc.Text()
			_, _ = w.WriteString(line)
			_ = w.WriteByte('\n')
			p.mu.Lock()
			if len(p.lines) < 2000 {
				p.lines = append(p.lines, line)
			}
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		_ = w.Flush()
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
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// kill sends SIGKILL to the process and every descendant (nginx's
// workers outlive a killed master otherwise) and waits until it is reaped.
func (p *proc) kill() {
	if !p.hasExited() && os.Getenv("BENCH_TERM_FIRST") != "" {
		// Debugging aid (e.g. valgrind --tool=massif writes its profile
		// at exit): SIGTERM first, SIGKILL after 20 s.
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
		}
	}
	if !p.hasExited() {
		desc := tree(p.pid())[1:]
		_ = p.cmd.Process.Kill()
		for _, pid := range desc {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	procsMu.Lock()
	delete(procs, p)
	procsMu.Unlock()
}

// killAll kills every child still running; it returns how many were alive.
func killAll() int {
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

// waitLine waits for a line at index >= from containing every needle.
func (p *proc) waitLine(from int, timeout time.Duration, needles ...string) (string, int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
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
			return "", 0, fmt.Errorf("%s exited (%v) before logging %q (log: %s)\n%s", p.name, werr, needles, p.logPath, p.tail(20))
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", 0, fmt.Errorf("%s logged no line with %q within %s (log: %s)\n%s", p.name, needles, timeout, p.logPath, p.tail(20))
		}
	}
}

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := max(len(p.lines)-n, 0)
	var b strings.Builder
	for _, l := range p.lines[start:] {
		b.WriteString("    | ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// field is the value of key=value in a log line (quotes trimmed).
func field(line, key string) string {
	for _, w := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// listeningAddrs waits for one `listening listener=<name> addr=<addr>` line
// per wanted name (our binaries log one per bound socket) and returns the
// loopback address of each.
func listeningAddrs(p *proc, names ...string) (map[string]string, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]string{}
	from := 0
	for len(out) < len(want) {
		l, next, err := p.waitLine(from, startPatience, "listening", "listener=")
		if err != nil {
			return nil, err
		}
		from = next
		name := field(l, "listener")
		if !want[name] {
			continue
		}
		addr := field(l, "addr")
		i := strings.LastIndexByte(addr, ':')
		if i < 0 {
			return nil, fmt.Errorf("%s: no port in %q", p.name, l)
		}
		port, err := strconv.Atoi(addr[i+1:])
		if err != nil {
			return nil, fmt.Errorf("%s: bad port in %q", p.name, l)
		}
		out[name] = loopback(port)
	}
	return out, nil
}

const startPatience = 60 * time.Second

// eventually polls cond every interval until it returns nil or the timeout
// passes. Readiness is always an endpoint or a socket answering, never a
// fixed sleep.
func eventually(timeout, interval time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
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

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func httpStatus(addr, path string) (int, error) {
	res, err := httpc.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	res.Body.Close()
	return res.StatusCode, nil
}

func want200(addr, path string) error {
	code, err := httpStatus(addr, path)
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("GET %s%s = %d", addr, path, code)
	}
	return nil
}

func probe(network, addr string) error {
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Ports for the anchors (and for ours where a port has to be known before
// start): below Linux's ephemeral range, never handed out twice, free when
// picked.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

func pickPort() int {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := 20000 + rand.IntN(12000)
		if portsUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", loopback(p))
		if err != nil {
			continue
		}
		l.Close()
		portsUsed[p] = true
		return p
	}
	fatalf("no free port found")
	return 0
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// --- /proc accounting ---------------------------------------------------

// tree is pid plus all its descendants (nginx's workers).
func tree(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := statFields(string(st))
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], n)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// statFields are the fields of /proc/pid/stat after the command name
// (index 0 = state, 1 = ppid, ..., 11 = utime, 12 = stime).
func statFields(s string) []string {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

const clkTck = 100 // sysconf(_SC_CLK_TCK) on Linux

// cpuSeconds is utime+stime of the processes (all their threads).
func cpuSeconds(pids []int) float64 {
	var ticks int64
	for _, pid := range pids {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		f := statFields(string(st))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return float64(ticks) / clkTck
}

// memKiB is the sum of VmRSS and of VmHWM (peak RSS) of the processes.
func memKiB(pids []int) (rss, hwm int64) {
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "VmRSS":
				rss += n
			case "VmHWM":
				hwm += n
			}
		}
	}
	return rss, hwm
}
