package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"konnectivity-goharness"
)

// proc is one child process (a proxy under test); its output also goes to
// a log file under the work directory.
type proc struct {
	*goharness.Proc
	logPath string
}

var (
	logMu  sync.Mutex
	logSeq int
)

// startProc starts path with args; the kernel kills it if the harness dies
// (Pdeathsig) and killAll kills it at the end.
func startProc(name, path string, args []string, extraEnv ...string) (*proc, error) {
	logMu.Lock()
	logSeq++
	seq := logSeq
	logMu.Unlock()
	logPath := filepath.Join(workDir, "logs", fmt.Sprintf("%03d-%s.log", seq, strings.NewReplacer(" ", "-", "/", "-").Replace(name)))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	// Debugging aid: BENCH_RUST_LOG reaches our processes as RUST_LOG
	// (e.g. konnectivity_proto::flow=trace logs every window sample).
	if v := os.Getenv("BENCH_RUST_LOG"); v != "" {
		extraEnv = append(extraEnv, "RUST_LOG="+v)
	}
	opts := goharness.Options{
		Env:  extraEnv,
		Drop: []string{"RUST_LOG=", "GODEBUG="},
		Log:  f,
		Keep: 2000,
	}
	if os.Getenv("BENCH_TERM_FIRST") != "" {
		// Debugging aid (e.g. valgrind --tool=massif writes its profile
		// at exit): SIGTERM first, SIGKILL after 20 s.
		opts.TermGrace = 20 * time.Second
	}
	p, err := goharness.Start(name, path, args, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &proc{Proc: p, logPath: logPath}, nil
}

func killAll() int { return goharness.KillAll() }

// listeningAddrs is the loopback address of each named TCP listener our
// binary logged.
func listeningAddrs(p *proc, names ...string) (map[string]string, error) {
	return goharness.LoopbackAddrs(p.Proc, startPatience, names...)
}

const startPatience = 60 * time.Second

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get200 GETs path from addr (following redirects) and returns the body
// (at most 16 MiB) of a 200 answer; any other status is an error.
func get200(addr, path string) ([]byte, error) {
	res, err := httpc.Get("http://" + addr + path)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s%s = %d", addr, path, res.StatusCode)
	}
	return body, nil
}

func want200(addr, path string) error {
	_, err := get200(addr, path)
	return err
}

// pickPort is a free loopback port for an anchor (or for ours where a
// port has to be known before start).
func pickPort() int {
	p, err := goharness.PickPort()
	if err != nil {
		fatalf("%v", err)
	}
	return p
}

// --- /proc accounting ---------------------------------------------------

const clkTck = 100 // sysconf(_SC_CLK_TCK) on Linux

// cpuSeconds is utime+stime of the processes (all their threads).
func cpuSeconds(pids []int) float64 {
	var ticks int64
	for _, pid := range pids {
		f, err := goharness.StatFieldsOf(pid)
		if err != nil || len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return float64(ticks) / clkTck
}

// memKiB is the sum of VmRSS and of VmHWM (peak RSS) of the processes.
func memKiB(pids []int) (rss, hwm int64) {
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "VmRSS":
				rss += n
			case "VmHWM":
				hwm += n
			}
		}
	}
	return rss, hwm
}
