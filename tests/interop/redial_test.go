package interop

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"konnectivity-goharness"
)

// TestDialsPendingOnAKilledAgent (issue 38.1, upstream #126 and #566):
// two of our agents serve one server; one freezes (SIGSTOP), so the dials
// the server gives it stay unanswered, and is killed (SIGKILL). With our
// server every dial succeeds through the other agent; upstream's fails
// (or leaves hanging until the client gives up) each one pending on the
// dead agent. Both counts are logged side by side; ours must be 0.
func TestDialsPendingOnAKilledAgent(t *testing.T) {
	for _, im := range []impl{upstream, ours} {
		t.Run("server="+string(im), func(t *testing.T) {
			t.Parallel()
			failed, total := dialsAcrossAKill(t, im)
			t.Logf("server=%s: %d of %d dials failed when the agent holding some was killed", im, failed, total)
			if im == ours && failed != 0 {
				t.Fatalf("our server failed %d of %d dials the surviving agent could serve", failed, total)
			}
		})
	}
}

func dialsAcrossAKill(t *testing.T, im impl) (failed, total int) {
	srv := startServer(t, serverConfig{impl: im, front: grpcUDS})
	doomed := startAgent(t, ours, srv.agentPort, "doomed-"+string(im))
	startAgent(t, ours, srv.agentPort, "survivor-"+string(im))
	if err := srv.waitBackends(2); err != nil {
		t.Fatal(err)
	}
	dest := newTCPDest(t, echoHandler)
	if err := doomed.p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const dials = 40
	errs := make(chan error, dials)
	var wg sync.WaitGroup
	// Upstream's server has no dial deadline (#789): its dials pending on
	// the dead agent end only when the client gives up. Ours re-sends them
	// as the agent's stream ends (or fails them at once).
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	for i := 0; i < dials; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := srv.dial(ctx, dest.addr, false)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			errs <- roundtrip(c, []byte(fmt.Sprintf("dial %d", i)))
		}(i)
	}
	// The frozen agent holds some dials (half go to each agent).
	err := goharness.Eventually(context.Background(), startPatience, 20*time.Millisecond, func() error {
		m, err := srv.metrics()
		if err != nil {
			return err
		}
		if v, _ := m.get(mServerPending, nil); v < 5 {
			return fmt.Errorf("%s proxy-server pending_backend_dials = %g, want at least 5", im, v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		total++
		if e != nil {
			failed++
			if failed <= 3 {
				t.Logf("server=%s: %v", im, e)
			}
		}
	}
	return failed, total
}
