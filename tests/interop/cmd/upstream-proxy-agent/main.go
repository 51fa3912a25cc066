// Command upstream-proxy-agent is the upstream v0.36.0 proxy-agent, built
// from its importable cmd/agent/app package the way upstream's own main does:
// the app command, its flag set, klog's flags with hyphenated names, -v=4.
package main

import (
	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app/options"

	"konnectivity-interop/cmd/internal/upstreammain"
)

func main() {
	o := options.NewGrpcProxyAgentOptions()
	cmd := app.NewAgentCommand(&app.Agent{}, o)
	cmd.Flags().AddFlagSet(o.Flags())
	upstreammain.Execute(cmd)
}
