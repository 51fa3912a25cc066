// Package upstreammain runs an upstream v0.36.0 command the way upstream's
// own main.go files do: klog's flags added to the command's flag set with
// hyphenated names, -v=4 unless the command line says otherwise.
package upstreammain

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

// Execute adds klog's flags to cmd, runs it and exits 1 if it fails.
func Execute(cmd *cobra.Command) {
	klogFlags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", "4"); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	fs := cmd.Flags()
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
