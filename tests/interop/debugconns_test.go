package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"konnectivity-goharness"
)

// /debug/connections on the admin ports of our proxy-server and proxy-agent
// (issue 17.6), driven by the real Go konnectivity-client (gRPC) and
// kube-apiserver's HTTP-CONNECT-over-mTLS handshake.

type debugConn struct {
	Kind              string   `json:"kind"`
	Source            *string  `json:"source"`
	Target            *string  `json:"target"`
	Upstream          *string  `json:"upstream"`
	State             string   `json:"state"`
	BytesFromClient   int64    `json:"bytes_from_client"`
	BytesFromUpstream int64    `json:"bytes_from_upstream"`
	AgeSeconds        *float64 `json:"age_seconds"`
	DialID            string   `json:"dial_id"`
	ConnectID         string   `json:"connect_id"`
	ServerID          string   `json:"server_id"`
	CloseReason       string   `json:"close_reason"`
}

type debugDoc struct {
	LiveTotal  int         `json:"live_total"`
	LiveListed int         `json:"live_listed"`
	Live       []debugConn `json:"live"`
	ClosedKept int         `json:"closed_kept"`
	Closed     []debugConn `json:"closed"`
}

func debugConns(adminAddr string) (debugDoc, error) {
	var d debugDoc
	code, body, err := httpGet(adminAddr, "/debug/connections")
	if err != nil {
		return d, err
	}
	if code != 200 {
		return d, fmt.Errorf("/debug/connections: %d %q", code, body)
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		return d, fmt.Errorf("/debug/connections is not the JSON document: %v: %q", err, body)
	}
	return d, nil
}

// waitDebug waits until check accepts the document at addr.
func waitDebug(addr string, check func(debugDoc) error) (debugDoc, error) {
	var last debugDoc
	err := goharness.Eventually(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
		d, err := debugConns(addr)
		if err != nil {
			return err
		}
		last = d
		return check(d)
	})
	return last, err
}

func str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

func TestDebugConnections(t *testing.T) {
	for _, f := range []frontend{grpcUDS, connectTLS} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			srv := startServer(t, serverConfig{impl: ours, front: f})
			a := startAgent(t, ours, srv.agentPort, "agent-debug")
			if err := srv.waitBackends(1); err != nil {
				t.Fatalf("[setup] %v", err)
			}
			kind := map[frontend]string{grpcUDS: "grpc", connectTLS: "http-connect"}[f]
			echo := newTCPDest(t, echoHandler)
			// The goodbye waits for the client's dial to return on gRPC:
			// konnectivity-client drops DATA that comes between DIAL_RSP and
			// the connection's registration (see speakFirstGate), which would
			// end the tunnel as "closed by the client".
			goAhead := &gate{ch: make(chan struct{})}
			if f != grpcUDS {
				goAhead.open()
			}
			defer goAhead.open()
			closer := newTCPDest(t, gated(goAhead, closerHandler("bye")))
			refused := refusedAddr(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			// Admin only: the health port does not serve it.
			if code, _, err := httpGet(srv.healthAddr, "/debug/connections"); err != nil || code != 404 {
				t.Errorf("server health port /debug/connections = %d %v; want 404 (admin port only)", code, err)
			}
			if code, _, err := httpGet(a.healthAddr, "/debug/connections"); err != nil || code != 404 {
				t.Errorf("agent health port /debug/connections = %d %v; want 404 (admin port only)", code, err)
			}

			c, err := srv.dial(ctx, echo.addr, false)
			if err != nil {
				t.Fatal(err)
			}
			msg := []byte("seventeen bytes!!")
			if err := roundtrip(c, msg); err != nil {
				t.Fatal(err)
			}
			n := int64(len(msg))
			live, err := waitDebug(srv.adminAddr, func(d debugDoc) error {
				if d.LiveTotal != 1 || len(d.Live) != 1 {
					return fmt.Errorf("live_total %d, %d listed; want 1", d.LiveTotal, len(d.Live))
				}
				e := d.Live[0]
				if e.BytesFromClient != n || e.BytesFromUpstream != n || e.State != "established" {
					return fmt.Errorf("state %q, bytes %d/%d; want established, %d each way", e.State, e.BytesFromClient, e.BytesFromUpstream, n)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("server: %v\n%+v", err, live)
			}
			e := live.Live[0]
			if e.Kind != kind || str(e.Target) != echo.addr || str(e.Upstream) != "agent-debug" || e.DialID == "" || e.ConnectID == "" || e.AgeSeconds == nil {
				t.Errorf("server's live tunnel = %+v (target %s, upstream %s); want kind %s, target %s, upstream agent-debug, dial and connect ids, an age", e, str(e.Target), str(e.Upstream), kind, echo.addr)
			}
			if f == connectTLS && !strings.HasPrefix(str(e.Source), "127.0.0.1:") {
				t.Errorf("server's live tunnel source = %s; want the client's 127.0.0.1:port", str(e.Source))
			}
			if f == grpcUDS && e.Source != nil {
				t.Errorf("server's live tunnel source = %s; want null on the Unix socket", str(e.Source))
			}
			alive, err := waitDebug(a.adminAddr, func(d debugDoc) error {
				if d.LiveTotal != 1 || len(d.Live) != 1 {
					return fmt.Errorf("live_total %d; want 1", d.LiveTotal)
				}
				if e := d.Live[0]; e.BytesFromClient != n || e.BytesFromUpstream != n || e.State != "established" {
					return fmt.Errorf("state %q, bytes %d/%d; want established, %d each way", e.State, e.BytesFromClient, e.BytesFromUpstream, n)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("agent: %v\n%+v", err, alive)
			}
			ae := alive.Live[0]
			if str(ae.Target) != echo.addr || str(ae.Upstream) != echo.addr || ae.ServerID != srv.id || ae.ConnectID != e.ConnectID || ae.DialID != e.DialID {
				t.Errorf("agent's live connection = %+v (target %s, upstream %s); want target and upstream %s, server %s, the server's dial %s and connect %s ids", ae, str(ae.Target), str(ae.Upstream), echo.addr, srv.id, e.DialID, e.ConnectID)
			}

			// Closed by the client: both sides list it as closed, with why.
			c.Close()
			closedWith := func(target, reason string) func(debugDoc) error {
				return func(d debugDoc) error {
					for _, c := range d.Closed {
						if str(c.Target) == target && strings.HasPrefix(c.CloseReason, reason) && c.State == "closed" {
							return nil
						}
					}
					return fmt.Errorf("no closed entry for %s with reason %q: %+v", target, reason, d.Closed)
				}
			}
			if _, err := waitDebug(srv.adminAddr, closedWith(echo.addr, "closed by the frontend")); err != nil {
				t.Errorf("server: %v", err)
			}
			if _, err := waitDebug(a.adminAddr, closedWith(echo.addr, "closed by the server")); err != nil {
				t.Errorf("agent: %v", err)
			}

			// Closed by the destination.
			c, err = srv.dial(ctx, closer.addr, false)
			goAhead.open()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(c); err != nil {
				t.Logf("reading the goodbye: %v", err)
			}
			c.Close()
			if _, err := waitDebug(srv.adminAddr, closedWith(closer.addr, "closed by the agent")); err != nil {
				t.Errorf("server: %v", err)
			}
			if _, err := waitDebug(a.adminAddr, closedWith(closer.addr, "closed by the destination")); err != nil {
				t.Errorf("agent: %v", err)
			}

			// A failed dial.
			if c, err := srv.dial(ctx, refused, false); err == nil {
				c.Close()
				t.Fatalf("dial to %s (refusing) succeeded", refused)
			}
			if _, err := waitDebug(srv.adminAddr, closedWith(refused, "dial failed: dial tcp "+refused)); err != nil {
				t.Errorf("server: %v", err)
			}
			d, err := waitDebug(a.adminAddr, closedWith(refused, "dial failed: dial tcp "+refused))
			if err != nil {
				t.Errorf("agent: %v", err)
			}
			if d.LiveTotal != 0 || d.ClosedKept <= 0 {
				t.Errorf("agent: live_total %d, closed_kept %d; want 0 and the ring's size", d.LiveTotal, d.ClosedKept)
			}
		})
	}
}
