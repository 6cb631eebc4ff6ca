package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkLockUnlock measures one lock+unlock cycle through the client
// against a real single-node server: two raft commits and two round trips.
func BenchmarkLockUnlock(b *testing.B) {
	srv := startServer(b, nil)
	c := mustClient(b, srv, nil)
	ctx := context.Background()
	s, err := c.NewSession(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(ctx)
	m := NewMutex(s, "bench")
	for b.Loop() {
		if _, err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockUnlockParallel runs cycles from many sessions, each on its
// own lock, so that raft can commit them in groups.
func BenchmarkLockUnlockParallel(b *testing.B) {
	srv := startServer(b, nil)
	c := mustClient(b, srv, nil)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		s, err := c.NewSession(ctx)
		if err != nil {
			b.Error(err)
			return
		}
		defer s.Close(ctx)
		m := NewMutex(s, fmt.Sprintf("bench-%d", n.Add(1)))
		for pb.Next() {
			if _, err := m.Lock(ctx); err != nil {
				b.Error(err)
				return
			}
			if err := m.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkStatus measures a round trip that touches no disk.
func BenchmarkStatus(b *testing.B) {
	srv := startServer(b, nil)
	c := mustClient(b, srv, nil)
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Status(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
