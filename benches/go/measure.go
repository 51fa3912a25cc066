package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"konnectivity-goharness"
)

const mib = 1 << 20

// usage accumulates a subject's CPU seconds (its processes only, from
// /proc/<pid>/stat utime+stime) and bytes moved over the timed runs.
type usage struct {
	cpu   float64
	bytes int64
	runs  int
	// the load generator's own CPU (client and destinations) meanwhile
	genCPU float64
}

func (u *usage) genPerGiB() float64 {
	if u.bytes <= 0 {
		return -1
	}
	return u.genCPU / (float64(u.bytes) / (1 << 30))
}

func (u *usage) cpuPerGiB() float64 {
	if u.bytes <= 0 {
		return -1
	}
	return u.cpu / (float64(u.bytes) / (1 << 30))
}

// timed runs f and adds the subject's CPU time during it to u.
func timed(s *subject, u *usage, f func() (int64, error)) error {
	self := []int{os.Getpid()}
	before, genBefore := s.cpu(), cpuSeconds(self)
	n, err := f()
	u.cpu += s.cpu() - before
	u.genCPU += cpuSeconds(self) - genBefore
	u.bytes += n
	u.runs++
	return err
}

// dialAll opens n connections through s in parallel (at most 64 dials in
// flight), bounded by timeout.
func dialAll(s *subject, dest string, n int, timeout time.Duration) ([]net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conns[i], errs[i] = s.dial(ctx, dest)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(conns)
		return nil, fmt.Errorf("%s: dialing %d connections: %w", s.name, n, firstErr(errs))
	}
	return conns, nil
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// closeAll closes connections in parallel and waits at most 15 s (a
// konnectivity-client Close waits for CLOSE_RSP up to 10 s).
func closeAll(conns []net.Conn) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = c.Close()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
	}
}

// bulk moves total bytes over conns connections in direction dir
// (opDownload or opUpload), each connection size total/conns, and returns
// MiB/s from the first header written to the last byte (dials excluded).
// It fails if the transfer does not finish within limit.
func bulk(s *subject, dest string, conns int, total int64, dir byte, limit time.Duration) (float64, int64, error) {
	cs, err := dialAll(s, dest, conns, 60*time.Second)
	if err != nil {
		return 0, 0, err
	}
	defer closeAll(cs)
	per := total / int64(conns)
	var moved atomic.Int64
	errs := make([]error, conns)
	finished := make([]time.Duration, conns)
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if dir == opDownload {
				errs[i] = clientDownload(c, per, &moved)
			} else {
				errs[i] = clientUpload(c, per, &moved)
			}
			finished[i] = time.Since(start)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		closeAll(cs)
		return 0, moved.Load(), fmt.Errorf("%s: only %d of %d bytes moved within %s", s.name, moved.Load(), total, limit)
	}
	el := time.Since(start)
	if err := firstErr(errs); err != nil {
		return 0, moved.Load(), fmt.Errorf("%s: %w", s.name, err)
	}
	// Debugging aid (BENCH_P10_TRACE=1): when each connection finished, in
	// dial order; a long tail shows connections held back while others ran.
	if conns > 1 && os.Getenv("BENCH_P10_TRACE") != "" {
		var parts []string
		for _, d := range finished {
			parts = append(parts, fmt.Sprintf("%.2f", d.Seconds()))
		}
		logf("   trace %s finished (s, dial order): %s", s.name, strings.Join(parts, " "))
	}
	return float64(per*int64(conns)) / mib / el.Seconds(), per * int64(conns), nil
}

// dialLatency dials n times one after another (new Unix-socket connection
// per dial for the Konnectivity clients), closing each connection after
// the dial, and returns p50, p99 and the mean in milliseconds.
func dialLatency(s *subject, dest string, n int) (p50, p99, mean float64, err error) {
	lat := make([]float64, 0, n)
	var sum float64
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		c, err := s.dial(ctx, dest)
		d := time.Since(t0)
		cancel()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%s: dial: %w", s.name, err)
		}
		ms := float64(d) / float64(time.Millisecond)
		lat = append(lat, ms)
		sum += ms
		_ = c.Close()
	}
	sort.Float64s(lat)
	return quantile(lat, 0.50), quantile(lat, 0.99), sum / float64(max(n, 1)), nil
}

// dialTimes are the totals of the dial-duration histograms both
// implementations export under the same names: the server's from DIAL_REQ
// sent to DIAL_RSP received, the agent's around its connect to the
// destination.
type dialTimes struct {
	server, serverN, agent, agentN float64
}

func (a dialTimes) minus(b dialTimes) dialTimes {
	return dialTimes{a.server - b.server, a.serverN - b.serverN, a.agent - b.agent, a.agentN - b.agentN}
}

func (a dialTimes) plus(b dialTimes) dialTimes {
	return dialTimes{a.server + b.server, a.serverN + b.serverN, a.agent + b.agent, a.agentN + b.agentN}
}

// dialSplit sums one subject's timed P3 repeats: the client's dial times
// and how much the dial histograms grew meanwhile.
type dialSplit struct {
	grown           dialTimes
	clientMs, dials float64
	err             error
}

func (d *dialSplit) add(grown dialTimes, err error, meanMs float64, dials int) {
	if d.err = cmp.Or(d.err, err); d.err == nil {
		d.grown = d.grown.plus(grown)
		d.clientMs += meanMs * float64(dials)
		d.dials += float64(dials)
	}
}

// dialMeans are per-dial means in milliseconds.
type dialMeans struct{ client, server, agent float64 }

func (d *dialSplit) means() (dialMeans, error) {
	if d.err != nil {
		return dialMeans{}, d.err
	}
	if d.dials == 0 || d.grown.serverN == 0 || d.grown.agentN == 0 {
		return dialMeans{}, errors.New("no dials counted")
	}
	return dialMeans{d.clientMs / d.dials, d.grown.server * 1000 / d.grown.serverN, d.grown.agent * 1000 / d.grown.agentN}, nil
}

func readDialTimes(s *subject) (dialTimes, error) {
	var t dialTimes
	var err error
	if t.server, t.serverN, err = histTotals(s.serverAdmin, "konnectivity_network_proxy_server_dial_duration_seconds"); err != nil {
		return t, err
	}
	t.agent, t.agentN, err = histTotals(s.agentAdmin, "konnectivity_network_proxy_agent_dial_duration_seconds")
	return t, err
}

// histTotals reads a Prometheus histogram's _sum and _count, summed over
// its series (both implementations export these without labels).
func histTotals(addr, name string) (sum, count float64, err error) {
	body, err := get200(addr, "/metrics")
	if err != nil {
		return 0, 0, err
	}
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		for _, f := range []struct {
			suffix string
			into   *float64
		}{{"_sum", &sum}, {"_count", &count}} {
			rest, ok := strings.CutPrefix(line, name+f.suffix)
			if !ok || (!strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{")) {
				continue
			}
			v, perr := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
			if perr != nil {
				return 0, 0, fmt.Errorf("%s: %q: %w", addr, line, perr)
			}
			*f.into += v
			found++
		}
	}
	if found < 2 {
		return 0, 0, fmt.Errorf("%s/metrics has no %s", addr, name)
	}
	return sum, count, nil
}

// boundedEach calls f(i) for i in [0, n), at most inflight at once,
// starting no more once ctx has ended, and waits for the calls started.
func boundedEach(ctx context.Context, n, inflight int, f func(i int)) {
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// dialRate runs workers loops of {dial, one echo of size bytes, close} for
// dur (and at most maxOps operations in all) and returns completed
// operations per second. Any failed operation fails the run.
func dialRate(s *subject, dest string, workers int, dur time.Duration, maxOps int64, size int) (float64, int64, error) {
	var ops, bytes atomic.Int64
	var failed atomic.Pointer[error]
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ops.Load() < maxOps && failed.Load() == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := s.dial(ctx, dest)
				cancel()
				if err == nil {
					err = clientEcho(c, size)
					c.Close()
				}
				if err != nil {
					e := fmt.Errorf("%s: %w", s.name, err)
					failed.CompareAndSwap(nil, &e)
					return
				}
				ops.Add(1)
				bytes.Add(int64(2*size + headerLen))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if p := failed.Load(); p != nil {
		return 0, bytes.Load(), *p
	}
	return float64(ops.Load()) / el.Seconds(), bytes.Load(), nil
}

// idleMemory opens n connections through s that each complete one
// exchange and then stay idle, and returns the growth of the subject's
// resident memory per connection in KiB, in all and per process.
func idleMemory(s *subject, dest string, n int) (float64, []float64, []net.Conn, error) {
	perProc := func() []int64 {
		var out []int64
		for _, p := range s.procs {
			rss, _ := memKiB(goharness.Tree(p.Pid()))
			out = append(out, rss)
		}
		return out
	}
	// Warm up: the first connections allocate pools that are not per
	// connection.
	warm, err := dialAll(s, dest, 64, 60*time.Second)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, c := range warm {
		if err := clientHold(c); err != nil {
			closeAll(warm)
			return 0, nil, nil, err
		}
	}
	closeAll(warm)
	base, _ := s.mem()
	baseProcs := perProc()
	conns := make([]net.Conn, 0, n)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	var mu sync.Mutex
	var firstE error
	boundedEach(ctx, n, 32, func(int) {
		c, err := s.dial(ctx, dest)
		if err == nil {
			if err = clientHold(c); err != nil {
				c.Close()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if firstE == nil {
				firstE = err
			}
			return
		}
		conns = append(conns, c)
	})
	if firstE != nil {
		return 0, nil, conns, fmt.Errorf("%s: %d of %d idle connections opened: %w", s.name, len(conns), n, firstE)
	}
	if err := s.alive(); err != nil {
		return 0, nil, conns, err
	}
	after, _ := s.mem()
	var split []float64
	for i, v := range perProc() {
		split = append(split, float64(v-baseProcs[i])/float64(n))
	}
	return float64(after-base) / float64(n), split, conns, nil
}

// holResult is one head-of-line run.
type holResult struct {
	soloBefore, beside, soloAfter float64 // MiB/s
	finished                      bool    // the download beside the stuck reader finished within the limit
	moved                         int64
	gap                           time.Duration // longest time the download beside the stuck reader made no progress
	stuckCPU                      float64       // the subject's CPU seconds per second while only the stuck connection was open
}

// kept is the share of its solo throughput (mean of before and after; only
// before when the download beside the stuck reader did not finish) the
// download kept beside the stuck reader, in percent.
func (h holResult) kept() float64 {
	solo := h.soloBefore
	if h.finished {
		solo = (h.soloBefore + h.soloAfter) / 2
	}
	return 100 * h.beside / solo
}

// holOnce measures how much of its solo throughput one download keeps
// while another connection through the same agent has a reader that
// stopped reading. A download runs solo; then a second connection asks its
// destination for an endless stream and is never read; once that
// destination can write no more (no progress for 300 ms, at most 20 s) the
// same download runs again on the first connection, bounded by limit; then
// the stuck connection is closed and the download runs solo once more on a
// new connection (so drift in machine load does not count as head-of-line
// blocking).
func holOnce(s *subject, dest string, size int64, limit time.Duration) (holResult, error) {
	var h holResult
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if h.soloBefore, _, err = bulk(s, dest, 1, size, opDownload, limit); err != nil {
		return h, err
	}
	c, err := s.dial(ctx, dest)
	if err != nil {
		return h, fmt.Errorf("%s: dial measured connection: %w", s.name, err)
	}
	defer func() { go c.Close() }()
	id, progress := newStuck()
	stuckConn, err := s.dial(ctx, dest)
	if err != nil {
		return h, fmt.Errorf("%s: dial stuck connection: %w", s.name, err)
	}
	stuckClosed := false
	defer func() {
		if !stuckClosed {
			go stuckConn.Close()
		}
	}()
	if _, err := stuckConn.Write(header(opStuck, id)); err != nil {
		return h, err
	}
	last, lastChange, cpuAtChange := int64(-1), time.Now(), s.cpu()
	waitUntil := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(waitUntil) {
		<-tick.C
		if v := progress.Load(); v != last {
			last, lastChange, cpuAtChange = v, time.Now(), s.cpu()
		} else if time.Since(lastChange) >= 300*time.Millisecond {
			h.stuckCPU = (s.cpu() - cpuAtChange) / time.Since(lastChange).Seconds()
			break
		}
	}
	var moved atomic.Int64
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- clientDownload(c, size, &moved) }()
	prev, prevAt := int64(0), start
	timeout := time.After(limit)
wait:
	for {
		select {
		case err := <-done:
			h.gap = max(h.gap, time.Since(prevAt))
			if err != nil {
				return h, fmt.Errorf("%s: download beside a stuck reader: %w", s.name, err)
			}
			h.beside, h.finished, h.moved = float64(size)/mib/time.Since(start).Seconds(), true, size
			break wait
		case <-timeout:
			h.gap = max(h.gap, time.Since(prevAt))
			h.moved = moved.Load()
			h.beside = float64(h.moved) / mib / limit.Seconds()
			break wait
		case now := <-tick.C:
			if v := moved.Load(); v != prev {
				h.gap = max(h.gap, now.Sub(prevAt))
				prev, prevAt = v, now
			}
		}
	}
	if !h.finished {
		return h, nil // stalled: the pair is torn down by the caller
	}
	// Close the stuck connection (bounded) and measure solo again.
	closed := make(chan struct{})
	go func() { stuckConn.Close(); close(closed) }()
	stuckClosed = true
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
	}
	if h.soloAfter, _, err = bulk(s, dest, 1, size, opDownload, limit); err != nil {
		return h, err
	}
	return h, nil
}
