// Command upstream-proxy-server is the upstream v0.36.0 proxy-server, built
// from its importable cmd/server/app package the way upstream's own main does:
// the app command, its flag set, klog's flags with hyphenated names, -v=4.
package main

import (
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"

	"konnectivity-interop/cmd/internal/upstreammain"
)

func main() {
	o := options.NewProxyRunOptions()
	cmd := app.NewProxyCommand(&app.Proxy{}, o)
	cmd.Flags().AddFlagSet(o.Flags())
	upstreammain.Execute(cmd)
}
