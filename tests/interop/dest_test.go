package interop

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"konnectivity-goharness"
)

// Every destination listens on 127.0.0.1: the suite sends traffic only to
// loopback.

const (
	mib        = 1 << 20
	largeChunk = mib
	largeCount = 10
)

// pattern is n deterministic pseudo-random bytes (not zeros, so a shifted
// or repeated chunk shows in the checksum).
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// httpDest is the HTTP destination: /hello, /large (10 x 1 MiB), /sink
// (answers "<len> <sha256>" of the request body), /echo (answers the body).
func httpDest(t testing.TB) *httptest.Server {
	chunk := pattern(1, largeChunk)
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })
	mux.HandleFunc("/large", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(largeChunk*largeCount))
		for range largeCount {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/sink", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	s := httptest.NewUnstartedServer(mux)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// tcpDest accepts connections on loopback and runs handle on each; closed
// receives one value per connection when handle returns (the destination
// saw the client go away, or closed first).
type tcpDest struct {
	addr     string
	accepted chan struct{}
	closed   chan error
}

func newTCPDest(t testing.TB, handle func(net.Conn) error) *tcpDest {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &tcpDest{addr: l.Addr().String(), accepted: make(chan struct{}, 128), closed: make(chan error, 128)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			d.accepted <- struct{}{}
			go func() {
				err := handle(c)
				c.Close()
				d.closed <- err
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return d
}

// echoHandler echoes until EOF; it returns nil on a clean EOF.
func echoHandler(c net.Conn) error {
	_, err := io.Copy(c, c)
	return err
}

// greeterHandler speaks first, then echoes.
func greeterHandler(greeting string) func(net.Conn) error {
	return func(c net.Conn) error {
		if _, err := io.WriteString(c, greeting); err != nil {
			return err
		}
		return echoHandler(c)
	}
}

// closerHandler says goodbye and closes first.
func closerHandler(msg string) func(net.Conn) error {
	return func(c net.Conn) error {
		_, err := io.WriteString(c, msg)
		return err
	}
}

// refusedAddr is a loopback port that refuses connections until the test
// ends (goharness.RefusedAddr).
func refusedAddr(t testing.TB) string {
	addr, release, err := goharness.RefusedAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}

// blackholeAddr never completes a TCP handshake until the test ends
// (goharness.BlackholeAddr).
func blackholeAddr(t testing.TB) string {
	addr, release, err := goharness.BlackholeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}
