package main

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// The destination protocol: the client sends a 16-byte header (op, 7 bytes
// zero, size as big-endian uint64), then:
//
//	'D' download: the destination writes size bytes, then waits for the client to close;
//	'U' upload: the client writes size bytes, the destination answers one byte 'K';
//	'E' echo: the client writes size bytes, the destination writes them back;
//	'H' hold: the destination answers 'K' and holds the connection idle;
//	'S' stuck source: the destination writes until the connection breaks, counting
//	    into stuck[size] (the harness watches it), the client never reads;
//	'N' stalled sink: the destination reads nothing more until the harness
//	    releases it (releaseSinks), then reads to the end.
//
// No half-close is used: konnectivity-client connections cannot CloseWrite.
const (
	opDownload = 'D'
	opUpload   = 'U'
	opEcho     = 'E'
	opHold     = 'H'
	opStuck    = 'S'
	opSink     = 'N'
	headerLen  = 16
	// chunk is the read and write size of every copy loop on both ends of
	// every workload (io.Copy's default buffer).
	chunk = 32 << 10
)

var payload = func() []byte {
	b := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

var (
	stuckMu sync.Mutex
	stuck   = map[uint64]*atomic.Int64{}
	stuckID atomic.Uint64
)

// newStuck registers a progress counter for an 'S' connection.
func newStuck() (uint64, *atomic.Int64) {
	id := stuckID.Add(1)
	c := new(atomic.Int64)
	stuckMu.Lock()
	stuck[id] = c
	stuckMu.Unlock()
	return id, c
}

// destination is a set of listeners (plain TCP on loopback, and TLS) that
// serve the protocol above. It runs inside the harness process; its CPU is
// not counted for any proxy.
type destination struct {
	plain net.Listener
	tls   net.Listener
	conns sync.WaitGroup
	mu    sync.Mutex
	open  map[net.Conn]struct{}
}

func startDestination(tlsCfg *tls.Config) (*destination, error) {
	d := &destination{open: map[net.Conn]struct{}{}}
	var err error
	if d.plain, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.tls = tls.NewListener(raw, tlsCfg)
	go d.serve(d.plain)
	go d.serve(d.tls)
	return d, nil
}

func (d *destination) plainAddr() string { return d.plain.Addr().String() }
func (d *destination) tlsAddr() string   { return d.tls.Addr().String() }

func (d *destination) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		d.mu.Lock()
		d.open[c] = struct{}{}
		d.mu.Unlock()
		go func() {
			defer func() {
				c.Close()
				d.mu.Lock()
				delete(d.open, c)
				d.mu.Unlock()
			}()
			_ = handle(c)
		}()
	}
}

// closeAll closes every open destination connection (between workloads).
func (d *destination) closeAll() {
	d.mu.Lock()
	for c := range d.open {
		c.Close()
	}
	d.mu.Unlock()
}

func handle(c net.Conn) error {
	var h [headerLen]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint64(h[8:])
	switch h[0] {
	case opDownload:
		if err := writeN(c, int64(size), nil); err != nil {
			return err
		}
	case opUpload:
		if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, int64(size)), make([]byte, chunk)); err != nil {
			return err
		}
		if _, err := c.Write([]byte{'K'}); err != nil {
			return err
		}
	case opEcho:
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
	case opHold:
		if _, err := c.Write([]byte{'K'}); err != nil {
			return err
		}
	case opSink:
		<-currentSinkRelease()
	case opStuck:
		stuckMu.Lock()
		ctr := stuck[size]
		stuckMu.Unlock()
		if ctr == nil {
			return fmt.Errorf("unknown stuck id %d", size)
		}
		return writeN(c, 1<<62, ctr)
	default:
		return fmt.Errorf("bad op %q", h[0])
	}
	// Wait for the client to close.
	_, err := io.Copy(io.Discard, c)
	return err
}

// writeN writes n bytes of payload in chunk-sized writes.
func writeN(w io.Writer, n int64, progress *atomic.Int64) error {
	off := 0
	for n > 0 {
		k := int64(chunk)
		if k > n {
			k = n
		}
		if off+int(k) > len(payload) {
			off = 0
		}
		m, err := w.Write(payload[off : off+int(k)])
		if progress != nil {
			progress.Add(int64(m))
		}
		if err != nil {
			return err
		}
		off += m
		n -= int64(m)
	}
	return nil
}

func header(op byte, size uint64) []byte {
	h := make([]byte, headerLen)
	h[0] = op
	binary.BigEndian.PutUint64(h[8:], size)
	return h
}

// clientDownload asks for size bytes and reads them; moved counts progress.
func clientDownload(c net.Conn, size int64, moved *atomic.Int64) error {
	if _, err := c.Write(header(opDownload, uint64(size))); err != nil {
		return err
	}
	buf := make([]byte, chunk)
	var got int64
	for got < size {
		n, err := c.Read(buf[:min(int64(len(buf)), size-got)])
		got += int64(n)
		if moved != nil {
			moved.Add(int64(n))
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("EOF after %d of %d bytes", got, size)
			}
			return err
		}
	}
	return nil
}

// clientUpload writes size bytes and waits for the destination's 'K'.
func clientUpload(c net.Conn, size int64, moved *atomic.Int64) error {
	if _, err := c.Write(header(opUpload, uint64(size))); err != nil {
		return err
	}
	if err := writeN(c, size, moved); err != nil {
		return err
	}
	return readAck(c)
}

func readAck(c net.Conn) error {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("reading the destination's ack: %w", err)
	}
	if b[0] != 'K' {
		return fmt.Errorf("ack %q", b[0])
	}
	return nil
}

// clientEcho is one short request/response exchange of size bytes.
func clientEcho(c net.Conn, size int) error {
	msg := append(header(opEcho, uint64(size)), payload[:size]...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	return nil
}

func clientHold(c net.Conn) error {
	if _, err := c.Write(header(opHold, 0)); err != nil {
		return err
	}
	return readAck(c)
}

// destOnly serves the destinations in this process until it is killed
// (the parent's death kills it: Pdeathsig).
func destOnly() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	tlsCfg := &tls.Config{}
	if *flagDestCert != "" {
		cert, err := tls.LoadX509KeyPair(*flagDestCert, *flagDestKey)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	d, err := startDestination(tlsCfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// More plain listeners (same protocol): one agent reaches one
	// listener from at most ~28,000 ephemeral ports, and the
	// 50,000-tunnel workload needs more.
	plains := []string{d.plainAddr()}
	for range *flagDestPlain - 1 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go d.serve(l)
		plains = append(plains, l.Addr().String())
	}
	fmt.Printf("destination plain=%s plains=%s tls=%s\n", d.plainAddr(), strings.Join(plains, ","), d.tlsAddr())
	select {}
}

// startDestProc runs the destinations in a child process (destOnly) with
// extra flags and returns it with its "destination plain=… plains=… tls=…"
// line (goharness.Field picks the addresses); the caller kills it.
func startDestProc(extra ...string) (*proc, string, error) {
	dp, err := startProc("destination", selfExe(), append([]string{"--dest-only"}, extra...))
	if err != nil {
		return nil, "", err
	}
	l, _, err := dp.WaitLine(0, startPatience, "destination plain=")
	if err != nil {
		dp.Kill()
		return nil, "", err
	}
	return dp, l, nil
}

func selfExe() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}
