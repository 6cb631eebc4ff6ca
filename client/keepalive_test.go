package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// renewingSession starts the keepalive loop of a session of c that the
// test made up, with the renewal due at due and safe until safe, as
// NewSession would after creating it. Nothing answers for it: the test
// points c at nodes that do not.
func renewingSession(t *testing.T, c *Client, id uint64, ttl time.Duration, due, safe time.Time) *Session {
	t.Helper()
	s := &Session{client: c, id: id, secret: "secret", ttl: ttl, drift: 0.01, margin: 100 * time.Millisecond,
		stop: make(chan struct{}), kicked: make(chan struct{}, 1)}
	s.interval = ttl / 3
	s.due, s.safeUntil = due, safe
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	var renewCtx context.Context
	renewCtx, s.stopRenew = context.WithCancel(s.ctx)
	c.keepAlives.add(s)
	s.wg.Add(1)
	go s.keepAlive(renewCtx)
	t.Cleanup(func() {
		s.stopOnce.Do(func() {
			close(s.stop)
			s.stopRenew()
		})
		s.wg.Wait()
	})
	return s
}

// closedPort returns an address where nothing listens: connections to it
// are refused, as by a node that is down.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A session whose keepalive rides in the message of a session with a
// longer TTL (which retries up to its own, later, safe-until) still ends
// at its own safe-until, as lost: the service expires it then, and may
// grant its locks to others.
func TestKeepAliveMemberEndsAtItsOwnSafeUntil(t *testing.T) {
	c, err := New(WithEndpoints(closedPort(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	now := time.Now()
	shortSafe := now.Add(time.Second)
	// short is due 100ms after long, within a quarter of its interval: it
	// goes in the message long sends, bounded by long's safe-until (5s).
	short := renewingSession(t, c, 2, 2*time.Second, now.Add(100*time.Millisecond), shortSafe)
	long := renewingSession(t, c, 1, 8*time.Second, now, now.Add(5*time.Second))
	select {
	case <-short.Done():
	case <-time.After(4 * time.Second):
		t.Fatalf("the short session lives 3s past its safe-until")
	}
	if late := time.Since(shortSafe); late > 300*time.Millisecond {
		t.Errorf("the short session ended %v after its safe-until", late)
	}
	if !errors.Is(short.Err(), fence.ErrSessionLost) {
		t.Errorf("the short session ended with %v, want fence.ErrSessionLost", short.Err())
	}
	if long.Err() != nil {
		t.Errorf("the long session ended before its safe-until: %v", long.Err())
	}
}
