package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// A polling Acquire answers "waiting" after its poll interval; taken up
// again with the attempt it was given, it keeps its place without a new
// commit, and is granted when the holder lets go.
func TestPollingAcquireKeepsItsPlace(t *testing.T) {
	s, a := startWithAPI(t, nil)
	ctx := context.Background()
	holder, waiter, later := a.session(time.Minute), a.session(time.Minute), a.session(time.Minute)
	token := a.mustAcquire(holder, "x")

	req := &fencev1.AcquireRequest{SessionId: waiter, Lock: "x", RequestId: 7, Poll: durationpb.New(100 * time.Millisecond)}
	resp, err := a.locks.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Msg.GetWaiting() || resp.Msg.GetAttempt() == 0 || resp.Msg.GetToken() != 0 {
		t.Fatalf("first poll answered %v, want waiting with an attempt", resp.Msg)
	}
	// Another session queues behind it.
	behind := a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: later, Lock: "x"})
	waitFor(t, "the later session to queue", func() bool { return len(a.lock("x").GetWaiters()) == 2 })

	before := s.node.raft.LastIndex()
	req.ResumeAttempt = resp.Msg.GetAttempt()
	again, err := a.locks.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Msg.GetWaiting() || again.Msg.GetAttempt() != req.ResumeAttempt {
		t.Fatalf("resumed poll answered %v, want waiting at attempt %d", again.Msg, req.ResumeAttempt)
	}
	if after := s.node.raft.LastIndex(); after != before {
		t.Errorf("resuming a wait committed %d entries", after-before)
	}

	pending := a.acquireAsync(ctx, req)
	if err := a.release(holder, "x", token); err != nil {
		t.Fatal(err)
	}
	got, err := pending.result(t)
	if err != nil || got <= token {
		t.Fatalf("the resumed wait got token %d, %v; want a grant after %d", got, err, token)
	}
	if behind.returned() {
		t.Fatal("the session queued behind the polling one was granted first")
	}
}

func TestPollNeedsARequestID(t *testing.T) {
	_, a := startWithAPI(t, nil)
	_, err := a.locks.Acquire(context.Background(), connect.NewRequest(&fencev1.AcquireRequest{
		SessionId: a.session(time.Minute), Lock: "x", Poll: durationpb.New(time.Second),
	}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("poll without a request id: %v, want InvalidArgument", err)
	}
}

func TestLockLimitsAreEnforced(t *testing.T) {
	_, a := startWithAPI(t, func(cfg *Config) { cfg.MaxLocksPerSession, cfg.MaxLocks = 2, 3 })
	one, two := a.session(time.Minute), a.session(time.Minute)
	a.mustAcquire(one, "a")
	a.mustAcquire(one, "b")
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: one, Lock: "c"}); codeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a third lock for a session limited to 2: %v, want ResourceExhausted", err)
	}
	a.mustAcquire(two, "c")
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: two, Lock: "d"}); codeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a fourth lock where 3 are allowed: %v, want ResourceExhausted", err)
	}
}
