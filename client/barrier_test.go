package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
)

// Waiters block while the barrier is held and all pass when it is
// released; a barrier not held does not block.
func TestBarrierHoldReleaseWait(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	b := NewBarrier(c, "deploy")
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("Wait on a barrier not held: %v", err)
	}
	if err := b.Hold(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Hold(ctx); err != nil {
		t.Fatalf("second Hold: %v", err)
	}
	passed := make(chan error, 3)
	for range 3 {
		go func() { passed <- NewBarrier(mustClient(t, srv, nil), "deploy").Wait(ctx) }()
	}
	select {
	case err := <-passed:
		t.Fatalf("a waiter passed a held barrier: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if held, err := b.Held(ctx); err != nil || !held {
		t.Fatalf("Held = %v, %v; want true", held, err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-passed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter did not pass the released barrier")
		}
	}
	// Another barrier whose name starts with this one's does not matter.
	if err := NewBarrier(c, "deploy-2").Hold(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Wait gives up when its context ends.
func TestBarrierWaitCancelled(t *testing.T) {
	c := clientOfNewServer(t)
	b := NewBarrier(c, "gate")
	if err := b.Hold(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want DeadlineExceeded", err)
	}
}

// Nobody enters before count parties have arrived, then all enter; nobody
// leaves before all have left.
func TestDoubleBarrierEnterLeave(t *testing.T) {
	srv := startServer(t, nil)
	ctx := context.Background()
	const n = 3
	var (
		mu     sync.Mutex
		events []string
	)
	note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	for round := range 2 { // the barrier is reusable
		events = nil
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := mustSession(t, mustClient(t, srv, nil), 5*time.Second)
				b := NewDoubleBarrier(s, "batch", n)
				time.Sleep(time.Duration(i) * 100 * time.Millisecond) // arrive one by one
				note("arrive")
				if err := b.Enter(ctx); err != nil {
					errs <- err
					return
				}
				note("enter")
				time.Sleep(time.Duration(n-i) * 100 * time.Millisecond) // leave one by one
				note("leave")
				if err := b.Leave(ctx); err != nil {
					errs <- err
					return
				}
				note("left")
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		// Every arrival before any entry, every leave before anyone has left.
		want := []string{"arrive", "arrive", "arrive", "enter", "enter", "enter", "leave", "leave", "leave", "left", "left", "left"}
		if fmt.Sprint(events) != fmt.Sprint(want) {
			t.Fatalf("round %d: %v, want %v", round, events, want)
		}
	}
}

// A party whose session ends no longer counts: one that died after
// entering does not hold the others' Leave back for ever, and one that died
// before count arrived is not counted towards count.
func TestDoubleBarrierPartyDies(t *testing.T) {
	srv := startServer(t, nil)
	ctx := context.Background()
	// The dying party's client never renews (its clock does not move), so
	// the server expires its 1s session as it would a crashed process's.
	dead := mustSession(t, mustClient(t, srv, clock.NewFake()), time.Second)
	a := mustSession(t, mustClient(t, srv, nil), 5*time.Second)
	b := mustSession(t, mustClient(t, srv, nil), 5*time.Second)

	// dead arrives, then expires before the others arrive: a and b alone
	// must not enter a barrier for three.
	go NewDoubleBarrier(dead, "three", 3).Enter(ctx)
	waitGone(t, dead)
	entered := make(chan error, 2)
	for _, s := range []*Session{a, b} {
		go func() { entered <- NewDoubleBarrier(s, "three", 3).Enter(ctx) }()
	}
	select {
	case err := <-entered:
		t.Fatalf("two parties entered a barrier for three, counting a dead one: %v", err)
	case <-time.After(500 * time.Millisecond):
	}

	// Two parties and one that dies inside: Leave waits for it only until
	// its session ends.
	dying := mustSession(t, mustClient(t, srv, clock.NewFake()), time.Second)
	pa, pb, pd := NewDoubleBarrier(a, "two", 3), NewDoubleBarrier(b, "two", 3), NewDoubleBarrier(dying, "two", 3)
	var wg sync.WaitGroup
	for _, p := range []*DoubleBarrier{pa, pb, pd} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Enter(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	left := make(chan error, 2)
	for _, p := range []*DoubleBarrier{pa, pb} {
		go func() { left <- p.Leave(ctx) }()
	}
	for range 2 {
		select {
		case err := <-left:
			if err != nil {
				t.Fatal(err)
			}
			// Not before the dying party was counted out.
			if kv, err := a.client.KV().Get(ctx, pd.memberKey()); err != nil || kv != nil {
				t.Fatalf("Leave returned while the dying party was still inside (%v, %v)", kv, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Leave still waits for a party whose session ended")
		}
	}
}

// waitGone waits until the server has expired s.
func waitGone(t *testing.T, s *Session) {
	t.Helper()
	probe := NewMutex(s, "probe")
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := probe.TryLock(context.Background())
		if errors.Is(err, fence.ErrSessionNotFound) {
			return
		}
		if err == nil {
			probe.Unlock(context.Background())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not expire session %d: %v", s.ID(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
