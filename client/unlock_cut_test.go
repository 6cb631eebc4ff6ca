package client

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/netproxy"
)

// An Unlock whose caller cannot wait for it (the node unreachable until
// its context ended) still releases the lock once the node can be reached
// again: the client keeps sending the release within the session's TTL,
// and would give the session up if it could not, rather than leave the
// lock held for as long as the session lives. Locking the mutex again
// meanwhile waits for that release, so that it is not handed the grant on
// its way out.
func TestAnUnlockThatTimedOutStillReleases(t *testing.T) {
	srv := startServer(t, nil)
	link, err := netproxy.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	c, err := New(WithEndpoints(link.Addr()), WithAttemptTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m := NewMutex(s, "l")
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	link.SetCut(true)
	unlockCtx, unlockCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = m.Unlock(unlockCtx)
	unlockCancel()
	if err == nil {
		t.Fatal("Unlock through a cut link succeeded")
	}
	if g.Err() == nil {
		t.Error("the grant's context lives on after Unlock")
	}
	time.Sleep(300 * time.Millisecond)
	link.SetCut(false)

	direct, err := New(WithEndpoints(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	s2, err := direct.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(context.Background())
	// Well within the first session's TTL, which its keepalives renew.
	lockCtx, lockCancel := context.WithTimeout(ctx, 5*time.Second)
	defer lockCancel()
	g2, err := NewMutex(s2, "l").Lock(lockCtx)
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
