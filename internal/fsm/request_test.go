package fsm_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Each expiry puts the lock under its own delay, lifted by its own id, and
// the lock is granted again only once every delay is lifted: a shared lock
// whose readers expire one after the other stays delayed for the full
// delay after the last expiry (docs/design.md, Lock-delay).
func TestEachExpiryDelaysInFull(t *testing.T) {
	const sec = time.Second
	delayed := func(id uint64, d time.Duration) fsm.Delay { return fsm.Delay{Lock: "a", Delay: d, ID: id} }
	readersExpire := func(d1, d2 time.Duration) []applyStep {
		return script(sessions(3), []applyStep{
			{cmd: acquire(1, "a", shared, withDelay(d1)), want: granted(1, "a", 1, shared)},
			{cmd: acquire(2, "a", shared, withDelay(d2)), want: granted(2, "a", 2, shared)},
			{cmd: acquire(3, "a", excl), want: queued()},
			{cmd: expireSessions(1), want: withDelays(ended(fsm.Expired, 1), delayed(1, d1))},
			{cmd: expireSessions(2), want: withDelays(ended(fsm.Expired, 2), delayed(2, d2)), after: func(t *testing.T, s *fsm.State) {
				if got := s.DelayedLocks(); len(got) != 2 || got[0] != delayed(1, d1) || got[1] != delayed(2, d2) {
					t.Fatalf("DelayedLocks() = %+v, want both delays", got)
				}
			}},
		})
	}
	cases := []applyCase{
		{
			name: "the first expiry's lift leaves the second's delay in force",
			steps: script(readersExpire(5*sec, 5*sec), []applyStep{
				{cmd: liftDelayID("a", 1), want: fsm.Result{}},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: liftDelayID("a", 1), want: fsm.Result{}},
				{cmd: liftDelayID("a", 2), want: handedTo(grant(3, "a", 3, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 3, excl)}}},
		},
		{
			name: "a shorter later delay does not cut an earlier longer one short",
			steps: script(readersExpire(5*sec, sec), []applyStep{
				{cmd: liftDelayID("a", 2), want: fsm.Result{}},
				{cmd: liftDelayID("a", 1), want: handedTo(grant(3, "a", 3, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 3, excl)}}},
		},
		{
			name: "a LiftDelay without an id, as older versions logged it, lifts every delay",
			steps: script(readersExpire(5*sec, 5*sec), []applyStep{
				{cmd: liftDelay("a"), want: handedTo(grant(3, "a", 3, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 3, excl)}}},
		},
	}
	runApplyCases(t, cases, false)
}

// Lock-delay holds for every end of a grant that is not its holder's own
// release: an operator's revoke and a session its client gave up (it could
// not renew it) delay the lock as an expiry does, and a close by the
// session's own client hands it on at once (docs/design.md, Lock-delay). A
// CloseSession logged by an older version, without the end, is a close as
// it was; an end this version does not know fails and changes nothing.
func TestEveryEndButTheHoldersCloseDelays(t *testing.T) {
	const sec = time.Second
	heldAndAwaited := script(sessions(2), []applyStep{
		{cmd: acquire(1, "a", excl, withDelay(5*sec)), want: granted(1, "a", 1, excl)},
		{cmd: acquire(2, "a", excl), want: queued()},
	})
	delayedBy := func(how fsm.End) fsm.Result {
		return withDelays(ended(how, 1), fsm.Delay{Lock: "a", Delay: 5 * sec, ID: 1})
	}
	handedOnBy := func(how fsm.End) fsm.Result {
		return withGrants(ended(how, 1), grant(2, "a", 2, excl))
	}
	held := []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}}
	// An entry of a version before CloseSession.end: field 2 (close_session)
	// holding field 1 (session_id) = 1, and nothing else.
	var logged fsmpb.Command
	if err := proto.Unmarshal([]byte{0x12, 0x02, 0x08, 0x01}, &logged); err != nil {
		t.Fatal(err)
	}
	cases := []applyCase{
		{
			name: "a revoke holds the lock back until LiftDelay",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: closeSessionAs(1, fsmpb.SessionEnd_SESSION_END_REVOKED), want: delayedBy(fsm.Revoked)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: liftDelayID("a", 1), want: handedTo(grant(2, "a", 2, excl))},
			}),
			locks: held,
		},
		{
			name: "a session given up by its client holds the lock back until LiftDelay",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: closeSessionAs(1, fsmpb.SessionEnd_SESSION_END_ABANDONED), want: delayedBy(fsm.Abandoned)},
				{cmd: liftDelayID("a", 1), want: handedTo(grant(2, "a", 2, excl))},
			}),
			locks: held,
		},
		{
			name: "a close by the session's own client hands the lock on at once",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: closeSessionAs(1, fsmpb.SessionEnd_SESSION_END_CLOSED), want: handedOnBy(fsm.Closed)},
			}),
			locks: held,
		},
		{
			name: "a close logged by an older version hands the lock on at once",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: &logged, want: handedOnBy(fsm.Closed)},
			}),
			locks: held,
		},
		{
			name: "a revoke of a holder that asked for no delay hands the lock on at once",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: closeSessionAs(1, fsmpb.SessionEnd_SESSION_END_REVOKED), want: handedOnBy(fsm.Revoked)},
			}),
			locks: held,
		},
		{
			name: "a revoke of a session gone already ends nothing",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: closeSession(1), want: handedOnBy(fsm.Closed)},
				{cmd: closeSessionAs(1, fsmpb.SessionEnd_SESSION_END_REVOKED), want: fsm.Result{}},
			}),
			locks: held,
		},
		{
			name: "an unknown end fails and changes nothing",
			steps: script(heldAndAwaited, []applyStep{
				{cmd: closeSessionAs(1, fsmpb.SessionEnd(7)), want: fails(fence.ErrInvalidArgument), errMsg: "fence: invalid argument: CloseSession of session 1 with an unknown end (7)"},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl)}}},
		},
	}
	runApplyCases(t, cases, false)
}

// An acquire named by a request id can be given up exactly: its grant is
// released, its wait dropped, and a retry of it still on its way fails. A
// retry of the same request takes the grant or wait over under a new
// attempt, which the server's give-up of an earlier attempt leaves alone
// (docs/design.md, Acquire requests).
func TestCancelAcquire(t *testing.T) {
	cases := []applyCase{
		{
			name: "a granted request is released and then refused",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl, withRequest(7)), want: withAttempt(granted(1, "a", 1, excl), 1)},
				{cmd: acquire(2, "a", excl, withRequest(7)), want: withAttempt(queued(), 2)},
				{cmd: cancelAcquire(1, "a", 7, 0), want: fsm.Result{Answer: fsm.CancelAcquireAnswer{Released: true}, Effects: fsm.Effects{Grants: []fsm.Grant{grant(2, "a", 2, excl)}}}},
				{cmd: cancelAcquire(1, "a", 7, 0), want: fsm.Result{}},
				{cmd: acquire(1, "a", excl, withRequest(7)), want: fails(fence.ErrCancelled)},
				{cmd: acquire(1, "a", excl, withRequest(8)), want: withAttempt(queued(), 3)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}, Waiters: []fsm.WaiterInfo{waiting(1, excl)}}},
		},
		{
			name: "a waiting request is dropped from the queue",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, withRequest(5)), want: withAttempt(queued(), 1)},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: cancelAcquire(2, "a", 5, 0), want: fsm.Result{Answer: fsm.CancelAcquireAnswer{Dequeued: true}}},
				{cmd: release(1, "a", 1), want: handedTo(grant(3, "a", 2, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 2, excl)}}},
		},
		{
			name: "a retry takes the grant over; giving up the earlier attempt leaves it",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(1, "a", excl, withRequest(7)), want: withAttempt(granted(1, "a", 1, excl), 1)},
				{cmd: acquire(1, "a", excl, withRequest(7)), want: withAttempt(alreadyHeld(1, "a", 1, excl), 2)},
				{cmd: cancelAcquire(1, "a", 7, 1), want: fsm.Result{}},
				{cmd: cancelWaitOf(1, "a", 7, 1), want: fsm.Result{}},
				{cmd: cancelWaitOf(1, "a", 7, 2), want: grantedBefore(1, "a", 1, excl)},
				{cmd: cancelAcquire(1, "a", 7, 2), want: fsm.Result{Answer: fsm.CancelAcquireAnswer{Released: true}}},
			}),
		},
		{
			name: "another request of the session is told of the grant but cannot give it up",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(1, "a", excl, withRequest(7)), want: withAttempt(granted(1, "a", 1, excl), 1)},
				{cmd: acquire(1, "a", excl, withRequest(8)), want: alreadyHeld(1, "a", 1, excl)},
				{cmd: cancelAcquire(1, "a", 8, 0), want: fsm.Result{}},
				{cmd: acquire(1, "a", excl), want: alreadyHeld(1, "a", 1, excl)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}}},
		},
		{
			name: "a waiting retry takes the wait over, and the grant goes with it",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, withRequest(3)), want: withAttempt(queued(), 1)},
				{cmd: acquire(2, "a", excl, withRequest(3)), want: withAttempt(queued(), 2)},
				{cmd: cancelWaitOf(2, "a", 3, 1), want: fsm.Result{}},
				{cmd: cancelAcquire(2, "a", 3, 1), want: fsm.Result{}},
				{cmd: release(1, "a", 1), want: handedTo(grant(2, "a", 2, excl))},
				{cmd: cancelAcquire(2, "a", 3, 2), want: fsm.Result{Answer: fsm.CancelAcquireAnswer{Released: true}}},
			}),
		},
		{
			name: "cancelling needs a request id and a live session",
			steps: script(sessions(1), []applyStep{
				{cmd: cancelAcquire(1, "a", 0, 0), want: fails(fence.ErrInvalidArgument)},
				{cmd: cancelAcquire(9, "a", 1, 0), want: fails(fence.ErrSessionNotFound)},
				{cmd: cancelAcquire(1, "never-used", 1, 0), want: fsm.Result{}},
				{cmd: acquire(1, "never-used", excl, withRequest(1)), want: fails(fence.ErrCancelled)},
			}),
		},
	}
	runApplyCases(t, cases, false)
}

func withAttempt(r fsm.Result, attempt uint64) fsm.Result {
	a := r.Acquire()
	a.Attempt = attempt
	r.Answer = a
	return r
}

// isRepeat reports whether res answers Repeat: its command's idempotency
// key was applied before.
func isRepeat(res fsm.Result) bool {
	_, ok := res.Repeat()
	return ok
}

func keyedCmd(key string, cmd *fsmpb.Command) *fsmpb.Command {
	cmd.IdempotencyKey = key
	return cmd
}

// A command whose idempotency key was applied before is not applied again:
// it answers what the first application did, in Repeat. A failed command
// leaves no key, so its retry runs. The keys survive a snapshot, and the
// oldest are forgotten beyond MaxIdempotencyKeys.
func TestIdempotencyKeys(t *testing.T) {
	s := fsm.NewState()
	apply := func(cmd *fsmpb.Command) fsm.Result {
		t.Helper()
		res := s.Apply(cmd)
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := apply(keyedCmd("s1", newSession())); res.CreateSession().SessionID != 1 {
		t.Fatalf("first CreateSession: %+v", res)
	}
	if res := apply(keyedCmd("s1", newSession())); !sameResult(res, fsm.Result{Answer: fsm.Repeat{SessionID: 1}}) || s.NumSessions() != 1 {
		t.Fatalf("repeated CreateSession: %+v, %d sessions", res, s.NumSessions())
	}
	first := apply(keyedCmd("p1", kvPut("k", "v")))
	rev := first.KV().Revision
	if res := apply(keyedCmd("p1", kvPut("k", "v"))); !sameResult(res, fsm.Result{Answer: fsm.Repeat{Revision: rev, Changed: true}}) || s.KVRevision() != rev {
		t.Fatalf("repeated put: %+v (first %+v), revision now %d", res, first, s.KVRevision())
	}
	if res := apply(keyedCmd("bad", acquire(9, "a", excl))); res.Err == nil {
		t.Fatal("an acquire by an unknown session succeeded")
	}
	if res := apply(keyedCmd("bad", newSession())); !sameResult(res, sessionMade(2)) {
		t.Fatalf("a key whose first command failed: %+v, want it applied", res)
	}
	if res := apply(keyedCmd(strings.Repeat("k", fsm.MaxIdempotencyKeyBytes+1), newSession())); !errors.Is(res.Err, fence.ErrInvalidArgument) {
		t.Fatalf("an oversized key: %+v", res)
	}

	restored := mustRestore(t, s)
	if res := restored.Apply(keyedCmd("p1", kvPut("k", "v"))); !isRepeat(res) {
		t.Fatalf("a key after a snapshot restore: %+v, want a repeat", res)
	}
	for i := range fsm.MaxIdempotencyKeys {
		apply(keyedCmd(fmt.Sprintf("fill-%d", i), kvPut("fill", "x")))
	}
	if res := apply(keyedCmd("s1", newSession())); isRepeat(res) {
		t.Fatalf("the oldest key is still remembered after %d newer ones: %+v", fsm.MaxIdempotencyKeys, res)
	}
}
