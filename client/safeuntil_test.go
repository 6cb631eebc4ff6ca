package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
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
// fails with fence.ErrSessionLost, whether the lock is new or held
// already, and the session is lost, so that the lock the service granted
// is released for the others.
func TestLockPastSafeUntilGrantsNothing(t *testing.T) {
	for _, relock := range []bool{false, true} {
		name := map[bool]string{false: "a new lock", true: "a lock held already"}[relock]
		t.Run(name, func(t *testing.T) {
			srv := startServer(t, nil)
			clk := clock.NewFake()
			c := mustClient(t, srv, clk)
			ctx := context.Background()
			s := mustSession(t, c, 3*time.Second)
			m := NewMutex(s, "l")
			var held *Grant
			if relock {
				g, err := m.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = g
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
