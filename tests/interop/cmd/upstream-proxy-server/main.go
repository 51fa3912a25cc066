// Command upstream-proxy-server is the upstream v0.36.0 proxy-server, built
// from its importable cmd/server/app package the way upstream's own main does:
// the app command, its flag set, klog's flags with hyphenated names, -v=4.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"

	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

func main() {
	o := options.NewProxyRunOptions()
	cmd := app.NewProxyCommand(&app.Proxy{}, o)
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
