package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/server"
)

// Lock, Unlock and Lock again: tokens rise, a grant's context ends on
// Unlock, and locking a held mutex returns the same grant. The client's
// goroutines are all gone once the session and client are closed.
func TestMutexLifecycle(t *testing.T) {
	srv := startServer(t, nil)
	// The server runs in this process: its idle workers stay, by design,
	// for its next operations; the client's own goroutines must all end.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/fencelock/fence/server/internal/apinet.(*Workers).serve"))
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(5*time.Second), WithOwner("test"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMutex(s, "orders")
	g1 := mustLock(t, ctx, m)
	if again, err := m.Lock(ctx); err != nil || again.Token() != g1.Token() {
		t.Fatalf("re-lock = %v, %v; want the same grant %d", again, err, g1.Token())
	}
	mustUnlock(t, ctx, m)
	select {
	case <-g1.Done():
	default:
		t.Fatal("grant context still live after Unlock")
	}
	g2 := mustLock(t, ctx, m)
	if g2.Token() <= g1.Token() {
		t.Fatalf("second token %d is not above %d", g2.Token(), g1.Token())
	}
	locks, err := c.Locks(ctx, "orders")
	if err != nil || len(locks) != 1 || locks[0].GetHolders()[0].GetToken() != g2.Token() || locks[0].GetHolders()[0].GetOwner() != "test" {
		t.Fatalf("Locks = %v, %v", locks, err)
	}
	if res, err := c.Check(ctx, "orders", g1.Token()); err != nil || res.Current || res.CurrentToken != g2.Token() {
		t.Fatalf("Check(old token) = %+v, %v", res, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Err(), ErrSessionClosed) || !errors.Is(s.Err(), fence.ErrReleased) || g2.Err() == nil {
		t.Fatalf("after Close: session %v, grant %v", s.Err(), g2.Err())
	}
	if !errors.Is(g1.Err(), ErrLockReleased) || !errors.Is(g1.Err(), fence.ErrReleased) {
		t.Fatalf("after Unlock: grant %v, want ErrLockReleased", g1.Err())
	}
	c.Close()
}

// Errors keep their identity across the wire.
func TestErrorsAreSentinels(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	a := mustSession(t, c, 10*time.Second)
	b := mustSession(t, c, 10*time.Second)
	mustLock(t, ctx, NewMutex(a, "l"))
	if _, err := NewMutex(b, "l").TryLock(ctx); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("TryLock on a held lock: %v, want ErrLocked", err)
	}
	if _, err := NewMutex(b, "l", WithWaitTimeout(100*time.Millisecond)).Lock(ctx); !errors.Is(err, fence.ErrWaitTimeout) {
		t.Fatalf("Lock with wait timeout: %v, want ErrWaitTimeout", err)
	}
	if _, err := NewMutex(b, "").Lock(ctx); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), "lock name") {
		t.Fatalf("empty name: %v, want ErrInvalidArgument naming the lock name", err)
	}
	if err := NewMutex(b, "l").Unlock(ctx); !errors.Is(err, fence.ErrNotHolder) {
		t.Fatalf("Unlock of a mutex never locked: %v, want ErrNotHolder", err)
	}
	if _, err := c.NewSession(ctx, WithTTL(time.Millisecond)); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("TTL 1ms: %v, want ErrInvalidArgument", err)
	}
}

// When no renewal gets through before the safe-until deadline, the session
// and its grants end with ErrSessionLost: the holder learns of the possible
// loss before the server's TTL (counted from later) runs out.
func TestSessionLostWhenRenewalsStop(t *testing.T) {
	srv := startServer(t, nil)
	clk := clock.NewFake()
	c := mustClient(t, srv, clk)
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g := mustLock(t, ctx, NewMutex(s, "l"))
	want := clk.Now().Add(3*time.Second*99/100 - 100*time.Millisecond)
	if got := s.SafeUntil(); got.After(want) {
		t.Fatalf("safe until %v is later than sent+TTL*(1-drift)-margin = %v", got, want)
	}
	srv.Close() // no renewal can get through any more
	clk.WaitForTimers(2)
	clk.Advance(3 * time.Second)
	mustEndWith(t, "the grant, past its safe-until deadline,", g.Done(), g.Err, fence.ErrSessionLost)
	if !errors.Is(s.Err(), fence.ErrSessionLost) {
		t.Fatalf("session err %v, want ErrSessionLost", s.Err())
	}
	if _, err := NewMutex(s, "l").Lock(ctx); !errors.Is(err, fence.ErrSessionLost) {
		t.Fatalf("Lock on a lost session: %v", err)
	}
}

// A process paused past its session's safe-until (SIGSTOP, a GC pause, a
// VM migration) finds on waking that the session may have expired: it
// ends the session as lost, and does not renew it, though the service
// answers and would renew it.
func TestPausedPastSafeUntilLosesTheSession(t *testing.T) {
	_, clk, s := fakeClockSession(t, 3*time.Second)
	clk.WaitForTimers(2)
	clk.Advance(5 * time.Second) // the renewal and the deadline pass at once
	mustEndWith(t, "the session, after a pause past its safe-until,", s.Done(), s.Err, fence.ErrSessionLost)
}

// Renewals keep a session alive well past its TTL.
func TestKeepAliveRenews(t *testing.T) {
	_, clk, s := fakeClockSession(t, 3*time.Second)
	for range 10 {
		before := s.SafeUntil()
		clk.WaitForTimers(2)
		clk.Advance(time.Second)
		deadline := time.Now().Add(10 * time.Second)
		for !s.SafeUntil().After(before) {
			if time.Now().After(deadline) || s.Err() != nil {
				t.Fatalf("no renewal: err %v", s.Err())
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
}

// A session the server expired ends with ErrSessionNotFound on the next
// renewal.
func TestSessionExpiredByServer(t *testing.T) {
	srvClock := clock.NewFake()
	srv := startServer(t, func(c *server.Config) { c.Clock = srvClock })
	clk := clock.NewFake()
	ctx := context.Background()
	s := mustSession(t, mustClient(t, srv, clk), 3*time.Second)
	srvClock.Advance(4 * time.Second)
	// Wait until the server has expired it: a fresh client's Lock fails.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := NewMutex(s, "probe").TryLock(ctx)
		if errors.Is(err, fence.ErrSessionNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not expire the session: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	clk.WaitForTimers(2)
	clk.Advance(time.Second) // the next renewal
	mustEndWith(t, "the session the server expired", s.Done(), s.Err, fence.ErrSessionNotFound)
}

// Close does not wait out the retry budget of a renewal in flight when the
// service is gone.
func TestCloseDoesNotHangWhenServiceIsDown(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	s, err := c.NewSession(context.Background(), WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	time.Sleep(1500 * time.Millisecond) // a renewal (every TTL/3) is now retrying
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		s.Close(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung with the service down")
	}
}

// Readers share the lock, a writer waits for them, and readers that come
// after a waiting writer wait behind it (FIFO, no writer starvation).
func TestRWMutex(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	session := func() *Session { return mustSession(t, c, 10*time.Second) }
	r1, r2, w, r3 := NewRWMutex(session(), "rw"), NewRWMutex(session(), "rw"), NewRWMutex(session(), "rw"), NewRWMutex(session(), "rw")
	g1, err := r1.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := r2.TryRLock(ctx)
	if err != nil || g2.Token() == g1.Token() {
		t.Fatalf("second reader: %v, %v; want its own grant beside the first", g2, err)
	}
	if _, err := w.TryLock(ctx); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("writer while readers hold: %v, want ErrLocked", err)
	}
	wrote := inBackground(t, func() (*Grant, error) { return w.Lock(ctx) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := c.Locks(ctx, "rw")
		if err == nil && len(locks) == 1 && len(locks[0].GetWaiters()) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := r3.TryRLock(ctx); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("reader behind a waiting writer: %v, want ErrLocked", err)
	}
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-wrote:
		if g == nil || g.Token() <= g2.Token() {
			t.Fatalf("writer's grant %v", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer was not granted after the readers left")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A session the client gives up on is closed on the service at once, even
// when the node that answered last hangs: the close goes to every node.
func TestLostSessionIsClosedPastAHungNode(t *testing.T) {
	srv, c := clientWithAHungNode(t)
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	c.setCurrent(c.endpointAt(1)) // the hung node answered last
	s.lose(fmt.Errorf("%w: given up by the test", fence.ErrSessionLost))
	status, err := mustClient(t, srv, nil).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.GetSessions() != 0 {
		t.Fatalf("the lost session is still open on the service (%d sessions)", status.GetSessions())
	}
}

// A node that accepts connections but never answers (paused, a stuck disk)
// does not cost a session its life: a keepalive that gets no answer from it
// within a quarter of the TTL goes to the next node, well before the
// session's safe-until deadline.
func TestKeepAlivePassesAHungNode(t *testing.T) {
	_, c := clientWithAHungNode(t)
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s.Close(closeCtx)
	}()
	c.setCurrent(c.endpointAt(1)) // the next keepalive goes to the hung node first
	select {
	case <-s.Done():
		t.Fatalf("the session was lost behind a hung node: %v", s.Err())
	case <-time.After(5 * time.Second):
	}
}

// clientWithAHungNode starts a node, and returns it and a client whose
// endpoints are the node and, second, a hung one (see hungListener).
func clientWithAHungNode(t *testing.T) (*server.Server, *Client) {
	t.Helper()
	srv := startServer(t, nil)
	c := mustNew(t, WithEndpoints(srv.Addr(), hungListener(t)))
	return srv, c
}

// hungListener returns the address of a socket that accepts connections
// and never answers, as a node stopped with SIGSTOP does.
func hungListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, conn)
		}
	}()
	return ln.Addr().String()
}

// TryLock on a held lock fails with a *fence.LockedError naming the holder.
func TestTryLockNamesTheHolder(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	a := mustSession(t, c, 10*time.Second)
	b := mustSession(t, c, 10*time.Second)
	g := mustLock(t, ctx, NewMutex(a, "l"))
	_, err := NewMutex(b, "l").TryLock(ctx)
	var locked *fence.LockedError
	if !errors.As(err, &locked) || !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("TryLock on a held lock: %v (%T), want a *fence.LockedError", err, err)
	}
	if locked.Lock != "l" || locked.HolderSession != a.ID() || locked.HolderToken != g.Token() || !strings.Contains(locked.Error(), "held by session") {
		t.Errorf("LockedError = %+v, want lock l held by session %d with token %d", locked, a.ID(), g.Token())
	}
}
