package interop

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// grpcTunnel opens a tunnel exactly as kube-apiserver's egress selector
// does for `proxyProtocol: GRPC` over `transport.uds`: a new Unix-socket
// gRPC connection per dial, blocking, 30 s, insecure credentials, with the
// socket path as the target (so grpc-go's passthrough resolver puts it in
// :authority).
func grpcTunnel(createCtx, tunnelCtx context.Context, uds string) (client.Tunnel, error) {
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", uds)
	})
	//nolint:staticcheck // kube-apiserver uses these (deprecated) options.
	return client.CreateSingleUseGrpcTunnelWithContext(createCtx, tunnelCtx, uds,
		dialer,
		grpc.WithBlock(),
		grpc.WithReturnConnectionError(),
		grpc.WithTimeout(30*time.Second),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
}

// grpcConn is a proxied connection plus its tunnel.
type grpcConn struct {
	net.Conn
	tunnel client.Tunnel
}

// dialGRPC is kube-apiserver's dial: new tunnel, then DialContext once.
func dialGRPC(ctx context.Context, uds, addr string) (*grpcConn, error) {
	tunnel, err := grpcTunnel(ctx, context.Background(), uds)
	if err != nil {
		return nil, fmt.Errorf("creating tunnel over %s: %w", uds, err)
	}
	c, err := tunnel.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &grpcConn{Conn: c, tunnel: tunnel}, nil
}

// connectError is a non-200 answer to CONNECT.
type connectError struct {
	Status      int
	StatusLine  string
	ContentType string
	Close       bool // Connection: close
	Body        string
}

func (e *connectError) Error() string {
	return fmt.Sprintf("CONNECT answered %q (Content-Type %q, Connection: close %v): %q", e.StatusLine, e.ContentType, e.Close, e.Body)
}

// connectHandshake writes CONNECT byte for byte as kube-apiserver's
// tunnelHTTPConnect does and reads the answer the same way: status must be
// 200 and nothing may be buffered past the response head. On a non-200 the
// body is read (bounded) for the test to inspect. With exact=true the head
// is read one byte at a time, so a destination that speaks first cannot be
// mistaken for extra buffered bytes.
func connectHandshake(c net.Conn, addr string, exact bool) error {
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, "127.0.0.1"); err != nil {
		return fmt.Errorf("writing CONNECT: %w", err)
	}
	var r io.Reader = c
	var head *bytes.Buffer
	if exact {
		head = &bytes.Buffer{}
		r = io.TeeReader(oneByteReader{c}, head)
	}
	br := bufio.NewReader(r)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("reading HTTP response from CONNECT to %s: %w", addr, err)
	}
	if res.StatusCode != 200 {
		// The server closes the socket after an error answer; the body
		// ends there.
		body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if err != nil {
			return fmt.Errorf("reading the body of CONNECT's %q: %w", res.Status, err)
		}
		return &connectError{Status: res.StatusCode, StatusLine: res.Proto + " " + res.Status,
			ContentType: res.Header.Get("Content-Type"), Close: res.Close, Body: string(body)}
	}
	if br.Buffered() > 0 {
		return fmt.Errorf("unexpected %d bytes of buffered data after the CONNECT response", br.Buffered())
	}
	// Read one byte at a time, the head is exactly what the server wrote
	// before the tunnel's bytes: upstream writes this and nothing else.
	if head != nil && head.String() != connectEstablished {
		return fmt.Errorf("CONNECT answered %q; want exactly %q", head.String(), connectEstablished)
	}
	return nil
}

const connectEstablished = "HTTP/1.1 200 Connection Established\r\n\r\n"

type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

// dialConnect tunnels to addr through the HTTP-CONNECT frontend, over the
// Unix socket (uds != "") or TCP with mTLS (kube-apiserver's tls.Dial with
// the egress selector's client cert and CA).
func dialConnect(ctx context.Context, uds, tcpAddr, addr string, exact bool) (net.Conn, error) {
	var c net.Conn
	var err error
	if uds != "" {
		var d net.Dialer
		c, err = d.DialContext(ctx, "unix", uds)
	} else {
		var cfg *tls.Config
		if cfg, err = pki.frontendTLS(); err == nil {
			d := tls.Dialer{Config: cfg}
			c, err = d.DialContext(ctx, "tcp", tcpAddr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("dialing the proxy: %w", err)
	}
	// Bound the handshake (the dial behind it can take the agent's 5 s).
	if err := c.SetDeadline(time.Now().Add(40 * time.Second)); err != nil {
		c.Close()
		return nil, err
	}
	if err := connectHandshake(c, addr, exact); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dial reaches addr through s's frontend as kube-apiserver would.
// exact: see connectHandshake.
func (s *server) dial(ctx context.Context, addr string, exact bool) (net.Conn, error) {
	if s.front == grpcUDS {
		c, err := dialGRPC(ctx, s.uds, addr)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	return dialConnect(ctx, s.uds, s.frontAddr, addr, exact)
}

// httpClient sends each request over a fresh proxied connection.
func (s *server) httpClient() *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return s.dial(ctx, addr, false)
			},
		},
	}
}
