// Command etcd runs a single-member etcd for the test harness: embedded from
// go.etcd.io/etcd/server/v3 (the version k8s.io/kubernetes pins), client and
// peer listeners on loopback port 0, data in --data-dir. When the server is
// ready it prints one line "etcd ready client=http://127.0.0.1:PORT"; it
// stops on SIGTERM/SIGINT or when its parent dies.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory (required)")
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "--data-dir is required")
		os.Exit(2)
	}
	// Die with the test process even if it could not clean up.
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	if os.Getppid() == 1 {
		os.Exit(1)
	}

	cfg := embed.NewConfig()
	cfg.Name = "harness"
	cfg.Dir = *dataDir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	loop := func(port string) url.URL { return url.URL{Scheme: "http", Host: "127.0.0.1:" + port} }
	cfg.ListenClientUrls = []url.URL{loop("0")}
	cfg.AdvertiseClientUrls = []url.URL{loop("2379")}
	cfg.ListenPeerUrls = []url.URL{loop("0")}
	cfg.AdvertisePeerUrls = []url.URL{loop("2380")}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting etcd: %v\n", err)
		os.Exit(1)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd not ready within 60s")
		e.Close()
		os.Exit(1)
	}
	fmt.Printf("etcd ready client=http://%s\n", e.Clients[0].Addr())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd failed: %v\n", err)
	}
	e.Close()
}
