package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With nothing listening, a call fails after the dial timeout, naming the
// endpoints it tried, rather than after the whole retry budget.
func TestNothingListeningFailsAfterTheDialTimeout(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	c, err := New(WithEndpoints(a, b), WithDialTimeout(300*time.Millisecond), WithRetryBudget(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.NewSession(ctx)
	took := time.Since(start)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("NewSession with nothing listening: %v, want ErrUnreachable", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the call ran until its context ended (%v), not until the dial timeout", took)
	}
	for _, addr := range []string{a, b} {
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("the error does not name endpoint %s: %v", addr, err)
		}
	}
}
