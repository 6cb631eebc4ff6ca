package client

import (
	"context"
	"testing"
	"time"
)

// Every call passes a node that accepts connections and never answers:
// each attempt on a node is bounded, then the next node is tried.
func TestCallsPassAHungNode(t *testing.T) {
	srv := startServer(t, nil)
	hung := hungListener(t)
	c := mustNew(t, WithEndpoints(hung, srv.Addr()), WithAttemptTimeout(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	onHung := func() { c.setCurrent(c.endpointAt(0)) }

	onHung()
	s, err := c.NewSession(ctx, WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("NewSession behind a hung node: %v", err)
	}
	defer s.Close(context.Background())
	onHung()
	if _, err := c.KV().Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put behind a hung node: %v", err)
	}
	onHung()
	if _, err := NewMutex(s, "free").Lock(ctx); err != nil {
		t.Fatalf("Lock behind a hung node: %v", err)
	}

	// A Lock that must wait, first sent to the hung node, is granted when
	// the holder lets go.
	other, err := c.NewSession(ctx, WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	held := NewMutex(other, "busy")
	mustLock(t, ctx, held)
	got := make(chan error, 1)
	onHung()
	go func() {
		_, err := NewMutex(s, "busy").Lock(ctx)
		got <- err
	}()
	time.Sleep(time.Second) // past the hung node, queued, polling
	mustUnlock(t, ctx, held)
	if err := <-got; err != nil {
		t.Fatalf("a waiting Lock behind a hung node: %v", err)
	}
}
