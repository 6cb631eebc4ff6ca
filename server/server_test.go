package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// A release hands the lock to the first waiter, whose blocked Acquire
// returns a higher token; asking again for a held lock returns the same grant.
func TestReleaseHandsLockToWaiter(t *testing.T) {
	_, a := startWithAPI(t, nil)
	sa, sb := a.session(time.Minute), a.session(time.Minute)

	t1 := a.mustAcquire(sa, "orders")
	if again := a.mustAcquire(sa, "orders"); again != t1 {
		t.Fatalf("re-acquire returned token %d, want the same grant %d", again, t1)
	}
	p := a.acquireQueued(context.Background(), "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "orders"})
	if p.returned() {
		t.Fatal("b was granted while a holds the lock")
	}
	if err := a.release(sa, "orders", t1); err != nil {
		t.Fatal(err)
	}
	t2, err := p.result(t)
	if err != nil {
		t.Fatal(err)
	}
	if t2 <= t1 {
		t.Fatalf("hand-off token %d is not above %d", t2, t1)
	}
	holders := a.lock("orders").GetHolders()
	if len(holders) != 1 || holders[0].GetSessionId() != sb || holders[0].GetToken() != t2 {
		t.Fatalf("holders after hand-off = %v, want session %d with token %d", holders, sb, t2)
	}
}

// The leader expires a session whose keepalives stop, on its own clock:
// not before the TTL has passed since the last keepalive, and then it
// releases the session's locks to waiters and refuses further keepalives.
func TestSessionExpiresOnLeaderClock(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	sa := a.session(5 * time.Second)
	sb := a.session(time.Hour)
	a.mustAcquire(sa, "job")
	p := a.acquireQueued(context.Background(), "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "job"})

	clk.Advance(4 * time.Second)
	if err := a.keepAlive(sa); err != nil {
		t.Fatalf("keepalive within the TTL: %v", err)
	}
	clk.Advance(4 * time.Second) // 8s after creation, 4s after the keepalive
	time.Sleep(50 * time.Millisecond)
	if p.returned() {
		t.Fatal("the session expired although it was kept alive")
	}
	clk.Advance(2 * time.Second) // 6s after the keepalive
	if _, err := p.result(t); err != nil {
		t.Fatalf("waiter after expiry: %v", err)
	}
	if err := a.keepAlive(sa); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("keepalive of an expired session: %v, want NotFound", err)
	}
}

// A waiter whose own session expires is told so at once and never granted.
func TestWaiterWhoseSessionExpiresIsToldAtOnce(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	holder := a.session(time.Hour)
	waiter := a.session(2 * time.Second)
	a.mustAcquire(holder, "l")
	p := a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: waiter, Lock: "l"})
	clk.Advance(3 * time.Second)
	if _, err := p.result(t); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("waiter whose session expired got %v, want NotFound", err)
	}
	a.mustHaveNoWaiters("l", "expired waiter still queued")
}

// Lock-delay: after the holder's session expires, nobody gets the lock
// until the delay has passed on the leader's clock.
func TestLockDelayHoldsLockAfterExpiry(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	sa, sb := a.session(2*time.Second), a.session(time.Hour)
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: sa, Lock: "l", LockDelay: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	p := a.acquireQueued(context.Background(), "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "l"})
	clk.Advance(3 * time.Second)
	waitDelayed(t, s, a, 1)
	clk.Advance(9 * time.Second)
	time.Sleep(50 * time.Millisecond)
	if p.returned() {
		t.Fatal("b was granted before the lock-delay passed")
	}
	clk.Advance(time.Second)
	if _, err := p.result(t); err != nil {
		t.Fatalf("b after the lock-delay: %v", err)
	}
}

// Each expiry's lock-delay holds in full: two readers of a shared lock
// expire one after the other, and the writer waiting behind them is granted
// only once the delay after the second expiry has passed, not when the
// first expiry's delay ends (docs/design.md, Lock-delay).
func TestLockDelayOfEachExpiryHoldsInFull(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	r1, r2, w := a.session(2*time.Second), a.session(6*time.Second), a.session(time.Hour)
	for _, r := range []uint64{r1, r2} {
		if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: r, Lock: "l", Mode: fencev1.Mode_MODE_SHARED, LockDelay: durationpb.New(5 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	p := a.acquireQueued(context.Background(), "the writer", &fencev1.AcquireRequest{SessionId: w, Lock: "l"})

	clk.Advance(3 * time.Second) // r1 expired at 2s: delayed until 3s+5s
	waitFor(t, "r1 to expire", func() bool { return len(a.lock("l").GetHolders()) == 1 })
	waitDelayed(t, s, a, 1)
	clk.Advance(4 * time.Second) // r2 expired at 6s: delayed until 7s+5s
	waitFor(t, "r2 to expire", func() bool { return len(a.lock("l").GetHolders()) == 0 })
	waitDelayed(t, s, a, 2)
	clk.Advance(2 * time.Second) // 9s: r1's delay is over, r2's is not
	time.Sleep(100 * time.Millisecond)
	if p.returned() {
		t.Fatal("the writer was granted when the first reader's delay ended, before the second's")
	}
	if !a.lock("l").GetDelayed() {
		t.Fatal("the lock is no longer delayed after the first reader's delay")
	}
	clk.Advance(3 * time.Second) // 12s: r2's delay is over
	if _, err := p.result(t); err != nil {
		t.Fatalf("the writer after both delays: %v", err)
	}
}

// A wait timeout ends in DeadlineExceeded and leaves no waiter behind.
func TestWaitTimeout(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	sa, sb := a.session(time.Hour), a.session(time.Hour)
	a.mustAcquire(sa, "l")
	armed := clk.Timers()
	p := a.acquireQueued(context.Background(), "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "l", WaitTimeout: durationpb.New(2 * time.Second)})
	// The wait arms its timer after its Acquire is applied: advancing the
	// clock before that would leave the timer due 2s after the advance.
	clk.WaitForTimers(armed + 1)
	clk.Advance(2 * time.Second)
	if _, err := p.result(t); codeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("timed-out wait: %v, want DeadlineExceeded", err)
	}
	a.mustHaveNoWaiters("l", "timed-out waiter still queued")
}

// A caller that goes away while waiting leaves nothing behind: no waiter,
// and no grant nobody knows of.
func TestCancelledWaitLeavesNothing(t *testing.T) {
	_, a := startWithAPI(t, nil)
	sa, sb := a.session(time.Hour), a.session(time.Hour)
	token := a.mustAcquire(sa, "l")
	ctx, cancel := context.WithCancel(context.Background())
	p := a.acquireQueued(ctx, "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "l"})
	cancel()
	if _, err := p.result(t); err == nil {
		t.Fatal("cancelled Acquire succeeded")
	}
	waitFor(t, "the cancelled waiter to leave the queue", func() bool { return len(a.lock("l").GetWaiters()) == 0 })
	if err := a.release(sa, "l", token); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lock to be free", func() bool { return len(a.lock("l").GetHolders()) == 0 })
}

// Tokens survive a restart: the lock is still held with its token, and the
// next grant is higher than any before.
func TestRestartKeepsGrantsAndTokens(t *testing.T) {
	for _, store := range []string{LogStoreBolt, LogStoreWAL} {
		t.Run(store, func(t *testing.T) { restartKeepsGrantsAndTokens(t, store) })
	}
}

func restartKeepsGrantsAndTokens(t *testing.T, store string) {
	dir := t.TempDir()
	edit := func(c *Config) { c.DataDir = dir; c.SnapshotThreshold = 16; c.LogStore = store }
	s, a := startWithAPI(t, edit)
	sess := a.session(time.Hour)
	var last uint64
	for range 40 { // enough entries for a snapshot or two
		last = a.mustAcquire(sess, "churn")
		if err := a.release(sess, "churn", last); err != nil {
			t.Fatal(err)
		}
	}
	held := a.mustAcquire(sess, "kept")
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for range 3 {
		last = a.mustAcquire(sess, "churn")
		if err := a.release(sess, "churn", last); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restarted with the default config, the node opens the store the data
	// dir has (an upgrade from when bolt was the default must just work).
	s2 := startTestServer(t, func(c *Config) { edit(c); c.LogStore = "" })
	a2 := newAPI(t, s2)
	if kind, err := os.ReadFile(filepath.Join(dir, "log-store")); err != nil || string(kind) != store+"\n" {
		t.Fatalf("log-store file: %q, %v; want %s", kind, err, store)
	}
	if h := a2.lock("kept").GetHolders(); len(h) != 1 || h[0].GetToken() != held || h[0].GetSessionId() != sess {
		t.Fatalf("after restart lock kept = %v, want session %d token %d", h, sess, held)
	}
	next := a2.mustAcquire(a2.session(time.Minute), "new")
	if next <= last {
		t.Fatalf("token after restart %d is not above %d", next, last)
	}
}

// A data dir keeps its log store: asking for the other one is refused, and
// a new dir without a choice gets wal.
func TestLogStoreOfADataDir(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, func(c *Config) { c.DataDir = dir; c.LogStore = LogStoreBolt })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.RaftListen, cfg.LogStore = dir, "127.0.0.1:0", "127.0.0.1:0", LogStoreWAL
	if s, err := Start(cfg); err == nil {
		s.Close()
		t.Fatal("a bolt data dir was opened as wal")
	} else if !strings.Contains(err.Error(), `keeps its raft log in "bolt"`) {
		t.Fatalf("error %q does not say which store the dir has", err)
	}
	fresh := t.TempDir()
	startTestServer(t, func(c *Config) { c.DataDir = fresh })
	if kind, err := os.ReadFile(filepath.Join(fresh, "log-store")); err != nil || string(kind) != "wal\n" {
		t.Fatalf("a new data dir's log-store: %q, %v; want wal", kind, err)
	}
}

// Configured limits are enforced with ResourceExhausted.
func TestLimits(t *testing.T) {
	_, a := startWithAPI(t, func(c *Config) { c.MaxSessions = 3; c.MaxWaitersPerLock = 1 })
	s1, s2, s3 := a.session(time.Minute), a.session(time.Minute), a.session(time.Minute)
	_, err := a.sessions.CreateSession(context.Background(), connect.NewRequest(&fencev1.CreateSessionRequest{}))
	if codeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("session over the limit: %v, want ResourceExhausted", err)
	}
	a.mustAcquire(s1, "l")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: s2, Lock: "l"})
	waitFor(t, "one waiter", func() bool { return len(a.lock("l").GetWaiters()) == 1 })
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: s3, Lock: "l"}); codeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("waiter over the limit: %v, want ResourceExhausted", err)
	}
}

// TryLock on a held lock fails at once with FailedPrecondition.
func TestTryOnHeldLock(t *testing.T) {
	_, a := startWithAPI(t, nil)
	sa, sb := a.session(time.Minute), a.session(time.Minute)
	a.mustAcquire(sa, "l")
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: sb, Lock: "l", Try: true}); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("try on a held lock: %v, want FailedPrecondition", err)
	}
	a.mustHaveNoWaiters("l", "try left a waiter")
}

// CancelAcquire gives up an Acquire by its request id, whatever became of
// it: a caller without a client library (curl with --max-time) calls it
// after a failed Acquire, and nothing is left held or queued; a retry of the
// given-up Acquire that arrives later is refused.
func TestCancelAcquire(t *testing.T) {
	_, a := startWithAPI(t, nil)
	sa, sb := a.session(time.Hour), a.session(time.Hour)
	cancelAcquire := func(session uint64, lock string, id uint64) *fencev1.CancelAcquireResponse {
		t.Helper()
		resp, err := a.locks.CancelAcquire(context.Background(), connect.NewRequest(&fencev1.CancelAcquireRequest{SessionId: session, Lock: lock, RequestId: id}))
		if err != nil {
			t.Fatalf("CancelAcquire(%d, %d): %v", session, id, err)
		}
		return resp.Msg
	}

	a.mustAcquire(sa, "l") // sa holds, without a request id
	// The blocked call, still open, learns at once that its wait is gone:
	// it must not wait on for a grant that can no longer come.
	p := a.acquireQueued(context.Background(), "b", &fencev1.AcquireRequest{SessionId: sb, Lock: "l", RequestId: 1})
	if got := cancelAcquire(sb, "l", 1); !got.GetDequeued() || got.GetReleased() {
		t.Fatalf("cancelling a queued acquire: %v, want dequeued", got)
	}
	if _, err := p.result(t); codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("the blocked Acquire whose wait was cancelled: %v, want FailedPrecondition (cancelled)", err)
	}
	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: sb, Lock: "l", RequestId: 1, Try: true}); codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("a retry of a cancelled acquire: %v, want FailedPrecondition (cancelled)", err)
	}

	if _, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: sa, Lock: "m", RequestId: 2}); err != nil {
		t.Fatal(err)
	}
	if got := cancelAcquire(sa, "m", 2); !got.GetReleased() {
		t.Fatalf("cancelling a granted acquire: %v, want released", got)
	}
	if len(a.lock("m").GetHolders()) != 0 {
		t.Fatal("the cancelled grant is still held")
	}
	if got := cancelAcquire(sa, "m", 2); got.GetReleased() || got.GetDequeued() {
		t.Fatalf("cancelling again: %v, want nothing done", got)
	}
	if _, err := a.locks.CancelAcquire(context.Background(), connect.NewRequest(&fencev1.CancelAcquireRequest{SessionId: sa, Lock: "m"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("CancelAcquire without a request id: %v, want InvalidArgument", err)
	}
}

// A second node started on a data dir in use fails at once, naming the
// process that has it, instead of waiting forever on the log store's file
// lock; once the first node stops, the dir can be used again.
func TestDataDirInUse(t *testing.T) {
	first := startTestServer(t, nil)
	cfg := first.cfg
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	start := time.Now()
	second, err := Start(cfg)
	if err == nil {
		second.Close()
		t.Fatal("a second node started on a data dir in use")
	}
	want := fmt.Sprintf("data dir %s is in use by another fence process (pid %d)", cfg.DataDir, os.Getpid())
	if !strings.Contains(err.Error(), want) || time.Since(start) > time.Second {
		t.Fatalf("after %v: %v; want at once an error saying %q", time.Since(start), err, want)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	mustStart(t, cfg)
}
