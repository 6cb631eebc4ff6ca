package client

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/netproxy"
	"github.com/fencelock/fence/server"
)

// An Unlock whose caller cannot wait for it (the node unreachable until
// its context ended) still releases the lock once the node can be reached
// again: the client keeps sending the release within the session's TTL,
// and would give the session up if it could not, rather than leave the
// lock held for as long as the session lives. Locking the mutex again
// meanwhile waits for that release, so that it is not handed the grant on
// its way out.
func TestAnUnlockThatTimedOutStillReleases(t *testing.T) {
	srv, link, s := sessionThroughALink(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := NewMutex(s, "l")
	g := mustLock(t, ctx, m)

	unlockThroughACutLink(t, ctx, link, m.Unlock)
	if g.Err() == nil {
		t.Error("the grant's context lives on after Unlock")
	}

	// Well within the first session's TTL, which its keepalives renew.
	g2, err := lockFromAnotherSession(t, ctx, srv, "l")
	if err != nil {
		t.Fatalf("another session locking after the failed Unlock: %v (the lock stayed held by the first session)", err)
	}
	if g2.Token() <= g.Token() {
		t.Errorf("token %d after %d", g2.Token(), g.Token())
	}
	if err := s.Err(); err != nil {
		t.Errorf("the first session ended (%v), though its release could be sent again", err)
	}
}

// The service's grant is the session's, per lock name, whichever Mutex
// took it: a fresh Mutex of the same session and name (one per critical
// section, a Queue's take, a new Election) must not be handed the grant
// of a release still on its way, to see it released under it while
// another session takes the lock. (Found in review.)
func TestAFreshMutexWaitsForAReleaseOnItsWay(t *testing.T) {
	srv, link, s := sessionThroughALink(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s2 := mustSession(t, mustClient(t, srv, nil), 10*time.Second)

	for round := range 3 {
		name := fmt.Sprintf("l%d", round)
		g1 := mustLock(t, ctx, NewMutex(s, name))
		m1 := NewMutex(s, name)
		if _, err := m1.Lock(ctx); err != nil { // the same grant
			t.Fatal(err)
		}
		unlockThroughACutLink(t, ctx, link, m1.Unlock)

		lockCtx, lockCancel := context.WithTimeout(ctx, 5*time.Second)
		g2, err := NewMutex(s, name).Lock(lockCtx)
		lockCancel()
		if err != nil {
			t.Fatalf("round %d: Lock: %v", round, err)
		}
		if g2.Token() == g1.Token() {
			t.Fatalf("round %d: a fresh Mutex was handed the grant being released (token %d)", round, g2.Token())
		}
		tryCtx, tryCancel := context.WithTimeout(ctx, time.Second)
		if g3, err := NewMutex(s2, name).TryLock(tryCtx); err == nil {
			t.Fatalf("round %d: another session took the lock (token %d) from the fresh Mutex's grant (token %d, err %v)", round, g3.Token(), g2.Token(), g2.Err())
		}
		tryCancel()
	}
}

// An RWMutex's halves wait for each other's release on its way: after an
// RUnlock that could not reach the service, Lock waits for the release
// instead of failing as though the session still held the lock shared.
// (Found in review.)
func TestAnRWMutexLocksAfterAnRUnlockOnItsWay(t *testing.T) {
	_, link, s := sessionThroughALink(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rw := NewRWMutex(s, "rw")
	if _, err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	unlockThroughACutLink(t, ctx, link, rw.RUnlock)
	lockCtx, lockCancel := context.WithTimeout(ctx, 5*time.Second)
	defer lockCancel()
	if _, err := rw.Lock(lockCtx); err != nil {
		t.Fatalf("Lock after an RUnlock whose release went on in the background: %v", err)
	}
}

// sessionThroughALink starts a node and returns it, a link to it that a
// test can cut, and a session (TTL 10 s) of a client that reaches the node
// only through the link.
func sessionThroughALink(t *testing.T) (*server.Server, *netproxy.Link, *Session) {
	t.Helper()
	srv := startServer(t, nil)
	link, err := netproxy.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	c := mustNew(t, WithEndpoints(link.Addr()), WithAttemptTimeout(200*time.Millisecond))
	return srv, link, mustSession(t, c, 10*time.Second)
}

// lockFromAnotherSession locks name through a new session of a client that
// reaches srv directly, waiting at most 5 s, and returns what Lock returns.
func lockFromAnotherSession(t *testing.T, ctx context.Context, srv *server.Server, name string) (*Grant, error) {
	t.Helper()
	s := mustSession(t, mustClient(t, srv, nil), 10*time.Second)
	lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return NewMutex(s, name).Lock(lockCtx)
}

// unlockThroughACutLink calls unlock with the link cut, which must fail, and
// heals the link once the release has backed off.
func unlockThroughACutLink(t *testing.T, ctx context.Context, link *netproxy.Link, unlock func(context.Context) error) {
	t.Helper()
	link.SetCut(true)
	unlockCtx, unlockCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := unlock(unlockCtx)
	unlockCancel()
	if err == nil {
		t.Fatal("an unlock through a cut link succeeded")
	}
	time.Sleep(700 * time.Millisecond) // the background release backs off
	link.SetCut(false)
}

// A context made from the grant's with a deadline of its own keeps that
// deadline through Unlock: the grant's end, which Unlock causes, does not
// cut the release short, and the deadline still does, as it would for any
// other context. The release then goes on in the background.
func TestUnlockKeepsTheDeadlineOfAContextMadeFromTheGrants(t *testing.T) {
	srv, link, s := sessionThroughALink(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := NewMutex(s, "l")
	g := mustLock(t, ctx, m)

	unlockThroughACutLink(t, ctx, link, func(context.Context) error {
		unlockCtx, unlockCancel := context.WithTimeout(g.Context(), 300*time.Millisecond)
		defer unlockCancel()
		returned := make(chan error, 1)
		go func() { returned <- m.Unlock(unlockCtx) }()
		select {
		case err := <-returned:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Unlock through a cut link was still waiting 10 s after its context's 300 ms deadline")
			return nil
		}
	})

	if _, err := lockFromAnotherSession(t, ctx, srv, "l"); err != nil {
		t.Fatalf("another session locking after the Unlock: %v (the release was not sent on)", err)
	}
}
