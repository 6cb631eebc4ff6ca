package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// holdTimers holds back s's keepalive timers, as if the process had been
// paused: when the clock passes them, their callbacks have not run yet.
func holdTimers(s *Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dueTimer.Stop()
	s.lostTimer.Stop()
}

// A Lock that returns after the session's safe-until passed, before the
// session's own timers noticed (a pause), grants nothing: the service may
// have expired the session already, and given the lock to another. It
// fails with fence.ErrSessionLost, whether the lock is new, held already,
// or granted at the end of a wait that the pause went through, and the
// session is lost, so that the lock the service granted is released for
// the others.
func TestLockPastSafeUntilGrantsNothing(t *testing.T) {
	t.Run("granted after a wait through the pause", func(t *testing.T) {
		srv, clk, s := fakeClockSession(t, 3*time.Second)
		ctx := context.Background()
		others := mustClient(t, srv, nil)
		holder := NewMutex(mustSession(t, others, 10*time.Second), "l")
		mustLock(t, ctx, holder)
		type result struct {
			g   *Grant
			err error
		}
		done := make(chan result, 1)
		go func() {
			g, err := NewMutex(s, "l").Lock(ctx)
			done <- result{g, err}
		}()
		waitForLock(t, others, "l", func(holders, waiters int) bool { return waiters == 1 })
		holdTimers(s)
		clk.Advance(5 * time.Second) // past the safe-until, unnoticed
		mustUnlock(t, ctx, holder)
		r := <-done
		if !errors.Is(r.err, fence.ErrSessionLost) {
			t.Fatalf("Lock granted past the safe-until: %v, %v; want fence.ErrSessionLost", r.g, r.err)
		}
		if _, err := NewMutex(mustSession(t, others, 10*time.Second), "l").TryLock(ctx); err != nil {
			t.Fatalf("the lock granted past the safe-until was not given up: %v", err)
		}
	})
	for _, relock := range []bool{false, true} {
		name := map[bool]string{false: "a new lock", true: "a lock held already"}[relock]
		t.Run(name, func(t *testing.T) {
			srv, clk, s := fakeClockSession(t, 3*time.Second)
			ctx := context.Background()
			m := NewMutex(s, "l")
			var held *Grant
			if relock {
				held = mustLock(t, ctx, m)
			}
			holdTimers(s)
			clk.Advance(5 * time.Second) // past the safe-until, unnoticed
			if g, err := m.Lock(ctx); !errors.Is(err, fence.ErrSessionLost) {
				t.Fatalf("Lock past the safe-until: %v, %v; want fence.ErrSessionLost", g, err)
			}
			if !errors.Is(s.Err(), fence.ErrSessionLost) {
				t.Fatalf("session err %v, want fence.ErrSessionLost", s.Err())
			}
			if held != nil && !errors.Is(held.Err(), fence.ErrSessionLost) {
				t.Fatalf("the grant held err %v, want fence.ErrSessionLost", held.Err())
			}
			other := mustSession(t, mustClient(t, srv, nil), 10*time.Second)
			if _, err := NewMutex(other, "l").TryLock(ctx); err != nil {
				t.Fatalf("the lock granted past the safe-until was not given up: %v", err)
			}
		})
	}
}

// A suspend past the safe-until (the machine slept, its monotonic clock
// stood still) ends the session and its grants as lost as soon as the
// process runs again: at once for SafeUntil, which is in the past, and
// within the wake check's interval for the contexts, not when the next
// renewal falls due on the monotonic clock (a third of the TTL later).
// Its close gives its lock up.
func TestSuspendPastSafeUntilEndsTheSession(t *testing.T) {
	srv, clk, s := fakeClockSession(t, 3*time.Second)
	ctx := context.Background()
	g := mustLock(t, ctx, NewMutex(s, "l"))
	clk.Suspend(5 * time.Second)
	if safe := s.SafeUntil(); !safe.Before(clk.Now()) {
		t.Fatalf("after a suspend of 5s, SafeUntil is %v from now, want it past", safe.Sub(clk.Now()))
	}
	clk.Advance(wakeCheck)
	select {
	case <-g.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the grant lives on after a suspend past its safe-until")
	}
	if !errors.Is(g.Err(), fence.ErrSessionLost) || !errors.Is(s.Err(), fence.ErrSessionLost) {
		t.Fatalf("grant err %v, session err %v; want fence.ErrSessionLost", g.Err(), s.Err())
	}
	// The client abandons the session on the service as it ends it here:
	// the lock is free at once, well before the session's TTL (3s) would
	// free it. The abandonment is under way as the grant ends, so wait a
	// little for it.
	other := mustSession(t, mustClient(t, srv, nil), 10*time.Second)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for {
		_, err := NewMutex(other, "l").TryLock(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock of the session lost to a suspend is still held: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Lock right after a suspend past the safe-until, before anything else
// noticed it, grants nothing.
func TestLockAfterSuspendGrantsNothing(t *testing.T) {
	_, clk, s := fakeClockSession(t, 3*time.Second)
	clk.Suspend(5 * time.Second)
	if g, err := NewMutex(s, "l").Lock(context.Background()); !errors.Is(err, fence.ErrSessionLost) {
		t.Fatalf("Lock after a suspend past the safe-until: %v, %v; want fence.ErrSessionLost", g, err)
	}
}

// A suspend shorter than what is left of the safe-until brings it closer
// by the suspend's length, and the session renews at once (the service's
// clock went on), not when its renewal falls due on the monotonic clock.
func TestShortSuspendRenewsAtOnce(t *testing.T) {
	_, clk, s := fakeClockSession(t, 3*time.Second)
	safe := s.SafeUntil()
	clk.Suspend(time.Second)
	if got := s.SafeUntil(); !got.Equal(safe.Add(-time.Second)) {
		t.Fatalf("after a suspend of 1s, SafeUntil moved %v, want -1s", got.Sub(safe))
	}
	clk.Advance(wakeCheck)
	deadline := time.Now().Add(5 * time.Second)
	for !s.SafeUntil().After(safe) {
		if time.Now().After(deadline) || s.Err() != nil {
			t.Fatalf("no renewal after a short suspend: err %v", s.Err())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if want := clk.Now().Add(3*time.Second*99/100 - 100*time.Millisecond); !s.SafeUntil().Equal(want) {
		t.Fatalf("renewed to %v from now, want %v", s.SafeUntil().Sub(clk.Now()), want.Sub(clk.Now()))
	}
}
