package interop

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAgentWithSeveralServers (issue 17.4): our agent given a list of three
// upstream proxy-servers (HA, --server-count=3, no load balancer in front)
// holds a stream to each, every server can tunnel through it, and a server
// that restarts is reconnected to while the others keep their streams.
//
// "resolved": the same list as localhost:PORT names with
// --resolve-proxy-server-host, so the system resolver (/etc/hosts) turns each
// into its loopback addresses (::1 too where listed; nothing listens there,
// and those endpoints just back off).
func TestAgentWithSeveralServers(t *testing.T) {
	for _, mode := range []string{"list", "resolved"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			severalServers(t, mode)
		})
	}
}

func severalServers(t *testing.T, mode string) {
	var servers []*server
	var hosts []string
	host, extra := "127.0.0.1", []string{}
	if mode == "resolved" {
		host, extra = "localhost", []string{"--resolve-proxy-server-host", "--proxy-server-resolve-interval=1s"}
	}
	for i := 0; i < 3; i++ {
		s := startServer(t, serverConfig{impl: upstream, front: grpcUDS, count: 3})
		servers = append(servers, s)
		hosts = append(hosts, host+":"+strconv.Itoa(s.agentPort))
	}
	extra = append(extra, "--proxy-server-host="+strings.Join(hosts, ","))
	startAgentWith(t, ours, servers[0].agentPort, "agent-several-"+mode, 3, extra...)
	dest := newTCPDest(t, echoHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	check := func(s *server, what string) {
		t.Helper()
		if err := s.waitBackends(1); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c, err := s.dial(ctx, dest.addr, false)
		if err != nil {
			t.Fatalf("%s: dial through the server on agent port %d: %v", what, s.agentPort, err)
		}
		defer c.Close()
		if err := roundtrip(c, []byte("through "+strconv.Itoa(s.agentPort))); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for i, s := range servers {
		check(s, "server "+strconv.Itoa(i))
	}
	// Server 1 restarts on its port: the agent comes back to it.
	port, dir := servers[1].agentPort, servers[1].dir
	servers[1].p.kill()
	servers[1] = startServer(t, serverConfig{impl: upstream, front: grpcUDS, count: 3, agentPort: port, dir: dir})
	check(servers[1], "the restarted server")
	check(servers[0], "server 0 after the restart")
	check(servers[2], "server 2 after the restart")
}
