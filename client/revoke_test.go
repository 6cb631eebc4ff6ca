package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// A grant released by someone else while its session lives on ends within
// one keepalive interval, with ErrLockRevoked; the session's other grants
// and the session itself go on.
func TestGrantReleasedBySomeoneElseEnds(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	const ttl = 3 * time.Second
	s := mustSession(t, c, ttl)
	taken := mustLock(t, ctx, NewMutex(s, "taken"))
	kept := mustLock(t, ctx, NewMutex(s, "kept"))

	// Another client that was given the session's secret.
	other := fencev1connect.NewLockServiceClient(http.DefaultClient, "http://"+srv.Addr())
	_, err := other.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{SessionId: s.ID(), SessionSecret: s.secret, Lock: "taken", Token: taken.Token()}))
	if err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case <-taken.Done():
	case <-time.After(ttl):
		t.Fatalf("the holder was not told within the TTL that its lock was released by someone else")
	}
	if d := time.Since(released); d > ttl/3+time.Second {
		t.Errorf("the holder learned %v after the release; a keepalive interval is %v", d, ttl/3)
	}
	if err := taken.Err(); !errors.Is(err, ErrLockRevoked) || !errors.Is(err, fence.ErrRevoked) {
		t.Errorf("the released grant ended with %v, want ErrLockRevoked", err)
	}
	// Two more keepalive rounds: the other grant and the session hold on.
	time.Sleep(2 * ttl / 3)
	if kept.Err() != nil || s.Err() != nil {
		t.Fatalf("the other grant (%v) or the session (%v) ended", kept.Err(), s.Err())
	}
}

// Grants taken and released by their own holder while keepalives run are
// never taken for revoked.
func TestOwnGrantsAreNotTakenForRevoked(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	m := NewMutex(mustSession(t, c, time.Second), "churn")
	deadline := time.Now().Add(2 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		g := mustLock(t, ctx, m)
		time.Sleep(time.Duration(n%5) * time.Millisecond)
		if g.Err() != nil {
			t.Fatalf("grant %d ended while held: %v", n, g.Err())
		}
		mustUnlock(t, ctx, m)
	}
}
