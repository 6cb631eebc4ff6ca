package client

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Locks pages through the service's answers: every lock once, in order.
func TestLocksPages(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	s := mustSession(t, c, time.Minute)
	const n = 25
	for i := range n {
		mustLock(t, ctx, NewMutex(s, fmt.Sprintf("p/%02d", i)))
	}
	var names []string
	token := ""
	for pages := 0; ; pages++ {
		page, next, err := c.LocksPage(ctx, "p/", token, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 10 {
			t.Fatalf("a page of 10 held %d locks", len(page))
		}
		for _, l := range page {
			names = append(names, l.GetName())
		}
		if next == "" {
			if pages != 2 {
				t.Errorf("%d locks came in %d pages of 10, want 3", n, pages+1)
			}
			break
		}
		token = next
	}
	all, err := c.Locks(ctx, "p/")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != n || len(all) != n {
		t.Fatalf("pages listed %d locks and Locks %d, want %d", len(names), len(all), n)
	}
	for i := range n {
		if want := fmt.Sprintf("p/%02d", i); names[i] != want || all[i].GetName() != want {
			t.Fatalf("lock %d is %q (pages) and %q (Locks), want %q", i, names[i], all[i].GetName(), want)
		}
	}
	if _, _, err := c.LocksPage(ctx, "p/", "not base64!", 10); err == nil {
		t.Error("a page token the service never gave was accepted")
	}
}

// Unlock ends the grant's context first, so that work under it stops: a
// context that ends only for that (the grant's own, or one made from it)
// is not the caller giving up, and the release is waited for.
func TestUnlockWithTheGrantsOwnContext(t *testing.T) {
	c := clientOfNewServer(t)
	s := mustSession(t, c, time.Minute)
	m := NewMutex(s, "own-context")
	for _, derive := range []func(context.Context) (context.Context, context.CancelFunc){
		func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} },
		func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Minute)
		},
	} {
		g, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := derive(g.Context())
		err = m.Unlock(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Unlock with a context that follows the grant's: %v", err)
		}
		if held, err := c.Locks(context.Background(), "own-context"); err != nil || len(held) != 0 {
			t.Fatalf("after Unlock the service lists %v (%v), want the lock free", held, err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
}
