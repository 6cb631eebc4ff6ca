package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/server"
)

// startServer runs a real single-node server on a temp dir and loopback
// ports, and returns it once it is the leader.
func startServer(tb testing.TB, edit func(*server.Config)) *server.Server {
	tb.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	return mustStartConfig(tb, cfg)
}

// mustStartConfig runs a real server of cfg, and returns it once it is the
// leader.
func mustStartConfig(tb testing.TB, cfg server.Config) *server.Server {
	tb.Helper()
	s, err := server.Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		tb.Fatal(err)
	}
	return s
}

// clientOfNewServer starts a single-node server (see startServer) and
// returns a client of it, for tests that need nothing else of the server.
func clientOfNewServer(tb testing.TB) *Client {
	tb.Helper()
	return mustClient(tb, startServer(tb, nil), nil)
}

// mustClient returns a client of s; a nil clk means the real clock.
func mustClient(tb testing.TB, s *server.Server, clk clock.Clock) *Client {
	tb.Helper()
	opts := []Option{WithEndpoints(s.Addr())}
	if clk != nil {
		opts = append(opts, withClock(clk))
	}
	return mustNew(tb, opts...)
}

// mustNew returns a client made with opts, closed at the test's end.
func mustNew(tb testing.TB, opts ...Option) *Client {
	tb.Helper()
	c, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// fakeClockSession starts a node and returns it, a fake clock, and a
// session with ttl of a client of the node that keeps time by that clock.
func fakeClockSession(tb testing.TB, ttl time.Duration) (*server.Server, *clock.Fake, *Session) {
	tb.Helper()
	srv := startServer(tb, nil)
	clk := clock.NewFake()
	return srv, clk, mustSession(tb, mustClient(tb, srv, clk), ttl)
}

// mustSession returns a session of c with ttl, closed at the test's end.
func mustSession(tb testing.TB, c *Client, ttl time.Duration) *Session {
	tb.Helper()
	s, err := c.NewSession(context.Background(), WithTTL(ttl))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// mustEndWith waits up to 10 s for done (a session's or a grant's) to
// close, and fails unless err then reports want.
func mustEndWith(tb testing.TB, what string, done <-chan struct{}, err func() error, want error) {
	tb.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s lives on", what)
	}
	if !errors.Is(err(), want) {
		tb.Fatalf("%s ended with %v, want %v", what, err(), want)
	}
}

// mustLock locks m with ctx and returns the grant, failing the test if
// Lock fails.
func mustLock(tb testing.TB, ctx context.Context, m *Mutex) *Grant {
	tb.Helper()
	g, err := m.Lock(ctx)
	if err != nil {
		tb.Fatalf("locking %s: %v", m.name, err)
	}
	return g
}

// mustUnlock unlocks m with ctx, failing the test if Unlock fails.
func mustUnlock(tb testing.TB, ctx context.Context, m *Mutex) {
	tb.Helper()
	if err := m.Unlock(ctx); err != nil {
		tb.Fatalf("unlocking %s: %v", m.name, err)
	}
}

// mustPut puts value at key through kv with ctx and opts, failing the test
// if the put fails, and returns the revision it made.
func mustPut(tb testing.TB, ctx context.Context, kv *KV, key string, value []byte, opts ...WriteOption) uint64 {
	tb.Helper()
	rev, err := kv.Put(ctx, key, value, opts...)
	if err != nil {
		tb.Fatalf("putting %s: %v", key, err)
	}
	return rev
}

// mustWatch opens a watch of prefix through kv with ctx and opts, failing
// the test if it cannot, and closes it at the test's end.
func mustWatch(tb testing.TB, ctx context.Context, kv *KV, prefix string, opts ...WatchOption) *Watch {
	tb.Helper()
	w, err := kv.Watch(ctx, prefix, opts...)
	if err != nil {
		tb.Fatalf("watching %q: %v", prefix, err)
	}
	tb.Cleanup(func() { w.Close() })
	return w
}

// inBackground calls f in a goroutine and returns a channel that delivers
// what f returns; an error f returns is reported with tb.Error, and the
// value f returned with it (nil, as a rule) is delivered all the same.
func inBackground[T any](tb testing.TB, f func() (T, error)) <-chan T {
	done := make(chan T, 1)
	go func() {
		v, err := f()
		if err != nil {
			tb.Error(err)
		}
		done <- v
	}()
	return done
}
