package goharness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options tune Start.
type Options struct {
	// Env is added to the inherited environment, after Drop is applied.
	Env []string
	// Drop lists prefixes ("RUST_LOG=") of inherited variables not passed on.
	Drop []string
	// Log receives every output line as well (e.g. a log file) and is
	// closed, if it is an io.Closer, when the output ends; may be nil.
	Log io.Writer
	// Keep is how many lines stay in memory for WaitLine and Tail
	// (default 50,000); older ones are dropped.
	Keep int
	// TermGrace, when set, makes Kill send SIGTERM first and SIGKILL only
	// after this long (for tools that write their results at exit).
	TermGrace time.Duration
	// Noise, when set, marks lines Tail leaves out (periodic chatter).
	Noise func(line string) bool
}

// Proc is a child process with its combined stdout and stderr followed line
// by line, so callers can wait for log lines and show the tail of the log
// on failure. The kernel kills it if the parent dies (Pdeathsig).
type Proc struct {
	Name string
	cmd  *exec.Cmd
	opts Options

	mu      sync.Mutex
	lines   []string
	dropped int           // lines no longer in lines
	changed chan struct{} // closed and replaced on every line and on exit
	exited  bool
	waitErr error
	drained chan struct{} // closed once every output line is in lines
	done    chan struct{}
}

var (
	liveMu sync.Mutex
	live   = map[*Proc]struct{}{}
)

// Start runs path with args.
func Start(name, path string, args []string, opts Options) (*Proc, error) {
	if opts.Keep <= 0 {
		opts.Keep = 50000
	}
	cmd := exec.Command(path, args...)
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, opts.Drop) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "NO_COLOR=1")
	cmd.Env = append(cmd.Env, opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &Proc{Name: name, cmd: cmd, opts: opts, changed: make(chan struct{}), drained: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	liveMu.Lock()
	live[p] = struct{}{}
	liveMu.Unlock()
	go p.follow(pr)
	go func() {
		err := cmd.Wait()
		pw.Close()
		// Exited only once the last lines are kept: WaitLine must not
		// report an exit before a line the child printed just before it.
		<-p.drained
		p.mu.Lock()
		p.exited, p.waitErr = true, err
		p.notifyLocked()
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func (p *Proc) follow(r io.Reader) {
	defer close(p.drained)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var w *bufio.Writer
	if p.opts.Log != nil {
		w = bufio.NewWriter(p.opts.Log)
		defer func() {
			_ = w.Flush()
			if c, ok := p.opts.Log.(io.Closer); ok {
				_ = c.Close()
			}
		}()
	}
	for sc.Scan() {
		line := sc.Text()
		if w != nil {
			_, _ = w.WriteString(line)
			_ = w.WriteByte('\n')
		}
		p.mu.Lock()
		p.lines = append(p.lines, line)
		if len(p.lines) > p.opts.Keep {
			half := len(p.lines) / 2
			p.dropped += half
			p.lines = append([]string(nil), p.lines[half:]...)
		}
		p.notifyLocked()
		p.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r)
}

func (p *Proc) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the child.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited says whether the child has been reaped.
func (p *Proc) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Kill stops the child and every descendant (nginx's workers outlive a
// killed master otherwise) and waits until it is reaped. Calling it again
// does nothing.
func (p *Proc) Kill() {
	var desc []int
	if !p.Exited() {
		// Listed before any signal: a child that exits on SIGTERM leaves its
		// own children to init (a wrapper script around a profiler does),
		// and they must not outlive the run.
		desc = Tree(p.Pid())[1:]
	}
	if !p.Exited() && p.opts.TermGrace > 0 {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(p.opts.TermGrace):
		}
	}
	if !p.Exited() {
		_ = p.cmd.Process.Kill()
	}
	for _, pid := range desc {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	liveMu.Lock()
	delete(live, p)
	liveMu.Unlock()
}

// KillAll kills every child still running (the end of a run, or a caller
// that died before its cleanup) and returns how many were still alive.
func KillAll() int {
	liveMu.Lock()
	list := make([]*Proc, 0, len(live))
	for p := range live {
		list = append(list, p)
	}
	liveMu.Unlock()
	n := 0
	for _, p := range list {
		if !p.Exited() {
			n++
		}
		p.Kill()
	}
	return n
}

// Mark is the index of the next line; WaitLine(Mark(), …) only looks at
// lines logged afterwards.
func (p *Proc) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped + len(p.lines)
}

// WaitLine waits for a line at index >= from that contains every needle
// and returns it with the index after it. It fails when the child exits
// first or timeout passes, with the tail of the log in the error.
func (p *Proc) WaitLine(from int, timeout time.Duration, needles ...string) (string, int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		from = max(from, p.dropped)
		for ; from < p.dropped+len(p.lines); from++ {
			if l := p.lines[from-p.dropped]; containsAll(l, needles) {
				p.mu.Unlock()
				return l, from + 1, nil
			}
		}
		exited, werr, ch := p.exited, p.waitErr, p.changed
		p.mu.Unlock()
		if exited {
			return "", 0, fmt.Errorf("%s exited (%v) before logging %q\n%s", p.Name, werr, needles, p.Tail(40))
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", 0, fmt.Errorf("%s logged no line with %q within %s\n%s", p.Name, needles, timeout, p.Tail(40))
		}
	}
}

func containsAll(s string, needles []string) bool {
	for _, n := range needles {
		if !strings.Contains(s, n) {
			return false
		}
	}
	return true
}

// Tail is the last n lines that are not noise, indented under a header,
// for failure messages.
func (p *Proc) Tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var kept []string
	for i := len(p.lines) - 1; i >= 0 && len(kept) < n; i-- {
		if p.opts.Noise == nil || !p.opts.Noise(p.lines[i]) {
			kept = append(kept, p.lines[i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "--- last lines of %s (pid %d) ---\n", p.Name, p.cmd.Process.Pid)
	for i := len(kept) - 1; i >= 0; i-- {
		b.WriteString("    ")
		b.WriteString(kept[i])
		b.WriteByte('\n')
	}
	return b.String()
}

// Lines is a copy of the lines kept in memory.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// Grep is every kept line that contains s.
func (p *Proc) Grep(s string) []string {
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

// Wait waits up to timeout for the child to exit on its own and returns its
// exit code (-1 when a signal ended it).
func (p *Proc) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return -1, fmt.Errorf("%s still running after %s", p.Name, timeout)
	}
	return p.cmd.ProcessState.ExitCode(), nil
}
