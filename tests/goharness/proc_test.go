package goharness

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// alive says whether pid still exists (a zombie counts as gone: init reaps it).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	st, err := StatFieldsOf(pid)
	return err == nil && len(st) > 0 && st[0] != "Z"
}

func TestKillTakesOrphanedGrandchildrenToo(t *testing.T) {
	// A wrapper that dies on SIGTERM and leaves its child to init, as a
	// profiler's wrapper script does.
	p, err := Start("wrapper", "/bin/sh", []string{"-c", "sleep 1000 & echo child=$!; wait"}, Options{TermGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	line, _, err := p.WaitLine(0, 10*time.Second, "child=")
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimPrefix(line, "child="))
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("wrapper still running")
	}
	if err := Eventually(context.Background(), 10*time.Second, 10*time.Millisecond, func() error {
		if alive(child) {
			return errors.New("grandchild still running")
		}
		return nil
	}); err != nil {
		_ = syscall.Kill(child, syscall.SIGKILL)
		t.Fatal(err)
	}
	p.Kill() // idempotent
}

func TestWaitLineSeesOnlyLinesAfterMark(t *testing.T) {
	p, err := Start("printer", "/bin/sh", []string{"-c", "echo one; echo two"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if _, _, err := p.WaitLine(0, 10*time.Second, "one"); err != nil {
		t.Fatal(err)
	}
	mark := p.Mark()
	if _, _, err := p.WaitLine(mark, 200*time.Millisecond, "one"); err == nil {
		t.Fatal("found a line logged before the mark")
	}
}
