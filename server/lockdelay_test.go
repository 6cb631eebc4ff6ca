package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// delayedHandOff starts a server on a fake clock where session a holds
// lock "l" with a lock-delay of 10 s and session b waits for it, once the
// group has moved to protocol 3, where a session's end is recorded.
func delayedHandOff(t *testing.T) (s *Server, clk *clock.Fake, a *api, holder uint64, waiter *pending) {
	t.Helper()
	clk = clock.NewFake()
	s = startTestServer(t, func(c *Config) { c.Clock = clk })
	waitFor(t, "the group to move to protocol 3", func() bool { return s.fsm.Protocol() >= fsm.Protocol3 })
	a = newAPI(t, s)
	holder, other := a.session(time.Hour), a.session(time.Hour)
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: holder, Lock: "l", LockDelay: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	waiter = a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: other, Lock: "l"})
	return s, clk, a, holder, waiter
}

// mustHoldBack checks that the lock is under its delay and nobody is
// granted it until the delay has passed on the leader's clock.
func mustHoldBack(t *testing.T, s *Server, clk *clock.Fake, a *api, waiter *pending) {
	t.Helper()
	waitDelayed(t, s, a, 1)
	clk.Advance(9 * time.Second)
	if l := a.lock("l"); !l.GetDelayed() || len(l.GetHolders()) != 0 || waiter.returned() {
		t.Fatalf("9 s into a 10 s lock-delay: %v, waiter returned %v; want the lock delayed and nobody granted", l, waiter.returned())
	}
	clk.Advance(time.Second)
	if _, err := waiter.result(t); err != nil {
		t.Fatalf("the waiter after the lock-delay: %v", err)
	}
}

// waitDelayed waits until lock "l" is delayed and the leader has armed
// the timers of n delays. The state says a lock is delayed before the
// leader's observer arms its timer on the clock: a fake clock advanced in
// between armed it that much late (TestLeaseLockDelay failed so in CI).
func waitDelayed(t *testing.T, s *Server, a *api, n int) {
	t.Helper()
	waitFor(t, "the lock to be delayed", func() bool { return a.lock("l").GetDelayed() })
	waitFor(t, "the lock-delays' timers to be armed", func() bool { return s.delays.armed() >= n })
}

// armed returns how many delays have a timer armed: their own, or a
// retry's.
func (d *delayScheduler) armed() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.timers)
}

// An operator's revoke ends the grant as an expiry does: the lock is held
// back for its lock-delay, since the revoked holder may still be writing
// (docs/design.md, Lock-delay). It was handed on at once.
func TestLockDelayHoldsLockAfterRevoke(t *testing.T) {
	s, clk, a, holder, waiter := delayedHandOff(t)
	cluster := fencev1connect.NewClusterServiceClient(http.DefaultClient, "http://"+s.Addr())
	if _, err := cluster.RevokeSession(context.Background(), connect.NewRequest(&fencev1.RevokeSessionRequest{SessionId: holder})); err != nil {
		t.Fatal(err)
	}
	mustHoldBack(t, s, clk, a, waiter)
	mustRecord(t, s, holder, "revoked")
}

// A session its client abandons (it could not renew it in time) ends as an
// expiry ends it: the lock is held back for its lock-delay. A wrong secret
// abandons nothing.
func TestLockDelayHoldsLockAfterAbandon(t *testing.T) {
	s, clk, a, holder, waiter := delayedHandOff(t)
	ctx := context.Background()
	_, err := a.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: holder, SessionSecret: "wrong", Abandon: true}))
	if !errors.Is(rpcerr.FromConnect(err), fence.ErrSessionSecret) {
		t.Fatalf("abandoning with a wrong secret: %v, want ErrSessionSecret", err)
	}
	if h := a.lock("l").GetHolders(); len(h) != 1 || h[0].GetSessionId() != holder {
		t.Fatalf("after a refused abandon the holders are %v, want session %d", h, holder)
	}
	if _, err := a.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: holder, Abandon: true})); err != nil {
		t.Fatal(err)
	}
	mustHoldBack(t, s, clk, a, waiter)
	mustRecord(t, s, holder, "abandoned")
}

// A close by the session's own client is its holder's release: the lock
// goes to the next waiter at once, whatever lock-delay it was taken with.
func TestCloseHandsLockOnDespiteLockDelay(t *testing.T) {
	s, _, a, holder, waiter := delayedHandOff(t)
	if _, err := a.sessions.CloseSession(context.Background(), connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: holder})); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.result(t); err != nil {
		t.Fatalf("the waiter after the holder closed its session: %v", err)
	}
	mustRecord(t, s, holder, "closed")
}

// A revoke or an abandonment is recorded as such from protocol 3 on;
// below it, where a member may not know CloseSession's end, it goes as an
// expiry, which puts the same lock-delays in force on every version. A
// close by the session's own client is a close at every protocol.
func TestEndSessionCommandFollowsTheProtocol(t *testing.T) {
	closeAs := func(end fsmpb.SessionEnd) *fsmpb.Command {
		return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{SessionId: 7, End: end}}}
	}
	expire := &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{SessionIds: []uint64{7}}}}
	for _, tc := range []struct {
		protocol uint32
		end      fsmpb.SessionEnd
		want     *fsmpb.Command
	}{
		{fsm.Protocol1, fsmpb.SessionEnd_SESSION_END_CLOSED, closeAs(fsmpb.SessionEnd_SESSION_END_CLOSED)},
		{fsm.Protocol2, fsmpb.SessionEnd_SESSION_END_CLOSED, closeAs(fsmpb.SessionEnd_SESSION_END_CLOSED)},
		{fsm.Protocol1, fsmpb.SessionEnd_SESSION_END_REVOKED, expire},
		{fsm.Protocol2, fsmpb.SessionEnd_SESSION_END_REVOKED, expire},
		{fsm.Protocol2, fsmpb.SessionEnd_SESSION_END_ABANDONED, expire},
		{fsm.Protocol3, fsmpb.SessionEnd_SESSION_END_CLOSED, closeAs(fsmpb.SessionEnd_SESSION_END_CLOSED)},
		{fsm.Protocol3, fsmpb.SessionEnd_SESSION_END_REVOKED, closeAs(fsmpb.SessionEnd_SESSION_END_REVOKED)},
		{fsm.Protocol3, fsmpb.SessionEnd_SESSION_END_ABANDONED, closeAs(fsmpb.SessionEnd_SESSION_END_ABANDONED)},
	} {
		if got := endSession(tc.protocol, 7, tc.end); !proto.Equal(got, tc.want) {
			t.Errorf("at protocol %d, %v goes as %v, want %v", tc.protocol, tc.end, got, tc.want)
		}
	}
}

// mustRecord waits until the console lists the end of the session's grant
// as the session's end, how.
func mustRecord(t *testing.T, s *Server, session uint64, how string) {
	t.Helper()
	waitFor(t, "the console to list session "+how, func() bool {
		for _, e := range s.console.recent() {
			if e.Session == session && e.Kind != "granted" {
				if e.End != how {
					t.Fatalf("the console lists session %d's grant as ended by %q (%s), want %q", session, e.End, e.Kind, how)
				}
				return true
			}
		}
		return false
	})
}

// A LiftDelay that fails to commit is proposed again, after liftRetryMin
// and then twice as long each time up to liftRetryMax, while the node
// leads: it was only logged, and the lock stayed delayed until the next
// leader change. Leading no more stops the retries, and a lift that fails
// once the node no longer leads is not retried: the next leader restarts
// the delay in full.
func TestFailedLiftDelayIsRetried(t *testing.T) {
	clk := clock.NewFake()
	var logs syncbuf.Buffer
	var failing atomic.Int32 // how many more lifts fail
	var stepDown atomic.Bool // the next lift loses leadership as it fails
	lifts := make(chan struct{}, 16)
	var d *delayScheduler
	d = newDelayScheduler(clk, slog.New(slog.NewTextHandler(&logs, nil)), func(string, uint64) error {
		defer func() { lifts <- struct{}{} }()
		if stepDown.Swap(false) {
			d.becomeFollower()
		}
		if failing.Add(-1) >= 0 {
			return errors.New("refused")
		}
		return nil
	})
	armed := func(n int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d timers armed", n), func() bool { return clk.Timers() == n })
	}
	lifted := func() {
		t.Helper()
		select {
		case <-lifts:
		case <-time.After(10 * time.Second):
			t.Fatal("no LiftDelay was proposed")
		}
	}
	d.becomeLeader(nil)
	failing.Store(3)
	d.schedule([]fsm.Delay{{Lock: "l", Delay: 10 * time.Second, ID: 1}})
	clk.Advance(10 * time.Second)
	lifted()
	for _, backoff := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		armed(1) // the retry, once the failure is in
		clk.Advance(backoff - time.Millisecond)
		if clk.Timers() != 1 {
			t.Fatalf("the retry fired before its backoff of %v", backoff)
		}
		clk.Advance(time.Millisecond)
		lifted()
	}
	armed(0) // the fourth lift succeeded: nothing more to do

	// The backoff stops growing at liftRetryMax.
	failing.Store(100)
	d.schedule([]fsm.Delay{{Lock: "l", Delay: time.Second, ID: 2}})
	clk.Advance(time.Second)
	lifted()
	for range 8 { // 100 ms .. 6.4 s, capped at 5 s
		armed(1)
		clk.Advance(liftRetryMax)
		lifted()
	}
	armed(1)
	clk.Advance(liftRetryMax - time.Millisecond)
	if clk.Timers() != 1 {
		t.Fatal("a retry came sooner than liftRetryMax after many failures")
	}
	clk.Advance(time.Millisecond)
	lifted()
	armed(1)
	d.becomeFollower()
	armed(0)

	d.becomeLeader([]fsm.Delay{{Lock: "l", Delay: time.Second, ID: 2}})
	stepDown.Store(true)
	clk.Advance(time.Second)
	lifted()
	waitFor(t, "the failure after leadership was lost to be logged", func() bool {
		return strings.Contains(logs.String(), "the next term restarts it")
	})
	if n := clk.Timers(); n != 0 {
		t.Fatalf("%d timers armed after a lift failed on a node that no longer leads", n)
	}
}

// The same on a real node: a LiftDelay refused while the node cannot
// propose (here, as while it is not a ready leader; in production also a
// leadership transfer under way or a full disk) is proposed again once it
// can, and the waiter gets the lock. It stayed delayed.
func TestRefusedLiftDelayIsRetriedOnANode(t *testing.T) {
	var logs syncbuf.Buffer
	clk := clock.NewFake()
	s, a := startWithAPI(t, func(c *Config) { c.Clock = clk; c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	holder, other := a.session(time.Hour), a.session(time.Hour)
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: holder, Lock: "l", LockDelay: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	waiter := a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: other, Lock: "l"})
	cluster := fencev1connect.NewClusterServiceClient(http.DefaultClient, "http://"+s.Addr())
	if _, err := cluster.RevokeSession(context.Background(), connect.NewRequest(&fencev1.RevokeSessionRequest{SessionId: holder})); err != nil {
		t.Fatal(err)
	}
	waitDelayed(t, s, a, 1)

	s.leaderReady.Store(false) // proposals are refused with Unavailable
	clk.Advance(10 * time.Second)
	waitFor(t, "the LiftDelay to be refused", func() bool { return strings.Contains(logs.String(), "lifting lock-delay failed") })
	s.leaderReady.Store(true)
	clk.Advance(liftRetryMin)
	if _, err := waiter.result(t); err != nil {
		t.Fatalf("the waiter once the LiftDelay could be committed: %v", err)
	}
}
