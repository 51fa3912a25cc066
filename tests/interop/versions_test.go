package interop

import (
	"os"
	"strings"
	"testing"
)

// olderVersions are the releases of sigs.k8s.io/apiserver-network-proxy
// before go.mod's v0.36.0 that run against ours here, each pinned by
// go.<version>.mod: v0.33.0 and v0.34.0 (KKP ships v0.34 for Kubernetes
// 1.34-1.35). v0.35.0 of the main module is not served by the Go module
// proxy (only konnectivity-client v0.35.0 is, tested in clients/), so
// there is nothing to build. INTEROP_VERSIONS picks a subset ("" = none).
func olderVersions() []string {
	v, ok := os.LookupEnv("INTEROP_VERSIONS")
	if !ok {
		v = "v0.33.0 v0.34.0"
	}
	return strings.Fields(v)
}

// TestVersions: our proxy-server with an older upstream proxy-agent, and
// our proxy-agent with an older upstream proxy-server. The wire between
// agent and server does not depend on the frontend, so each pair runs the
// gRPC (Unix socket) frontend's scenarios, the counters and idle checks
// after each, and the lifecycle (drain, kill, restarts).
func TestVersions(t *testing.T) {
	for _, v := range olderVersions() {
		up := upstreamAt(v)
		for _, p := range []pair{{server: ours, agent: up}, {server: up, agent: ours}} {
			t.Run(p.String()+"/"+string(grpcUDS), func(t *testing.T) {
				t.Parallel()
				runEnv(t, p, grpcUDS)
			})
			t.Run(p.String()+"/lifecycle", func(t *testing.T) {
				t.Parallel()
				runLifecycle(t, p)
			})
		}
	}
}
