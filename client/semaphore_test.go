package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// A semaphore of 3 permits admits three sessions at once, each with a token
// of its own; a fourth waits and gets the permit the first one releases.
// Naming another number of permits is refused while the name is in use.
func TestSemaphore(t *testing.T) {
	c := clientOfNewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	session := func() *Session { return mustSession(t, c, 10*time.Second) }
	var sems []*Semaphore
	var tokens []uint64
	for range 3 {
		sm := NewSemaphore(session(), "pool", 3)
		g, err := sm.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("permit %d: %v", len(sems)+1, err)
		}
		if n := len(tokens); n > 0 && g.Token() <= tokens[n-1] {
			t.Fatalf("tokens %v then %d: want each permit a higher token", tokens, g.Token())
		}
		if again, err := sm.Acquire(ctx); err != nil || again != g {
			t.Fatalf("acquiring a held permit again: %v, %v; want the same grant", again, err)
		}
		sems = append(sems, sm)
		tokens = append(tokens, g.Token())
	}
	fourth := NewSemaphore(session(), "pool", 3)
	if _, err := fourth.TryAcquire(ctx); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("a fourth permit of three: %v, want ErrLocked", err)
	}
	if _, err := NewSemaphore(session(), "pool", 4).TryAcquire(ctx); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("the same semaphore with 4 permits: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewMutex(session(), "pool").TryLock(ctx); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("the semaphore taken as a mutex: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewSemaphore(session(), "none", 0).Acquire(ctx); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("a semaphore of 0 permits: %v, want ErrInvalidArgument", err)
	}

	got := inBackground(t, func() (*Grant, error) { return fourth.Acquire(ctx) })
	waitForLock(t, c, "pool", func(holders, waiters int) bool { return holders == 3 && waiters == 1 })
	locks, err := c.Locks(ctx, "pool")
	if err != nil || len(locks) != 1 || locks[0].GetPermits() != 3 {
		t.Fatalf("Locks: %v, %v; want pool with 3 permits", locks, err)
	}
	first := sems[0].Grant()
	if err := sems[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if first.Err() == nil {
		t.Fatal("a released permit's grant still holds")
	}
	select {
	case g := <-got:
		if g == nil || g.Token() <= tokens[2] {
			t.Fatalf("the waiter's grant %v, want a token above %d", g, tokens[2])
		}
	case <-ctx.Done():
		t.Fatal("the waiter did not get the released permit")
	}
	if err := sems[0].Release(ctx); !errors.Is(err, fence.ErrNotHolder) {
		t.Fatalf("releasing twice: %v, want ErrNotHolder", err)
	}
}

// waitForLock polls the lock's holders and waiters until cond holds.
func waitForLock(t *testing.T, c *Client, name string, cond func(holders, waiters int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := c.Locks(context.Background(), name)
		for _, l := range locks {
			if l.GetName() == name && cond(len(l.GetHolders()), len(l.GetWaiters())) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %q never reached the expected state: %v, %v", name, locks, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
