package interop

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	agentproto "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// agentRefusals are agent streams whose metadata upstream's server refuses.
var agentRefusals = []struct {
	name string
	md   metadata.MD
}{
	{"no agent ID", metadata.MD{}},
	{"two agent IDs", metadata.Pairs(header.AgentID, "a", header.AgentID, "b")},
	{"two identifier sets", metadata.Pairs(header.AgentID, "a", header.AgentIdentifiers, "host=x", header.AgentIdentifiers, "host=y")},
	{"identifiers with a bad escape", metadata.Pairs(header.AgentID, "a", header.AgentIdentifiers, "host=%zz")},
	{"identifiers with a semicolon", metadata.Pairs(header.AgentID, "a", header.AgentIdentifiers, "host=a;host=b")},
}

// agentRefusal opens /AgentService/Connect on a server's agent port with
// the agent's client certificate and md, and returns the status it ends
// with as "<code>: <message>".
func agentRefusal(agentPort int, md metadata.MD) (string, error) {
	cert, err := tls.LoadX509KeyPair(pki.AgentCert, pki.AgentKey)
	if err != nil {
		return "", err
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"})
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(agentPort), grpc.WithTransportCredentials(creds))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := agentproto.NewAgentServiceClient(conn).Connect(metadata.NewOutgoingContext(ctx, md))
	if err == nil {
		_, err = stream.Recv()
	}
	if err == nil {
		return "", fmt.Errorf("the stream was accepted")
	}
	s := status.Convert(err)
	return fmt.Sprintf("%s: %s", s.Code(), s.Message()), nil
}

// TestAgentStreamRefusals: an agent stream with metadata upstream refuses
// ends with upstream's gRPC status and message on ours too.
func TestAgentStreamRefusals(t *testing.T) {
	got := perImpl(t, "connect", func(t *testing.T, im impl) map[string]string {
		srv := startServer(t, serverConfig{impl: im, front: grpcUDS})
		answers := map[string]string{}
		for _, c := range agentRefusals {
			a, err := agentRefusal(srv.agentPort, c.md)
			if err != nil {
				t.Errorf("[agent stream %q | %s proxy-server] %v", c.name, im, err)
				continue
			}
			answers[c.name] = a
		}
		return answers
	})
	for _, c := range agentRefusals {
		u, o := got[upstream][c.name], got[ours][c.name]
		if u == "" || o == "" {
			t.Errorf("[agent stream %q] no answer to compare", c.name)
			continue
		}
		if u != o {
			t.Errorf("[agent stream %q] our proxy-server ended it with %q; upstream's with %q", c.name, o, u)
		}
	}
}
