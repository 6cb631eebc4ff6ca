package client

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/server"
)

// The article's timeline against the fenced KV: A writes with its token,
// loses the lock, B takes it and writes, A's late write is refused and B's
// value survives.
func TestKVRejectsStaleWriter(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	kv := c.KV()

	a, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ma := NewMutex(a, "orders")
	ga := mustLock(t, ctx, ma)
	mustPut(t, ctx, kv, "orders/17", []byte("a1"), WithGrant(ga))
	if err := a.Close(ctx); err != nil { // A's lease ends (as if it expired)
		t.Fatal(err)
	}
	b := mustSession(t, c, 10*time.Second)
	gb := mustLock(t, ctx, NewMutex(b, "orders"))
	mustPut(t, ctx, kv, "orders/17", []byte("b"), WithGrant(gb))

	_, err = kv.Put(ctx, "orders/17", []byte("a2"), FencedBy("orders", ga.Token()))
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) || stale.Token != ga.Token() || stale.Highest != gb.Token() || stale.Key != "orders/17" {
		t.Fatalf("late write of A: %v, want a StaleTokenError %d < %d", err, ga.Token(), gb.Token())
	}
	if _, err := kv.Delete(ctx, "orders/17", FencedBy("orders", ga.Token())); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("late delete of A: %v, want ErrStaleToken", err)
	}
	got, err := kv.Get(ctx, "orders/17")
	if err != nil || got == nil || string(got.GetValue()) != "b" || got.GetToken() != gb.Token() {
		t.Fatalf("Get = %v, %v; want B's value with token %d", got, err, gb.Token())
	}
}

// Strict mode needs the lock's current grant; CAS needs the revision.
func TestKVStrictAndCompareAndSwap(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	kv := c.KV()
	s := mustSession(t, c, 10*time.Second)
	m := NewMutex(s, "l")
	g := mustLock(t, ctx, m)
	if _, err := kv.Put(ctx, "k", []byte("1"), WithGrant(g), Strict()); err != nil {
		t.Fatalf("strict write by the holder: %v", err)
	}
	mustUnlock(t, ctx, m)
	if _, err := kv.Put(ctx, "k", []byte("2"), WithGrant(g), Strict()); !errors.Is(err, fence.ErrNotHolder) {
		t.Fatalf("strict write after release: %v, want ErrNotHolder", err)
	}
	rev, err := kv.Put(ctx, "cas", []byte("v1"), IfRevision(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "cas", []byte("v2"), IfRevision(0)); !errors.Is(err, fence.ErrRevisionMismatch) {
		t.Fatalf("create of an existing key: %v, want ErrRevisionMismatch", err)
	}
	if _, err := kv.Put(ctx, "cas", []byte("v2"), IfRevision(rev)); err != nil {
		t.Fatalf("CAS at the right revision: %v", err)
	}
	l, err := kv.List(ctx, "")
	if err != nil || l.More || len(l.KVs) != 2 || l.KVs[0].GetKey() != "cas" || string(l.KVs[0].GetValue()) != "v2" || l.Revision != rev+1 {
		t.Fatalf("List = %+v, %v; want 2 keys at revision %d", l, err, rev+1)
	}
}

// A watch delivers every committed change under its prefix, in order.
func TestKVWatch(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	kv := c.KV()
	w := mustWatch(t, ctx, kv, "jobs/")
	for _, key := range []string{"jobs/1", "other", "jobs/2"} {
		mustPut(t, ctx, kv, key, []byte(key))
	}
	if _, err := kv.Delete(ctx, "jobs/1"); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		typ fencev1.EventType
		key string
	}{
		{fencev1.EventType_EVENT_TYPE_PUT, "jobs/1"},
		{fencev1.EventType_EVENT_TYPE_PUT, "jobs/2"},
		{fencev1.EventType_EVENT_TYPE_DELETE, "jobs/1"},
	}
	var lastRev uint64
	for _, wt := range want {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended: %v", w.Err())
			}
			if ev.GetType() != wt.typ || ev.GetKv().GetKey() != wt.key || ev.GetKv().GetModRevision() <= lastRev {
				t.Fatalf("event %v, want %v %s after revision %d", ev, wt.typ, wt.key, lastRev)
			}
			lastRev = ev.GetKv().GetModRevision()
		case <-time.After(10 * time.Second):
			t.Fatalf("no event for %s", wt.key)
		}
	}
	w.Close()
	if _, ok := <-w.Events(); ok {
		t.Fatal("events after Close")
	}
}

// Oversized keys and values, and keys with control characters, are refused
// with ErrInvalidArgument and nothing is written.
func TestKVRejectsBadInput(t *testing.T) {
	srv := startServer(t, func(c *server.Config) { c.MaxKeyBytes = 16; c.MaxValueBytes = 32 })
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	kv := c.KV()
	for _, tc := range []struct {
		key, value, want string
	}{
		{"", "v", "key is empty"},
		{"k-is-far-too-long-for-the-limit", "v", "over the limit of 16"},
		{"bad\x01key", "v", "control character"},
		{"k", string(make([]byte, 33)), "value is 33 bytes, over the limit of 32"},
	} {
		if _, err := kv.Put(ctx, tc.key, []byte(tc.value)); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Put(%q, %d bytes) = %v, want ErrInvalidArgument saying %q", tc.key, len(tc.value), err, tc.want)
		}
	}
	if _, err := kv.Put(ctx, "k", []byte("v"), FencedBy("l", 1)); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), "never issued") {
		t.Errorf("Put with a token never issued: %v", err)
	}
	l, err := kv.List(ctx, "")
	if err != nil || len(l.KVs) != 0 {
		t.Fatalf("bad writes left %+v, %v", l, err)
	}
}

// A key bound to a session is deleted when the session ends, and watchers
// see the delete; a put without BoundTo unbinds it.
func TestKVBoundToSession(t *testing.T) {
	c := clientOfNewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := c.KV()
	s1, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s2 := mustSession(t, c, 10*time.Second)
	mustPut(t, ctx, kv, "svc/a", []byte("10.0.0.1"), BoundTo(s1))
	mustPut(t, ctx, kv, "svc/b", []byte("10.0.0.2"), BoundTo(s1))
	mustPut(t, ctx, kv, "svc/b", []byte("10.0.0.2")) // unbound again
	mustPut(t, ctx, kv, "svc/c", []byte("10.0.0.3"), BoundTo(s2))
	got, err := kv.Get(ctx, "svc/a")
	if err != nil || got.GetSessionId() != s1.ID() {
		t.Fatalf("Get svc/a: %v, %v; want it bound to session %d", got, err, s1.ID())
	}
	w := mustWatch(t, ctx, kv, "svc/")
	if err := s1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.Events():
		if ev.GetType() != fencev1.EventType_EVENT_TYPE_DELETE || ev.GetKv().GetKey() != "svc/a" {
			t.Fatalf("event %v, want the delete of svc/a", ev)
		}
	case <-ctx.Done():
		t.Fatal("no delete event after the session closed")
	}
	l, err := kv.List(ctx, "svc/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range l.KVs {
		keys = append(keys, kv.GetKey())
	}
	if strings.Join(keys, ",") != "svc/b,svc/c" {
		t.Fatalf("keys after session 1 ended: %v, want svc/b,svc/c", keys)
	}
}

// List, then Watch from the list's revision + 1: the changes made between
// the two are delivered first, none twice; a revision older than the
// server's history fails with ErrCompacted.
func TestKVWatchFromRevision(t *testing.T) {
	srv := startServer(t, func(c *server.Config) { c.WatchHistory = 3 })
	c := mustClient(t, srv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := c.KV()
	put := func(key, value string) uint64 {
		t.Helper()
		return mustPut(t, ctx, kv, key, []byte(value))
	}
	put("a", "1")
	put("b", "1")
	put("a", "2")
	l, err := kv.List(ctx, "")
	if err != nil || l.Revision != 3 {
		t.Fatalf("List: %+v, %v; want revision 3", l, err)
	}
	put("c", "1") // after the list, before the watch
	expect := func(w *Watch, want ...string) {
		t.Helper()
		for _, key := range want {
			select {
			case ev := <-w.Events():
				if got := ev.GetKv().GetKey() + "@" + strconv.FormatUint(ev.GetKv().GetModRevision(), 10); got != key {
					t.Fatalf("event %s, want %s", got, key)
				}
			case <-ctx.Done():
				t.Fatalf("no event; want %s (%v)", key, w.Err())
			}
		}
	}
	w := mustWatch(t, ctx, kv, "", FromRevision(l.Revision+1))
	put("d", "1")
	expect(w, "c@4", "d@5")

	// The history keeps revisions 3 to 5.
	if _, err := kv.Watch(ctx, "", FromRevision(2)); !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("watch from a revision no longer kept: %v, want ErrCompacted", err)
	}
	old := mustWatch(t, ctx, kv, "", FromRevision(3))
	expect(old, "a@3", "c@4", "d@5")
	future := mustWatch(t, ctx, kv, "", FromRevision(7)) // nothing before revision 7
	next := mustWatch(t, ctx, kv, "b", FromRevision(6))
	put("a", "3")
	put("b", "2")
	expect(next, "b@7")
	expect(old, "a@6", "b@7")
	expect(future, "b@7")
}
