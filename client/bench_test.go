package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence/server"
)

// BenchmarkLockUnlock measures one lock+unlock cycle through the client
// against a real single-node server: two raft commits and two round trips.
func BenchmarkLockUnlock(b *testing.B) {
	transports(b, benchmarkLockUnlock)
}

// transports runs a benchmark on the session stream and with unary calls.
func transports(b *testing.B, bench func(b *testing.B, opts ...Option)) {
	b.Run("stream", func(b *testing.B) { bench(b) })
	b.Run("unary", func(b *testing.B) { bench(b, WithoutStream()) })
}

// benchClient returns a client of srv with opts, closed when b ends.
func benchClient(b *testing.B, srv *server.Server, opts ...Option) *Client {
	c, err := New(append([]Option{WithEndpoints(srv.Addr())}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchmarkLockUnlock(b *testing.B, opts ...Option) {
	srv := startServer(b, nil)
	c := benchClient(b, srv, opts...)
	ctx := context.Background()
	s := mustSession(b, c, 10*time.Second)
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
// own lock, so that raft can commit them in groups: on one stream, or on
// a connection each.
func BenchmarkLockUnlockParallel(b *testing.B) {
	transports(b, benchmarkLockUnlockParallel)
}

func benchmarkLockUnlockParallel(b *testing.B, opts ...Option) {
	srv := startServer(b, nil)
	c := benchClient(b, srv, opts...)
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
