package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"konnectivity-goharness"
)

var perfSeq int

// startPerf records a flat perf profile (cpu-clock, 999 Hz) of the
// subject's processes until the returned function is called, then writes
// a text report next to the data file.
func startPerf(tag string, s *subject) func() {
	perf, err := exec.LookPath("perf")
	if err != nil {
		logf("--perf: perf not found; no profile")
		return nil
	}
	dir := filepath.Join(workDir, "perf")
	_ = os.MkdirAll(dir, 0o755)
	perfSeq++
	slug := strings.Trim(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(tag, "-"), "-")
	if len(slug) > 80 {
		slug = slug[:80]
	}
	data := filepath.Join(dir, fmt.Sprintf("%02d-%s.data", perfSeq, slug))
	var pids []string
	for _, p := range s.pids() {
		pids = append(pids, strconv.Itoa(p))
	}
	args := []string{"record", "-e", "cpu-clock", "-F", "999", "-o", data, "-p", strings.Join(pids, ",")}
	if os.Getenv("BENCH_PERF_CALLGRAPH") != "" {
		// Callers of each sample (DWARF unwinding: release builds keep
		// line tables, not frame pointers); read with perf report -G.
		args = append(args, "--call-graph", "dwarf,16384")
	}
	stat := os.Getenv("BENCH_PERF_STAT") != ""
	if stat {
		// Counts instead of samples: syscalls, context switches, CPU;
		// BENCH_PERF_EVENTS replaces the list (e.g. per-syscall tracepoints).
		events := "raw_syscalls:sys_enter,context-switches,cpu-clock"
		if e := os.Getenv("BENCH_PERF_EVENTS"); e != "" {
			events = e
		}
		args = []string{"stat", "--per-thread", "-e", events, "-o", data, "-p", strings.Join(pids, ",")}
	}
	cmd := exec.Command(perf, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logFile, _ := os.Create(data + ".log")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logf("--perf: %v", err)
		return nil
	}
	// perf record writes its file header once its events are open (perf
	// stat writes only at the end: nothing to wait on).
	if stat {
		return stopper(cmd, perf, data, logFile, stat)
	}
	if err := goharness.Eventually(context.Background(), 10*time.Second, 5*time.Millisecond, func() error {
		st, err := os.Stat(data)
		if err != nil {
			return err
		}
		if st.Size() == 0 {
			return fmt.Errorf("empty")
		}
		return nil
	}); err != nil {
		logf("--perf: perf did not start: %v", err)
	}
	return stopper(cmd, perf, data, logFile, stat)
}

func stopper(cmd *exec.Cmd, perf, data string, logFile *os.File, stat bool) func() {
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if stat {
			logf("   perf stat: %s", data)
			return
		}
		out, err := exec.Command(perf, "report", "-i", data, "--stdio", "--no-children",
			"--sort", "comm,dso,symbol", "--percent-limit", "1").CombinedOutput()
		if err != nil {
			logf("--perf report: %v", err)
		}
		_ = os.WriteFile(data+".txt", out, 0o644)
		logf("   profile: %s.txt", data)
	}
}
