package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// reusableGroup (issue 35): konnectivity-client v0.37.0's ReusableTunnel
// (one gRPC connection over the Unix socket, one Proxy stream per dial)
// beside the single-use tunnel kube-apiserver dials with today, on our
// proxy-server and upstream v0.36.0's, each with its own agent: dials/s
// with server + agent CPU per dial, and aggregate bulk throughput.
func reusableGroup() []*row {
	const id = "RT"
	o, err := startKonn(ours, "grpc")
	if err != nil {
		return []*row{errRow(row{id: id, workload: "ReusableTunnel"}, err)}
	}
	defer o.stop()
	u, err := startKonn(upstream, "grpc")
	if err != nil {
		return []*row{errRow(row{id: id, workload: "ReusableTunnel"}, err)}
	}
	defer u.stop()
	oR, closeO, err := withReusableTunnel(o)
	if err != nil {
		return []*row{errRow(row{id: id, workload: "ReusableTunnel"}, err)}
	}
	defer closeO()
	uR, closeU, err := withReusableTunnel(u)
	if err != nil {
		return []*row{errRow(row{id: id, workload: "ReusableTunnel"}, err)}
	}
	defer closeU()
	d := dest.plainAddr()
	rate := func(s *subject) (float64, int64, error) {
		return dialRate(s, d, cfg.rateWorkers, cfg.rateDur, cfg.rateMax, 64)
	}
	warmRate := func(s *subject) (float64, int64, error) {
		return dialRate(s, d, cfg.rateWorkers, cfg.rateDur/4, cfg.rateMax, 64)
	}
	var rows []*row
	for _, c := range []struct {
		client string
		subs   []*subject
	}{
		{"single-use tunnel (a new UDS gRPC connection per dial)", []*subject{o, u}},
		{"ReusableTunnel (one UDS gRPC connection, a Proxy stream per dial)", []*subject{oR, uR}},
	} {
		rows = append(rows, run(row{id: id, workload: fmt.Sprintf("dials/s, %d workers: dial, 64-byte request and response, close; %s", cfg.rateWorkers, c.client), unit: "dials/s", perOp: rateOpBytes},
			c.subs, warmRate, rate, false)...)
		rows = append(rows, run(row{id: id, workload: fmt.Sprintf("%d connections aggregate %s, %s", cfg.aggConns, dirName(opDownload), c.client), unit: "MiB/s"},
			c.subs, warmBulk(d, cfg.aggConns, cfg.agg, opDownload), bulkFn(d, cfg.aggConns, cfg.agg, opDownload), true)...)
	}
	return rows
}

// withReusableTunnel is s dialled through one ReusableTunnel over its Unix
// socket, as a kube-apiserver built on konnectivity-client v0.37.0 would
// keep it; the returned func closes the tunnel.
func withReusableTunnel(s *subject) (*subject, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tun, err := client.CreateGRPCTunnel(ctx, s.uds,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", s.uds)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: CreateGRPCTunnel over %s: %w", s.name, s.uds, err)
	}
	r := *s
	r.dial = func(ctx context.Context, dest string) (net.Conn, error) {
		return tun.DialContext(ctx, "tcp", dest)
	}
	return &r, func() { _ = tun.Close() }, nil
}
