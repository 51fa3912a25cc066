package interop

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// edgeCase is one request to the HTTP-CONNECT frontend whose answer must be
// upstream's byte for byte (docs/konnectivity.md, "Edge statuses").
type edgeCase struct {
	name string
	// raw request; %REFUSED% becomes a refusing loopback address
	req string
	// run against a server without agents
	noAgent bool
}

var edgeCases = []edgeCase{
	{name: "CONNECT without a port", req: "CONNECT 127.0.0.1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to an invalid port", req: "CONNECT 127.0.0.1:99999 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to a negative port", req: "CONNECT 127.0.0.1:-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to an unbracketed IPv6 address", req: "CONNECT ::1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to an IPv6 address without a port", req: "CONNECT [::1] HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to a path", req: "CONNECT /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT to a path without Host", req: "CONNECT /x HTTP/1.1\r\n\r\n"},
	{name: "CONNECT HTTP/1.0 without a port", req: "CONNECT 127.0.0.1 HTTP/1.0\r\n\r\n"},
	{name: "CONNECT refused by the destination", req: "CONNECT %REFUSED% HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT with HTTP/2.0", req: "CONNECT 127.0.0.1:1 HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "CONNECT with a bad header line", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n"},
	{name: "CONNECT with a bad Host", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: a b\r\n\r\n"},
	{name: "CONNECT with an unknown transfer coding", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: foo\r\n\r\n"},
	{name: "CONNECT with an oversized head", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n"},
	{name: "GET", req: "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "lower-case connect", req: "connect 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	{name: "not HTTP", req: "\x16\x03\x01\x02\x00 garbage\r\n\r\n"},
	{name: "CONNECT without agents", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", noAgent: true},
}

// edgeAnswer is what a server wrote for one request, Date masked, and
// whether it closed the connection afterwards.
type edgeAnswer struct {
	raw    string
	closed bool
}

func (a edgeAnswer) String() string {
	return fmt.Sprintf("%q (then %s)", a.raw, map[bool]string{true: "closed", false: "kept open"}[a.closed])
}

var dateHeader = regexp.MustCompile(`\r\nDate: [^\r]*\r\n`)

// edgeRequest sends req on a fresh connection to the Unix socket and reads
// the answer: the head, a Content-Length body or everything up to EOF.
func edgeRequest(uds, req string) (edgeAnswer, error) {
	c, err := net.Dial("unix", uds)
	if err != nil {
		return edgeAnswer{}, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return edgeAnswer{}, err
	}
	// The server may answer before it read all of an oversized head.
	go func() { _, _ = io.WriteString(c, req) }()
	var buf bytes.Buffer
	chunk := make([]byte, 4096)
	complete := func() bool {
		b := buf.Bytes()
		i := bytes.Index(b, []byte("\r\n\r\n"))
		if i < 0 {
			return false
		}
		m := regexp.MustCompile(`(?i)\r\nContent-Length: (\d+)\r\n`).FindSubmatch(b[:i+2])
		if m == nil {
			return false // up to EOF
		}
		var n int
		fmt.Sscan(string(m[1]), &n)
		return len(b) >= i+4+n
	}
	closed := false
	for !complete() {
		n, err := c.Read(chunk)
		buf.Write(chunk[:n])
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				closed = true
				break
			}
			return edgeAnswer{}, fmt.Errorf("after %q: %w", buf.String(), err)
		}
	}
	if !closed {
		// Kept open or closed right after: a quiet second tells.
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(chunk)
		buf.Write(chunk[:n])
		closed = err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	return edgeAnswer{raw: dateHeader.ReplaceAllString(buf.String(), "\r\nDate: <masked>\r\n"), closed: closed}, nil
}

// TestEdgeStatuses sends each edge request to upstream's proxy-server and
// agent and to ours (HTTP-CONNECT over a Unix socket) and wants the same
// bytes back, Date aside, and the connection closed or kept the same way.
func TestEdgeStatuses(t *testing.T) {
	refused := refusedAddr(t)
	got := perImpl(t, "send", func(t *testing.T, im impl) map[string]edgeAnswer {
		withAgent := startServer(t, serverConfig{impl: im, front: connectUDS})
		startAgent(t, im, withAgent.agentPort, "agent-edge")
		if err := withAgent.waitBackends(1); err != nil {
			t.Fatalf("[setup %s] %v", im, err)
		}
		alone := startServer(t, serverConfig{impl: im, front: connectUDS})
		answers := map[string]edgeAnswer{}
		for _, c := range edgeCases {
			srv := withAgent
			if c.noAgent {
				srv = alone
			}
			a, err := edgeRequest(srv.uds, strings.ReplaceAll(c.req, "%REFUSED%", refused))
			if err != nil {
				t.Errorf("[edge %q | %s proxy-server] %v", c.name, im, err)
				continue
			}
			answers[c.name] = a
		}
		return answers
	})
	if dir := os.Getenv("INTEROP_LOG_DIR"); dir != "" {
		var b strings.Builder
		for _, c := range edgeCases {
			fmt.Fprintf(&b, "%s\n  upstream: %s\n  ours:     %s\n", c.name, got[upstream][c.name], got[ours][c.name])
		}
		_ = os.WriteFile(filepath.Join(dir, "edge-statuses.txt"), []byte(b.String()), 0o644)
	}
	for _, c := range edgeCases {
		u, ok1 := got[upstream][c.name]
		o, ok2 := got[ours][c.name]
		if !ok1 || !ok2 {
			t.Errorf("[edge %q] no answer to compare", c.name)
			continue
		}
		if u != o {
			t.Errorf("[edge %q] our proxy-server answered\n  %s\nupstream's\n  %s", c.name, o, u)
		}
	}
}

// perImpl runs f against ours and upstream in parallel subtests of
// t.Run(name) and returns what each gave, by implementation.
func perImpl[T any](t *testing.T, name string, f func(t *testing.T, im impl) map[string]T) map[impl]map[string]T {
	var mu sync.Mutex
	got := map[impl]map[string]T{}
	t.Run(name, func(t *testing.T) {
		for _, im := range []impl{ours, upstream} {
			t.Run(string(im), func(t *testing.T) {
				t.Parallel()
				r := f(t, im)
				mu.Lock()
				got[im] = r
				mu.Unlock()
			})
		}
	})
	return got
}
