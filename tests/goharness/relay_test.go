package goharness

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// The relay delivers every byte in order, and an exchange through it takes
// at least the round trip it was set to (the delay is really applied).
func TestDelayRelayAddsItsRoundTripAndKeepsTheBytes(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	const rtt = 40 * time.Millisecond
	r, err := StartDelayRelay(echo.Addr().String(), rtt)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	ping := func(c net.Conn) error {
		if _, err := c.Write([]byte{1}); err != nil {
			return err
		}
		var b [1]byte
		_, err := io.ReadFull(c, b[:])
		return err
	}
	got, err := MeasureRTT(r.Addr(), 3, ping)
	if err != nil {
		t.Fatal(err)
	}
	if got < rtt {
		t.Errorf("a ping-pong through a relay set to %s took %s", rtt, got)
	}
	// 4 MiB in, the same 4 MiB back, in order.
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 4<<20)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	go func() { _, _ = c.Write(msg) }()
	back := make([]byte, len(msg))
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, msg) {
		t.Error("the relay changed the bytes")
	}
}
