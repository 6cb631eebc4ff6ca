package e2e

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
)

// grantLoop takes and releases one lock in a loop and records when each
// grant arrived.
type grantLoop struct {
	mu     sync.Mutex
	grants []time.Time
	errs   int
	cancel context.CancelFunc
	done   chan struct{}
}

func startGrantLoop(t *testing.T, c *client.Client) *grantLoop {
	s := newSession(t, c, 10*time.Second, "grant loop")
	ctx, cancel := context.WithCancel(context.Background())
	g := &grantLoop{cancel: cancel, done: make(chan struct{})}
	m := client.NewMutex(s, "rolling")
	go func() {
		defer close(g.done)
		for ctx.Err() == nil {
			if _, err := m.Lock(ctx); err != nil {
				g.mu.Lock()
				g.errs++
				g.mu.Unlock()
				continue
			}
			g.mu.Lock()
			g.grants = append(g.grants, time.Now())
			g.mu.Unlock()
			_ = m.Unlock(ctx)
		}
	}()
	t.Cleanup(g.stop)
	return g
}

func (g *grantLoop) stop() {
	g.cancel()
	<-g.done
}

// gapAround returns the longest time between two grants in a row from the
// last grant before at until 20 grants after it (it waits up to 10 s for
// those): a grant that was on its way when the leader stopped does not
// hide the gap that follows it.
func (g *grantLoop) gapAround(t *testing.T, at time.Time) time.Duration {
	t.Helper()
	var gap time.Duration
	waitFor(t, 10*time.Second, "20 grants after the leader stopped", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		gap = 0
		first := -1
		for i, ts := range g.grants {
			if !ts.Before(at) {
				first = i
				break
			}
		}
		if first < 1 || len(g.grants)-first < 20 {
			return false
		}
		for i := first; i < first+20; i++ {
			gap = max(gap, g.grants[i].Sub(g.grants[i-1]))
		}
		return true
	})
	return gap
}

func (g *grantLoop) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.grants)
}

// A leader stopped with SIGTERM hands leadership to another member before
// it exits, so that the group goes on granting after a TimeoutNow and one
// election rather than an election timeout. The test asserts the hand-off
// (the old leader saw the new one before it exited) and logs the gap in
// grants of a lock loop, beside the gap after a SIGKILL of the leader, for
// the README; it does not assert times.
func TestSIGTERMHandsOffLeadership(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClusterClient(t, c.addrs())
	loop := startGrantLoop(t, cl)
	waitFor(t, 10*time.Second, "the lock loop to run", func() bool { return loop.count() > 50 })

	var gaps []string
	for round := range 2 {
		// SIGTERM, then SIGKILL of the leader of the moment; the node
		// comes back before the next round.
		leader := c.waitLeader(t, 30*time.Second)
		waitFor(t, 10*time.Second, "grants under the leader", func() bool { return loop.count() > 100*(round+1) })
		time.Sleep(200 * time.Millisecond)
		at := time.Now()
		if round == 0 {
			leader.killed = true
			leader.proc.signal(t, syscall.SIGTERM)
			if code := leader.proc.waitExit(t, 10*time.Second); code != 0 {
				t.Fatalf("%s exited with %d after SIGTERM; stderr:\n%s", leader.id, code, tail(leader.proc.Stderr(), 3000))
			}
			stderr := leader.proc.Stderr()
			if !strings.Contains(stderr, "leadership handed over") {
				t.Fatalf("%s exited after SIGTERM without handing over leadership; stderr:\n%s", leader.id, tail(stderr, 3000))
			}
		} else {
			leader.kill(t)
		}
		gap := loop.gapAround(t, at)
		kind := map[int]string{0: "SIGTERM", 1: "SIGKILL"}[round]
		gaps = append(gaps, kind+" "+gap.Round(time.Millisecond).String())
		t.Logf("%s of leader %s: the longest gap between grants was %v", kind, leader.id, gap.Round(time.Millisecond))
		leader.restart(t)
		c.waitLeader(t, 30*time.Second)
	}
	loop.mu.Lock()
	errs := loop.errs
	loop.mu.Unlock()
	t.Logf("grant gaps: %s (lock loop errors: %d)", strings.Join(gaps, ", "), errs)
}
