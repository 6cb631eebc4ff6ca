package client

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/server"
)

// A session the client gives up, because it could not renew it in time,
// ends on the service as an expiry would: the lock its holder took with a
// lock-delay is held back for that delay, since the holder may still be
// writing. A session its healthy holder closes hands the lock on at once.
// (Giving up released the lock at once, 5 ms after, with a 10 s delay.)
func TestGivenUpSessionKeepsLockDelay(t *testing.T) {
	clk := clock.NewFake()
	srv := startServer(t, func(c *server.Config) { c.Clock = clk }) // the leader's clock times the delay
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		end     func(*Session)
		delayed bool
	}{
		{"given-up", func(s *Session) { s.lose(fmt.Errorf("%w: given up by the test", fence.ErrSessionLost)) }, true},
		{"closed", func(s *Session) {
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder, waiter := mustSession(t, c, time.Hour), mustSession(t, c, time.Hour)
			mustLock(t, ctx, NewMutex(holder, tc.name, WithLockDelay(10*time.Second)))
			granted := make(chan error, 1)
			go func() {
				_, err := NewMutex(waiter, tc.name).Lock(ctx)
				granted <- err
			}()
			waitForLock(t, c, tc.name, func(holders, waiters int) bool { return waiters == 1 })
			tc.end(holder)
			if tc.delayed {
				// The holder's grant ended: the lock is delayed, or was handed on.
				waitForLock(t, c, tc.name, func(holders, waiters int) bool { return holders == 0 || waiters == 0 })
				locks, err := c.Locks(ctx, tc.name)
				if err != nil || len(locks) != 1 || !locks[0].GetDelayed() {
					t.Fatalf("after the holder's session was given up: %v, %v; want the lock delayed", locks, err)
				}
				select {
				case err := <-granted:
					t.Fatalf("the waiter was granted the lock under lock-delay (%v)", err)
				default:
				}
				clk.Advance(10 * time.Second)
			}
			select {
			case err := <-granted:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the waiter was not granted the lock (delayed %v)", tc.delayed)
			}
		})
	}
}
