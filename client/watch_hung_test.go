package client

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/netproxy"
)

// A watch whose node stops answering mid-stream (its sockets open, no byte
// coming: a SIGSTOPped node) moves to another node and misses nothing.
func TestWatchPassesAHungNode(t *testing.T) {
	srv := startServer(t, nil)
	link, err := netproxy.Listen(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	t.Cleanup(func() { link.SetFrozen(false) })
	c := mustNew(t, WithEndpoints(link.Addr(), srv.Addr()), WithAttemptTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := mustWatch(t, ctx, c.KV(), "w/")
	mustPut(t, ctx, c.KV(), "w/1", []byte("a"))
	if ev := <-w.Events(); ev.GetKv().GetKey() != "w/1" {
		t.Fatalf("first event %v", ev)
	}

	link.SetFrozen(true)
	direct := mustNew(t, WithEndpoints(srv.Addr()))
	mustPut(t, ctx, direct.KV(), "w/2", []byte("b"))
	select {
	case ev, ok := <-w.Events():
		if !ok || ev.GetKv().GetKey() != "w/2" {
			t.Fatalf("after the node froze the watch delivered %v (open %v, err %v), want w/2", ev, ok, w.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not move past the frozen node within 5s")
	}
}
