package nolock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence/nolock"
)

// Calls for one key run one at a time, in the order they were made; calls
// for other keys run meanwhile.
func TestSerializerOneWriterPerKey(t *testing.T) {
	var s nolock.Serializer
	ctx := context.Background()
	var (
		mu      sync.Mutex
		order   []int
		running = map[string]int{}
	)
	enter := func(key string) {
		mu.Lock()
		defer mu.Unlock()
		running[key]++
		if running[key] > 1 {
			t.Errorf("two writers of %s at once", key)
		}
	}
	leave := func(key string) {
		mu.Lock()
		defer mu.Unlock()
		running[key]--
	}
	// Hold account/1 while the calls queue, so their order is known.
	gate := make(chan struct{})
	first := make(chan struct{})
	go s.Do(ctx, "account/1", func(context.Context) error {
		close(first)
		<-gate
		return nil
	})
	<-first
	var wg sync.WaitGroup
	for i := range 20 {
		queued := make(chan struct{})
		wg.Go(func() {
			go func() { time.Sleep(time.Millisecond); close(queued) }()
			s.Do(ctx, "account/1", func(context.Context) error {
				enter("account/1")
				defer leave("account/1")
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				return nil
			})
		})
		<-queued // the next call is made after this one queued
	}
	// Another key is not held up by account/1.
	done := make(chan error, 1)
	go func() { done <- s.Do(ctx, "account/2", func(context.Context) error { return nil }) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("account/2 waited for account/1")
	}
	close(gate)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("calls ran in order %v, want the order they were made", order)
		}
	}
	if len(order) != 20 {
		t.Fatalf("%d calls ran, want 20", len(order))
	}
}

// A call whose context ends while it waits returns without running, and
// the calls behind it still wait for the one ahead of it.
func TestSerializerCancelledWaiterKeepsOrder(t *testing.T) {
	var s nolock.Serializer
	release := make(chan struct{})
	started := make(chan struct{})
	var mu sync.Mutex
	var events []string
	note := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	go s.Do(context.Background(), "k", func(context.Context) error {
		close(started)
		<-release
		note("first done")
		return nil
	})
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		cancelled <- s.Do(ctx, "k", func(context.Context) error { note("cancelled one ran"); return nil })
	}()
	time.Sleep(10 * time.Millisecond) // let it queue
	third := make(chan error, 1)
	go func() {
		third <- s.Do(context.Background(), "k", func(context.Context) error { note("third"); return nil })
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-cancelled; err != context.Canceled {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	select {
	case <-third:
		t.Fatal("the call behind a cancelled one ran before the first finished")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(events) != "[first done third]" {
		t.Fatalf("events %v, want [first done third]", events)
	}
}

// Partition is stable and spreads keys over all partitions.
func TestPartition(t *testing.T) {
	seen := map[int]int{}
	for i := range 1000 {
		key := fmt.Sprintf("account/%d", i)
		p := nolock.Partition(key, 8)
		if p < 0 || p >= 8 || p != nolock.Partition(key, 8) {
			t.Fatalf("Partition(%q, 8) = %d, not stable or out of range", key, p)
		}
		seen[p]++
	}
	for p := range 8 {
		if seen[p] < 60 {
			t.Errorf("partition %d got %d of 1000 keys: %v", p, seen[p], seen)
		}
	}
	if nolock.Partition("x", 1) != 0 || nolock.Partition("x", 0) != 0 {
		t.Error("one partition (or none) is partition 0")
	}
}
