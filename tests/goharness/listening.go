package goharness

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// Field is the value of key=value in a log line (quotes trimmed).
func Field(line, key string) string {
	for _, w := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// ListeningAddrs waits for one `listening listener=<name> addr=<addr>` line
// per name (our binaries log one per bound socket, port 0 resolved) and
// returns each logged address: host:port, or a path for a Unix socket.
func ListeningAddrs(p *Proc, patience time.Duration, names ...string) (map[string]string, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]string{}
	from := 0
	for len(out) < len(want) {
		l, next, err := p.WaitLine(from, patience, "listening", "listener=")
		if err != nil {
			return nil, err
		}
		from = next
		if name := Field(l, "listener"); want[name] {
			out[name] = Field(l, "addr")
		}
	}
	return out, nil
}

// LoopbackAddrs is ListeningAddrs for TCP listeners: 127.0.0.1 with each
// logged port (a listener bound to 0.0.0.0 or [::] is reached there too).
func LoopbackAddrs(p *Proc, patience time.Duration, names ...string) (map[string]string, error) {
	addrs, err := ListeningAddrs(p, patience, names...)
	if err != nil {
		return nil, err
	}
	for name, a := range addrs {
		if addrs[name], err = LoopbackOf(a); err != nil {
			return nil, fmt.Errorf("%s: %s listener: %w", p.Name, name, err)
		}
	}
	return addrs, nil
}

// LoopbackOf is 127.0.0.1 with the port of a logged bind address.
func LoopbackOf(addr string) (string, error) {
	port, err := PortOf(addr)
	if err != nil {
		return "", err
	}
	return Loopback(port), nil
}

// Probe connects to addr once and closes the connection.
func Probe(network, addr string) error {
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	return c.Close()
}
