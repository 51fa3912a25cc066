package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"k8s.io/klog/v2"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// dialFunc reaches dest (host:port of a destination listener) through one
// proxy path and returns the client's end.
type dialFunc func(ctx context.Context, dest string) (net.Conn, error)

// grpcUDS dials exactly as kube-apiserver's egress selector does for
// `proxyProtocol: GRPC` over `transport.uds`: a new Unix-socket gRPC
// connection per dial (CreateSingleUseGrpcTunnel with WithBlock,
// WithReturnConnectionError, WithTimeout(30s), insecure credentials, the
// socket path as target), then DialContext("tcp", dest) once.
func grpcUDS(uds string) dialFunc {
	return func(ctx context.Context, dest string) (net.Conn, error) {
		dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", uds)
		})
		tunnelCtx, cancel := context.WithCancel(context.Background())
		//nolint:staticcheck // kube-apiserver uses these (deprecated) options.
		tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, tunnelCtx, uds,
			dialer,
			grpc.WithBlock(),
			grpc.WithReturnConnectionError(),
			grpc.WithTimeout(30*time.Second),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("creating tunnel over %s: %w", uds, err)
		}
		c, err := tunnel.DialContext(ctx, "tcp", dest)
		if err != nil {
			cancel()
			return nil, err
		}
		return &grpcConn{Conn: c, cancel: cancel}, nil
	}
}

type grpcConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (g *grpcConn) Close() error {
	err := g.Conn.Close()
	g.cancel()
	return err
}

// connectUDS is kube-apiserver's `proxyProtocol: HTTPConnect` over
// `transport.uds`: dial the socket, write CONNECT byte for byte as
// tunnelHTTPConnect does, require 200 and nothing buffered past the head.
func connectUDS(uds string) dialFunc {
	return func(ctx context.Context, dest string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", uds)
		if err != nil {
			return nil, fmt.Errorf("dialing %s: %w", uds, err)
		}
		if err := connectHandshake(ctx, c, dest, "127.0.0.1"); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// httpConnectTCP is an HTTP/1.1 CONNECT client over TCP (tinyproxy,
// nodeport-proxy's tunneling port); authority overrides dest when set.
func httpConnectTCP(proxy, authority string) dialFunc {
	return func(ctx context.Context, dest string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", proxy)
		if err != nil {
			return nil, fmt.Errorf("dialing %s: %w", proxy, err)
		}
		target := dest
		if authority != "" {
			target = authority
		}
		if err := connectHandshake(ctx, c, target, target); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

func connectHandshake(ctx context.Context, c net.Conn, target, host string) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(40 * time.Second)
	}
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, host); err != nil {
		return fmt.Errorf("writing CONNECT: %w", err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("reading the CONNECT response: %w", err)
	}
	if res.StatusCode != 200 {
		return fmt.Errorf("CONNECT %s: %s", target, res.Status)
	}
	if br.Buffered() > 0 {
		return fmt.Errorf("unexpected %d bytes buffered after the CONNECT response", br.Buffered())
	}
	return c.SetDeadline(time.Time{})
}

// tcpTo connects to a fixed address (a relay's frontend) whatever dest is.
func tcpTo(addr string) dialFunc {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// unixTo connects to a fixed Unix socket (a relay's frontend) whatever
// dest is.
func unixTo(path string) dialFunc {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// withTLS runs a full TLS handshake (no resumption) over what inner returns.
func withTLS(inner dialFunc, cfg *tls.Config) dialFunc {
	return func(ctx context.Context, dest string) (net.Conn, error) {
		c, err := inner(ctx, dest)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		return tc, nil
	}
}

// quietKlog keeps konnectivity-client's klog lines (stream errors when a
// proxy is stopped between workloads) out of the report.
func quietKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}
