// Command upstream-proxy-agent is the upstream v0.36.0 proxy-agent, built
// from its importable cmd/agent/app package the way upstream's own main does:
// the app command, its flag set, klog's flags with hyphenated names, -v=4.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"

	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app/options"
	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

func main() {
	o := options.NewGrpcProxyAgentOptions()
	cmd := app.NewAgentCommand(&app.Agent{}, o)
	fs := cmd.Flags()
	fs.AddFlagSet(o.Flags())
	klogFlags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", "4"); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	klogFlags.VisitAll(func(f *flag.Flag) {
		f.Name = util.Normalize(f.Name)
		fs.AddGoFlag(f)
	})
	if err := cmd.Execute(); err != nil {
		klog.Errorf("error: %v", err)
		klog.Flush()
		os.Exit(1)
	}
}
