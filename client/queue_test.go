package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/server"
)

// Items come out in the order they went in, and a Dequeue on an empty
// queue waits for the next Enqueue.
func TestQueueFIFO(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	s := mustSession(t, c, 5*time.Second)
	q := NewQueue(c, "jobs")
	for i := range 3 {
		if _, err := q.Enqueue(ctx, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		d, err := q.Dequeue(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Value) != strconv.Itoa(i) {
			t.Fatalf("dequeued %q, want %d", d.Value, i)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := inBackground(t, func() (*Delivery, error) { return q.Dequeue(ctx, s) })
	time.Sleep(100 * time.Millisecond)
	if _, err := q.Enqueue(ctx, []byte("late")); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d == nil || string(d.Value) != "late" {
			t.Fatalf("waiting Dequeue got %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Dequeue did not get the item enqueued after it")
	}
}

// Concurrent consumers: every item is handed out once and acknowledged
// once; none is lost.
func TestQueueConcurrentConsumers(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	q := NewQueue(c, "work")
	const items, consumers = 40, 4
	for i := range items {
		if _, err := q.Enqueue(ctx, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := mustSession(t, mustClient(t, srv, nil), 5*time.Second)
			for {
				d, err := q.Dequeue(dctx, s)
				if err != nil {
					return
				}
				mu.Lock()
				seen[string(d.Value)]++
				n := len(seen)
				mu.Unlock()
				if err := d.Ack(ctx); err != nil {
					t.Error(err)
				}
				if n == items {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	for i := range items {
		if n := seen[strconv.Itoa(i)]; n != 1 {
			t.Errorf("item %d handed out %d times", i, n)
		}
	}
}

// A consumer dies (stops renewing) while it holds an item: the item goes
// to the next consumer with a higher token, and the dead consumer's late
// Ack and its late fenced effect are both refused, so the effect is
// applied once.
func TestQueueConsumerDiesMidHandOut(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	q := NewQueue(c, "payments")
	if _, err := q.Enqueue(ctx, []byte("charge order 17")); err != nil {
		t.Fatal(err)
	}
	// The dying consumer's client never renews: the server expires its 1s
	// session as it would a crashed or paused process's.
	dying := mustSession(t, mustClient(t, srv, clock.NewFake()), time.Second)
	first, err := q.Dequeue(ctx, dying)
	if err != nil {
		t.Fatal(err)
	}

	other := mustSession(t, c, 5*time.Second)
	got := inBackground(t, func() (*Delivery, error) { return q.Dequeue(ctx, other) })
	var second *Delivery
	select {
	case second = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the item of a dead consumer was not handed to the next one")
	}
	if second == nil || second.Seq != first.Seq || second.Token() <= first.Token() {
		t.Fatalf("second hand-out %+v, want item %d with a token above %d", second, first.Seq, first.Token())
	}
	effect := func(d *Delivery) error {
		_, err := c.KV().Put(ctx, fmt.Sprintf("charges/%d", d.Seq), d.Value, WithGrant(d.Grant()), Strict())
		return err
	}
	if err := effect(second); err != nil {
		t.Fatal(err)
	}
	if err := second.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// The dead consumer wakes up and goes on where it stopped.
	if err := effect(first); !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("late effect of the dead consumer: %v, want it refused", err)
	}
	if err := first.Ack(ctx); !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("late Ack of the dead consumer: %v, want it refused", err)
	}
	kv, err := c.KV().Get(ctx, fmt.Sprintf("charges/%d", first.Seq))
	if err != nil || kv == nil || kv.GetToken() != second.Token() {
		t.Fatalf("charge = %v, %v; want the second consumer's, token %d", kv, err, second.Token())
	}
	l, err := c.KV().List(ctx, q.prefix+"items/")
	if err != nil || len(l.KVs) != 0 {
		t.Fatalf("queue still holds %v (%v)", l, err)
	}
}

// Return gives an item back for the next consumer.
func TestQueueReturn(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	q := NewQueue(c, "q")
	if _, err := q.Enqueue(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	a, b := mustSession(t, c, 5*time.Second), mustSession(t, c, 5*time.Second)
	d, err := q.Dequeue(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if d, err := q.Dequeue(tctx, b); err == nil {
		t.Fatalf("item %d handed out twice", d.Seq)
	}
	if err := d.Return(ctx); err != nil {
		t.Fatal(err)
	}
	d2, err := q.Dequeue(ctx, b)
	if err != nil || d2.Seq != d.Seq {
		t.Fatalf("after Return: %v, %v", d2, err)
	}
}

// A consumer whose watch cannot be opened (here the node is at its watch
// limit) still gets the next item: it lists again every Rescan, as
// Dequeue fails only when its context or its session ends.
func TestDequeueWithoutAWatch(t *testing.T) {
	srv := startServer(t, func(c *server.Config) { c.MaxWatchers = 1 })
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mustWatch(t, wctx, c.KV(), "elsewhere/") // the node's one watch
	q := NewQueue(c, "jobs")
	q.Rescan = 200 * time.Millisecond
	s := mustSession(t, c, 5*time.Second)
	got := make(chan error, 1)
	go func() {
		d, err := q.Dequeue(ctx, s)
		if err == nil && string(d.Value) != "job 1" {
			err = fmt.Errorf("dequeued %q, want job 1", d.Value)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // the consumer found the queue empty, and no watch
	if _, err := q.Enqueue(ctx, []byte("job 1")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("dequeue without a watch: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer without a watch never got the item")
	}
}
