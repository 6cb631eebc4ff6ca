package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// One campaigner leads; the other waits and leads once the first resigns,
// with a higher token; a deposed leader cannot overwrite the record.
func TestElection(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	newSession := func() *Session {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(ctx) })
		return s
	}
	if _, _, ok, err := c.Leader(ctx, "scheduler"); ok || err != nil {
		t.Fatalf("leader before any campaign: ok %v, %v", ok, err)
	}
	a, b := NewElection(newSession(), "scheduler"), NewElection(newSession(), "scheduler")
	la, err := a.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if v, tok, ok, err := c.Leader(ctx, "scheduler"); !ok || err != nil || v != "node-a" || tok != la.Token() {
		t.Fatalf("Leader = %q %d %v %v, want node-a with token %d", v, tok, ok, err, la.Token())
	}
	won := make(chan *Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "node-b")
		if err != nil {
			t.Error(err)
		}
		won <- lb
	}()
	select {
	case <-won:
		t.Fatal("two leaders at once")
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.Proclaim(ctx, "node-a v2"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var lb *Leadership
	select {
	case lb = <-won:
	case <-time.After(10 * time.Second):
		t.Fatal("the second campaigner was not elected after the first resigned")
	}
	if lb == nil || lb.Token() <= la.Token() {
		t.Fatalf("second leadership %v, want a token above %d", lb, la.Token())
	}
	if v, _, ok, _ := c.Leader(ctx, "scheduler"); !ok || v != "node-b" {
		t.Fatalf("Leader = %q %v, want node-b", v, ok)
	}
	// The deposed leader's token no longer writes the record.
	if _, err := c.KV().Put(ctx, "election/scheduler", []byte("node-a again"), WithGrant(la.Grant), Strict()); !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("deposed leader's write: %v, want it refused", err)
	}
}
