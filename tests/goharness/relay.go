package goharness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// DelayRelay stands in for a long network path: a TCP relay on loopback
// that holds every chunk it reads for half the round-trip time in each
// direction before writing it on, with unbounded buffering (a long fat
// pipe without loss). This kernel has no netem qdisc, so the delay is made
// in user space; pingPong measures what it really adds.
//
// Because the relay reads as fast as its side sends, only flow control
// above TCP (HTTP/2 windows, our credit) can hold a transfer back over it,
// which is what it is for.
type DelayRelay struct {
	ln     net.Listener
	target string
	oneWay atomic.Int64 // nanoseconds
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// StartDelayRelay listens on a free loopback port and relays every connection
// to target with rtt/2 of delay each way.
func StartDelayRelay(target string, rtt time.Duration) (*DelayRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &DelayRelay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.oneWay.Store(int64(rtt / 2))
	go r.serve()
	return r, nil
}

func (r *DelayRelay) Addr() string { return r.ln.Addr().String() }

func (r *DelayRelay) Port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// SetRTT changes the delay for chunks read from now on.
func (r *DelayRelay) SetRTT(rtt time.Duration) { r.oneWay.Store(int64(rtt / 2)) }

func (r *DelayRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *DelayRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// Stop closes the listener and every relayed connection.
func (r *DelayRelay) Stop() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
}

func (r *DelayRelay) serve() {
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			b, err := net.DialTimeout("tcp", r.target, 5*time.Second)
			if err != nil {
				a.Close()
				return
			}
			if !r.track(a) || !r.track(b) {
				a.Close()
				b.Close()
				return
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); r.pipe(a, b) }()
			go func() { defer wg.Done(); r.pipe(b, a) }()
			wg.Wait()
			a.Close()
			b.Close()
			r.untrack(a)
			r.untrack(b)
		}()
	}
}

type delayed struct {
	due  time.Time
	data []byte
}

// pipe copies src to dst, each chunk written no sooner than one-way delay
// after it was read. The queue between reader and writer is unbounded.
func (r *DelayRelay) pipe(src, dst net.Conn) {
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	var queue []delayed
	done := false
	go func() {
		buf := make([]byte, 256<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				d := delayed{due: time.Now().Add(time.Duration(r.oneWay.Load())), data: append([]byte(nil), buf[:n]...)}
				mu.Lock()
				queue = append(queue, d)
				cond.Signal()
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				done = true
				cond.Signal()
				mu.Unlock()
				return
			}
		}
	}()
	for {
		mu.Lock()
		for len(queue) == 0 && !done {
			cond.Wait()
		}
		if len(queue) == 0 {
			mu.Unlock()
			// The source ended: end the other side too (and so the reader
			// of the opposite direction).
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
		d := queue[0]
		queue[0] = delayed{}
		queue = queue[1:]
		mu.Unlock()
		if wait := time.Until(d.due); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(d.data); err != nil {
			src.Close()
			dst.Close()
			return
		}
	}
}

// MeasureRTT measures the round trip through the relay at addr: n
// exchanges, each on a new connection (so no window or buffer carries over),
// timed from the first byte written until exchange returns; returns the
// median. exchange writes a small request and reads the answer.
func MeasureRTT(addr string, n int, exchange func(net.Conn) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var d net.Dialer
	var samples []time.Duration
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return 0, err
		}
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		t0 := time.Now()
		err = exchange(c)
		samples = append(samples, time.Since(t0))
		c.Close()
		if err != nil {
			return 0, err
		}
	}
	if len(samples) == 0 {
		return 0, errors.New("no samples")
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return samples[len(samples)/2], nil
}

// FormatRTT is a round trip in milliseconds, as the reports print it.
func FormatRTT(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
