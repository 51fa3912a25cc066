package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"konnectivity-goharness"
)

// --- churn (issue 38.1): dials across agent churn --------------------------
//
// One proxy-server (gRPC or HTTP-CONNECT frontend on its Unix socket) and
// two agents of the same implementation; a steady open-loop load of
// churnRate dials/s (kube-apiserver's dialer: dial, a 64-byte echo through
// the tunnel, close) runs while one scenario happens to the agents:
//
//   - kill: SIGKILL of one agent;
//   - freeze+kill: one agent stops answering (SIGSTOP, a hung or lost
//     node) for churnFreeze, then SIGKILL;
//   - rolling: each agent in turn gets SIGTERM, a new one is started and
//     the old one gets SIGKILL if it has not exited after churnGrace (as
//     the kubelet does after terminationGracePeriodSeconds); our agent runs
//     with --graceful-shutdown-timeout a second below it.
//
// At every moment at least one agent that is not draining is connected, so
// every dial could have been served: each failed dial counts. A connection
// that was established and broke during its echo (its agent died with it)
// is counted apart; no server can save those.

const (
	churnRate       = 200
	churnDialBudget = 5 * time.Second // per dial, and per echo
	churnMaxRun     = 2 * time.Minute // bound on one run's load
)

type churnSizes struct {
	settle, freeze, grace, tail time.Duration
}

func churnCfg() churnSizes {
	if *flagQuick {
		return churnSizes{settle: 300 * time.Millisecond, freeze: 500 * time.Millisecond, grace: 2 * time.Second, tail: 300 * time.Millisecond}
	}
	return churnSizes{settle: 2 * time.Second, freeze: 2 * time.Second, grace: 5 * time.Second, tail: 2 * time.Second}
}

type churnResult struct {
	dials, failed, broken, skipped int64
	firstErr, firstBroken          string
}

func churnGroup() []*row {
	d := dest.plainAddr()
	var rows []*row
	for _, mode := range []string{"grpc", "http-connect"} {
		front := map[string]string{"grpc": "gRPC", "http-connect": "HTTP CONNECT"}[mode]
		for _, sc := range []string{"kill", "freeze+kill", "rolling"} {
			what := map[string]string{
				"kill":        "SIGKILL of one of two agents",
				"freeze+kill": fmt.Sprintf("one of two agents frozen (SIGSTOP) for %s, then SIGKILL", churnCfg().freeze),
				"rolling":     fmt.Sprintf("rolling restart of both agents (SIGTERM, a new agent, SIGKILL after %s if still up; then the other)", churnCfg().grace),
			}[sc]
			r := &row{id: "CH", workload: fmt.Sprintf("failed dials, %s frontend, %d dials/s (dial, 64-byte echo, close) during %s", front, churnRate, what),
				unit: "failed", lowerBetter: true, anchorName: upstream, cpuOurs: -1, cpuAnchor: -1, aim: "ours 0", oursZero: true}
			var res [2]churnResult
			failed := false
			for i, impl := range []string{ours, upstream} {
				x, err := churnOnce(impl, mode, sc, d)
				if err != nil {
					rows = append(rows, errRow(*r, err))
					failed = true
					break
				}
				res[i] = x
				logf("   %s %s %s: %d of %d dials failed, %d connections broke after the dial, %d not started (in-flight cap)%s",
					impl, mode, sc, x.failed, x.dials, x.broken, x.skipped, func() string {
						if x.firstErr == "" {
							return ""
						}
						return "; first error: " + x.firstErr
					}()+func() string {
						if x.firstBroken == "" {
							return ""
						}
						return "; first broken connection: " + x.firstBroken
					}())
			}
			if failed {
				continue
			}
			r.ours, r.anchor = []float64{float64(res[0].failed)}, []float64{float64(res[1].failed)}
			r.note = fmt.Sprintf("of %d dials ours, %d upstream; established connections that broke during the echo: ours %d, upstream %d; each server with its own two agents",
				res[0].dials, res[1].dials, res[0].broken, res[1].broken)
			if e := res[1].firstErr; e != "" {
				r.note += "; upstream's first error: " + e
			}
			if e := res[0].firstErr; e != "" {
				r.note += "; ours: " + e
			}
			for i, who := range []string{"ours", "upstream"} {
				if e := res[i].firstBroken; e != "" {
					r.note += "; " + who + "'s first broken connection: " + e
				}
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// churnOnce runs one implementation through one scenario under load.
func churnOnce(impl, mode, scenario, d string) (churnResult, error) {
	var x churnResult
	sz := churnCfg()
	srv, uds, addrs, err := startServer(impl, mode)
	if err != nil {
		return x, err
	}
	defer srv.Kill()
	var agents []*proc
	defer func() {
		for _, a := range agents {
			a.Kill()
		}
	}()
	seq := 0
	startOne := func() (*proc, error) {
		seq++
		var extra []string
		if impl == ours {
			extra = []string{"--graceful-shutdown-timeout=" + (sz.grace - time.Second).String()}
		}
		a, _, _, err := startAgentWith(impl, addrs, fmt.Sprintf("churn-%s-%d", impl, seq), extra...)
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
		return a, nil
	}
	for range 2 {
		if _, err := startOne(); err != nil {
			return x, err
		}
	}
	if err := waitReadyBackends(impl, addrs["admin"], 2); err != nil {
		return x, err
	}
	dial := grpcUDS(uds)
	if mode != "grpc" {
		dial = connectUDS(uds)
	}
	load := startChurnLoad(dial, d)
	defer load.finish()
	time.Sleep(sz.settle)
	switch scenario {
	case "kill":
		err = agents[0].Signal(syscall.SIGKILL)
	case "freeze+kill":
		if err = agents[0].Signal(syscall.SIGSTOP); err == nil {
			time.Sleep(sz.freeze)
			err = agents[0].Signal(syscall.SIGKILL)
		}
	case "rolling":
		for _, old := range []*proc{agents[0], agents[1]} {
			if err = old.Signal(syscall.SIGTERM); err != nil {
				break
			}
			if _, err = startOne(); err != nil {
				break
			}
			if _, werr := old.Wait(sz.grace); werr != nil {
				old.Kill()
			}
			if err = waitReadyBackends(impl, addrs["admin"], 2); err != nil {
				break
			}
		}
	}
	if err != nil {
		return x, err
	}
	time.Sleep(sz.tail)
	x = load.finish()
	if srv.Exited() {
		return x, fmt.Errorf("%s proxy-server exited (log: %s)\n%s", impl, srv.logPath, srv.Tail(20))
	}
	return x, nil
}

// startAgentWith is startAgentID with extra flags.
func startAgentWith(impl string, serverAddrs map[string]string, id string, extra ...string) (*proc, string, string, error) {
	saved := agentExtra
	agentExtra = extra
	defer func() { agentExtra = saved }()
	return startAgentID(impl, serverAddrs, id)
}

// waitReadyBackends waits until the server's ready_backends (both
// implementations export it since v0.34) reads n.
func waitReadyBackends(impl, admin string, n int) error {
	const name = `konnectivity_network_proxy_server_ready_backends{proxy_strategy="default"}`
	return goharness.Eventually(context.Background(), startPatience, 10*time.Millisecond, func() error {
		body, err := get200(admin, "/metrics")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, name+" "); ok {
				if v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64); int(v) == n {
					return nil
				}
				return fmt.Errorf("%s proxy-server %s", impl, line)
			}
		}
		return fmt.Errorf("%s proxy-server /metrics has no %s", impl, name)
	})
}

// churnLoad starts churnRate dials per second, each bounded by
// churnDialBudget, until finish (or churnMaxRun); at most
// churnRate*churnDialBudget are in flight (a tick past that is counted as
// skipped, not started).
type churnLoad struct {
	stop                           chan struct{}
	done                           sync.WaitGroup
	once                           sync.Once
	dials, failed, broken, skipped atomic.Int64
	firstErr, firstBroken          atomic.Pointer[string]
	result                         churnResult
}

func startChurnLoad(dial dialFunc, d string) *churnLoad {
	l := &churnLoad{stop: make(chan struct{})}
	sem := make(chan struct{}, int(churnRate*churnDialBudget/time.Second))
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		tick := time.NewTicker(time.Second / churnRate)
		defer tick.Stop()
		end := time.After(churnMaxRun)
		for {
			select {
			case <-l.stop:
				return
			case <-end:
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			default:
				l.skipped.Add(1)
				continue
			}
			l.dials.Add(1)
			l.done.Add(1)
			go func() {
				defer l.done.Done()
				defer func() { <-sem }()
				l.one(dial, d)
			}()
		}
	}()
	return l
}

func (l *churnLoad) one(dial dialFunc, d string) {
	ctx, cancel := context.WithTimeout(context.Background(), churnDialBudget)
	c, err := dial(ctx, d)
	cancel()
	if err != nil {
		l.failed.Add(1)
		s := err.Error()
		l.firstErr.CompareAndSwap(nil, &s)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(churnDialBudget))
	if err := clientEcho(c, 64); err != nil {
		l.broken.Add(1)
		s := err.Error()
		l.firstBroken.CompareAndSwap(nil, &s)
	}
}

// finish stops starting dials, waits for those in flight and returns the
// counts (idempotent).
func (l *churnLoad) finish() churnResult {
	l.once.Do(func() {
		close(l.stop)
		l.done.Wait()
		l.result = churnResult{dials: l.dials.Load(), failed: l.failed.Load(), broken: l.broken.Load(), skipped: l.skipped.Load()}
		if p := l.firstErr.Load(); p != nil {
			l.result.firstErr = *p
		}
		if p := l.firstBroken.Load(); p != nil {
			l.result.firstBroken = *p
		}
	})
	return l.result
}
