package goharness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Eventually polls cond every interval until it returns nil or timeout
// passes, and then returns cond's last error. For readiness that is only
// observable by asking (an endpoint answering), never a fixed sleep.
func Eventually(ctx context.Context, timeout, interval time.Duration, cond func() error) error {
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

// Upstream's binaries validate ports to 1024..49151 and do not log the
// ports they bound, so they get ports picked here: below Linux's ephemeral
// range, never handed out twice in one run, and free when picked. A caller
// that loses a race for one starts again with new ports.
var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// PickPort is a loopback TCP port that was free a moment ago.
func PickPort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := 20000 + rand.IntN(12000)
		if portsUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", Loopback(p))
		if err != nil {
			continue
		}
		l.Close()
		portsUsed[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port found")
}

// Loopback is 127.0.0.1:port.
func Loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// PortOf is the port of a logged bind address ("[::]:1234", "0.0.0.0:1234").
func PortOf(addr string) (int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	return strconv.Atoi(addr[i+1:])
}
