package interop

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"konnectivity-goharness"
)

// TestWindowsGrowOverDistance: with a delay relay on the server↔agent link
// (20 ms round trip), a download through our server makes the windows that
// hold it back grow, read from our server's metrics while it runs:
//
//   - from upstream's agent (no flow control of ours): the HTTP/2 window of
//     the agent connection (konnectivity_network_proxy_server_http2_window_bytes,
//     1 MiB at the start);
//   - from our agent: the connection's flow-control window too
//     (konnectivity_network_proxy_server_flow_control_window_bytes, 256 KiB
//     at the start).
//
// And an upload through upstream's server makes our agent's HTTP/2 window
// grow (konnectivity_network_proxy_agent_http2_window_bytes).
//
// What is asserted is that the windows grew, not how fast anything went.
func TestWindowsGrowOverDistance(t *testing.T) {
	const (
		initialHTTP2 = 1 << 20
		initialFlow  = 256 << 10
		size         = 128 << 20
	)
	for _, im := range []impl{upstream, ours} {
		t.Run("agent="+string(im), func(t *testing.T) {
			t.Parallel()
			d := newTCPDest(t, func(c net.Conn) error {
				buf := make([]byte, 32<<10)
				for sent := 0; sent < size; sent += len(buf) {
					if _, err := c.Write(buf); err != nil {
						return err
					}
				}
				return nil
			})
			srv := startServer(t, serverConfig{impl: ours, front: connectUDS})
			relay, err := goharness.StartDelayRelay(goharness.Loopback(srv.agentPort), 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer relay.Stop()
			startAgent(t, im, relay.Port(), "agent-distance")
			if err := srv.waitBackends(1); err != nil {
				t.Fatalf("[setup] %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// exact: the destination speaks first, so its bytes may
			// arrive with the CONNECT answer.
			c, err := srv.dial(ctx, d.addr, true)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			done := make(chan error, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
				_, err := io.CopyN(io.Discard, c, size)
				done <- err
			}()
			wants := map[string]float64{"konnectivity_network_proxy_server_http2_window_bytes": initialHTTP2}
			if im == ours {
				wants["konnectivity_network_proxy_server_flow_control_window_bytes"] = initialFlow
			}
			peak := map[string]float64{}
			grew := func() bool {
				m, err := srv.metrics()
				if err != nil {
					t.Errorf("server metrics: %v", err)
					return true
				}
				all := true
				for name, initial := range wants {
					v, _ := m.get(name, nil)
					peak[name] = max(peak[name], v)
					all = all && peak[name] > initial
				}
				return all
			}
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			finished := false
			for !finished && !grew() {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("download: %v", err)
					}
					finished = true
				case <-tick.C:
				}
			}
			// Windows shrink only after seconds of idleness: a final look
			// after the download still sees them.
			grew()
			for name, initial := range wants {
				if peak[name] <= initial {
					t.Errorf("%s stayed at %.0f bytes (started at %.0f) during a %d MiB download over a 20 ms round trip", name, peak[name], initial, size>>20)
				}
			}
		})
	}
	t.Run("server=upstream,agent=ours,upload", func(t *testing.T) {
		t.Parallel()
		d := newTCPDest(t, func(c net.Conn) error {
			_, err := io.CopyN(io.Discard, c, size)
			return err
		})
		srv := startServer(t, serverConfig{impl: upstream, front: connectUDS})
		relay, err := goharness.StartDelayRelay(goharness.Loopback(srv.agentPort), 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer relay.Stop()
		a := startAgent(t, ours, relay.Port(), "agent-distance-up")
		if err := srv.waitBackends(1); err != nil {
			t.Fatalf("[setup] %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, err := srv.dial(ctx, d.addr, false)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		done := make(chan error, 1)
		go func() {
			_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
			buf := make([]byte, 32<<10)
			for sent := 0; sent < size; sent += len(buf) {
				if _, err := c.Write(buf); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		const name = "konnectivity_network_proxy_agent_http2_window_bytes"
		peak := 0.0
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for finished := false; !finished && peak <= initialHTTP2; {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("upload: %v", err)
				}
				finished = true
			case <-tick.C:
			}
			m, err := a.metrics()
			if err != nil {
				t.Fatalf("agent metrics: %v", err)
			}
			v, _ := m.get(name, nil)
			peak = max(peak, v)
		}
		if peak <= initialHTTP2 {
			t.Errorf("%s stayed at %.0f bytes during a %d MiB upload over a 20 ms round trip", name, peak, size>>20)
		}
	})
}
