package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/server"
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
	c := mustNew(t, WithEndpoints(a, b), WithDialTimeout(300*time.Millisecond), WithRetryBudget(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.NewSession(ctx)
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

// With the default options a client that has never talked to its group
// fails its first call within about a second when nothing listens, with
// ErrUnreachable naming the endpoints and what to do. It used to retry
// for the 15 s retry budget and then fail with a bare dial error.
func TestFirstCallFailsFastByDefault(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	err := firstNewSession(t, 2*time.Second, "with nothing listening", a, b)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("NewSession with nothing listening: %v, want ErrUnreachable", err)
	}
	for _, want := range []string{a, b, "fence serve", "--endpoints", "FENCE_ENDPOINTS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// A client that has talked to its group takes a node it cannot connect to
// for one restarting: a call made while its only node is down for longer
// than the dial timeout waits for the node to come back, within the retry
// budget, as a leader election is waited out.
func TestAClientThatTalkedToItsGroupRidesOutARestart(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = freeAddr(t)
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	srv := mustStartConfig(t, cfg)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	mustPut(t, ctx, c.KV(), "k", []byte("v"))
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() {
		time.Sleep(2 * time.Second) // twice the dial timeout
		s, err := server.Start(cfg)
		if err == nil {
			t.Cleanup(func() { s.Close() })
		}
		restarted <- err
	}()
	kv, err := c.KV().Get(ctx, "k")
	if err := <-restarted; err != nil {
		t.Fatalf("restarting the node: %v", err)
	}
	if err != nil || string(kv.GetValue()) != "v" {
		t.Fatalf("Get across a restart of the only node: %v, %v; want v", kv, err)
	}
}

// A client that has talked to its group and then can connect to no node
// for the whole retry budget fails with ErrUnreachable too, not with the
// last dial error.
func TestAGroupGoneForTheBudgetIsUnreachable(t *testing.T) {
	srv := startServer(t, nil)
	c := mustNew(t, WithEndpoints(srv.Addr()), WithRetryBudget(500*time.Millisecond))
	ctx := context.Background()
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	_, err := c.Status(ctx)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("Status with the group gone: %v, want ErrUnreachable naming %s", err, srv.Addr())
	}
}

// firstNewSession is a new client's first call, NewSession, to endpoints
// (described by what): it fails the test unless the call returns within
// limit, and returns its error.
func firstNewSession(t *testing.T, limit time.Duration, what string, endpoints ...string) error {
	t.Helper()
	c, err := New(WithEndpoints(endpoints...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.NewSession(context.Background())
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(limit):
		t.Fatalf("NewSession %s has not returned after %v", what, limit)
	}
	return err
}
