// Table tests for State.Apply: each case is a script of commands with the
// exact Result expected of every one, applied to a fresh State. They prove
// the command semantics of docs/design.md (sessions, grants and queues, hand-off in
// the releasing command, idempotent acquire, lock-delay on expiry but not on a
// release or close, the shared/exclusive FIFO rules) and, because the runner checks
// CheckInvariants after every step and compares the snapshot around every
// failed step, that a failing command changes nothing.
package fsm_test

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

type applyStep struct {
	cmd  *fsmpb.Command
	want fsm.Result
	// errMsg, if set, is the exact message the step's error must have.
	errMsg string
	// after, if set, checks the state after this step.
	after func(t *testing.T, s *fsm.State)
}

type applyCase struct {
	name  string
	steps []applyStep
	// locks is the final Locks(""); nil means no lock is left.
	locks []fsm.LockInfo
	// check, if set, checks the final state further.
	check func(t *testing.T, s *fsm.State)
}

// sessions returns steps that create sessions 1..n in a fresh state.
func sessions(n int) []applyStep {
	steps := make([]applyStep, n)
	for i := range steps {
		steps[i] = applyStep{cmd: newSession(), want: sessionMade(uint64(i + 1))}
	}
	return steps
}

func script(parts ...[]applyStep) []applyStep {
	var out []applyStep
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func locksAre(want ...fsm.LockInfo) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if got := s.Locks(""); !reflect.DeepEqual(got, want) {
			t.Fatalf("Locks(\"\"):\n got %+v\nwant %+v", got, want)
		}
	}
}

func lastTokenIs(want uint64) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if got := s.LastToken(); got != want {
			t.Fatalf("LastToken() = %d, want %d", got, want)
		}
	}
}

// runApplyCases runs each case as a subtest: its script on a fresh State,
// then its final locks and its check; with restore, the state must also
// survive a snapshot and a restore.
func runApplyCases(t *testing.T, cases []applyCase, restore bool) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.NewState()
			runSteps(t, s, tc.steps)
			locksAre(tc.locks...)(t, s)
			if tc.check != nil {
				tc.check(t, s)
			}
			if restore {
				mustRestore(t, s)
			}
		})
	}
}

func runSteps(t *testing.T, s *fsm.State, steps []applyStep) {
	t.Helper()
	for i, st := range steps {
		before := snapshotBytes(t, s)
		got := s.Apply(st.cmd)
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("step %d %v: invariant broken: %v", i, st.cmd, err)
		}
		if !sameResult(got, st.want) {
			t.Fatalf("step %d %v:\n got %s\nwant %s", i, st.cmd, describe(got), describe(st.want))
		}
		if st.errMsg != "" && (got.Err == nil || got.Err.Error() != st.errMsg) {
			t.Fatalf("step %d %v: error %v, want the message %q", i, st.cmd, got.Err, st.errMsg)
		}
		if got.Err != nil && !bytes.Equal(before, snapshotBytes(t, s)) {
			t.Fatalf("step %d %v failed with %v but changed the state", i, st.cmd, got.Err)
		}
		if st.after != nil {
			st.after(t, s)
		}
	}
}

// TestApply runs every case's script on a fresh State and checks each
// step's exact Result, the invariants after it, and the final locks.
func TestApply(t *testing.T) {
	const sec = time.Second
	cases := []applyCase{
		{
			name: "create session ids increase and are never reused",
			steps: []applyStep{
				{cmd: createSession(5*sec, "alice", 0), want: sessionMade(1)},
				{cmd: newSession(), want: sessionMade(2)},
				{cmd: newSession(), want: sessionMade(3)},
				{cmd: closeSession(2), want: ended(fsm.Closed, 2)},
				{cmd: newSession(), want: sessionMade(4)},
			},
			check: func(t *testing.T, s *fsm.State) {
				// Created without a secret's hash, as older versions logged.
				want := []fsm.SessionInfo{{ID: 1, TTL: 5 * sec, Owner: "alice", Legacy: true}, {ID: 3, TTL: 10 * sec, Owner: "test", Legacy: true}, {ID: 4, TTL: 10 * sec, Owner: "test", Legacy: true}}
				if got := s.Sessions(); !reflect.DeepEqual(got, want) {
					t.Fatalf("Sessions() = %+v, want %+v", got, want)
				}
				if _, ok := s.Session(2); ok {
					t.Fatal("closed session 2 still exists")
				}
			},
		},
		{
			name: "create session beyond max_sessions fails with ErrLimit",
			steps: []applyStep{
				{cmd: createSession(sec, "", 2), want: sessionMade(1)},
				{cmd: createSession(sec, "", 2), want: sessionMade(2)},
				{cmd: createSession(sec, "", 2), want: fails(fence.ErrLimit)},
				{cmd: createSession(sec, "", 3), want: sessionMade(3)},
				{cmd: createSession(sec, "", 3), want: fails(fence.ErrLimit)},
				{cmd: expireSessions(1), want: ended(fsm.Expired, 1)},
				{cmd: createSession(sec, "", 3), want: sessionMade(4)},
				{cmd: createSession(sec, "", 0), want: sessionMade(5)},
			},
			check: func(t *testing.T, s *fsm.State) {
				if n := s.NumSessions(); n != 4 {
					t.Fatalf("NumSessions() = %d, want 4", n)
				}
			},
		},
		{
			name: "acquire grants a free lock with the next token of one counter for all locks",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "b", excl), want: granted(2, "b", 2, excl)},
				{cmd: acquire(1, "c", shared), want: granted(1, "c", 3, shared)},
			}),
			locks: []fsm.LockInfo{
				{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}},
				{Name: "b", Holders: []fsm.HolderInfo{holding(2, 2, excl)}},
				{Name: "c", Holders: []fsm.HolderInfo{holding(1, 3, shared)}},
			},
			check: lastTokenIs(3),
		},
		{
			name: "acquire of a held lock queues in arrival order",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(3, "a", shared), want: queued()},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl), waiting(3, shared)}}},
			check: lastTokenIs(1),
		},
		{
			name: "acquire is idempotent for a holder (same token) and a waiter; another mode is rejected",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(1, "a", excl), want: alreadyHeld(1, "a", 1, excl)},
				{cmd: acquire(1, "a", excl, try, withDelay(sec)), want: alreadyHeld(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(1, "a", shared), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(2, "a", shared), want: fails(fence.ErrInvalidArgument)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl)}}},
			check: lastTokenIs(1),
		},
		{
			name: "try acquire of a held lock fails with ErrLocked and queues nothing",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, try), want: fails(fence.ErrLocked)},
				{cmd: acquire(2, "a", shared, try), want: fails(fence.ErrLocked)},
				{cmd: acquire(3, "b", shared), want: granted(3, "b", 2, shared)},
				{cmd: acquire(2, "b", excl, try), want: fails(fence.ErrLocked)},
				{cmd: acquire(2, "b", shared, try), want: granted(2, "b", 3, shared)},
			}),
			locks: []fsm.LockInfo{
				{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}},
				{Name: "b", Holders: []fsm.HolderInfo{holding(3, 2, shared), holding(2, 3, shared)}},
			},
		},
		{
			name: "commands for an unknown or ended session fail with ErrSessionNotFound",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(7, "a", excl), want: fails(fence.ErrSessionNotFound)},
				{cmd: acquire(0, "a", excl), want: fails(fence.ErrSessionNotFound)},
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: closeSession(1), want: ended(fsm.Closed, 1)},
				{cmd: acquire(1, "a", excl), want: fails(fence.ErrSessionNotFound)},
				{cmd: release(1, "a", 1), want: fails(fence.ErrSessionNotFound)},
				{cmd: cancelWait(1, "a"), want: fails(fence.ErrSessionNotFound)},
				{cmd: closeSession(1), want: fsm.Result{}},
				{cmd: expireSessions(1), want: fsm.Result{}},
			}),
			check: lastTokenIs(1),
		},
		{
			name: "acquire with an unknown mode fails with ErrInvalidArgument",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(1, "a", fsm.Mode(0)), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(1, "a", fsm.Mode(3)), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(1, "a", fsm.Mode(1<<31), try), want: fails(fence.ErrInvalidArgument)},
			}),
			check: lastTokenIs(0),
		},
		{
			name: "acquire beyond max_waiters fails with ErrLimit; a re-acquire by a waiter does not count",
			steps: script(sessions(4), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, maxWaiters(1)), want: queued()},
				{cmd: acquire(3, "a", excl, maxWaiters(1)), want: fails(fence.ErrLimit)},
				{cmd: acquire(2, "a", excl, maxWaiters(1)), want: queued()},
				{cmd: acquire(3, "a", shared, maxWaiters(2)), want: queued()},
				{cmd: acquire(4, "a", excl, maxWaiters(2)), want: fails(fence.ErrLimit)},
				{cmd: acquire(4, "a", excl), want: queued()},
				{cmd: acquire(1, "b", excl, maxWaiters(1)), want: granted(1, "b", 2, excl)},
			}),
			locks: []fsm.LockInfo{
				{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl), waiting(3, shared), waiting(4, excl)}},
				{Name: "b", Holders: []fsm.HolderInfo{holding(1, 2, excl)}},
			},
		},
		{
			name: "release by the holder hands the lock to the next waiter in the same command",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: release(1, "a", 1), want: handedTo(grant(2, "a", 2, excl)), after: locksAre(
					fsm.LockInfo{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}, Waiters: []fsm.WaiterInfo{waiting(3, excl)}})},
				{cmd: release(2, "a", 2), want: handedTo(grant(3, "a", 3, excl))},
				{cmd: release(3, "a", 3), want: fsm.Result{}},
			}),
			check: lastTokenIs(3),
		},
		{
			name: "release with a wrong token or by a non-holder fails with ErrNotHolder",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: release(1, "a", 2), want: fails(fence.ErrNotHolder)},
				{cmd: release(1, "a", 0), want: fails(fence.ErrNotHolder)},
				{cmd: release(2, "a", 1), want: fails(fence.ErrNotHolder)},
				{cmd: release(3, "a", 1), want: fails(fence.ErrNotHolder)},
				{cmd: release(1, "b", 1), want: fails(fence.ErrNotHolder)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl)}}},
		},
		{
			name: "a token from an earlier grant no longer releases the lock",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: release(1, "a", 1), want: fsm.Result{}},
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 2, excl)},
				{cmd: release(1, "a", 1), want: fails(fence.ErrNotHolder)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 2, excl)}}},
		},
		{
			name: "cancel wait removes a waiter, is a no-op otherwise, and returns a grant already made",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: cancelWait(2, "a"), want: dequeued(), after: locksAre(
					fsm.LockInfo{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(3, excl)}})},
				{cmd: cancelWait(2, "a"), want: fsm.Result{}},
				{cmd: cancelWait(3, "nosuch"), want: fsm.Result{}},
				{cmd: release(1, "a", 1), want: handedTo(grant(3, "a", 2, excl))},
				{cmd: cancelWait(3, "a"), want: grantedBefore(3, "a", 2, excl)},
			}),
			// Cancelling a wait that was granted does not release the lock.
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 2, excl)}}},
		},
		{
			name: "close session releases everything it holds, hands on, and drops its waits",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(1, "b", shared), want: granted(1, "b", 2, shared)},
				{cmd: acquire(2, "c", excl), want: granted(2, "c", 3, excl)},
				{cmd: acquire(1, "c", excl), want: queued()},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: acquire(3, "b", excl), want: queued()},
				{cmd: closeSession(1), want: withGrants(ended(fsm.Closed, 1), grant(2, "a", 4, excl), grant(3, "b", 5, excl))},
				{cmd: closeSession(1), want: fsm.Result{}},
				{cmd: acquire(1, "d", excl), want: fails(fence.ErrSessionNotFound)},
			}),
			locks: []fsm.LockInfo{
				{Name: "a", Holders: []fsm.HolderInfo{holding(2, 4, excl)}},
				{Name: "b", Holders: []fsm.HolderInfo{holding(3, 5, excl)}},
				{Name: "c", Holders: []fsm.HolderInfo{holding(2, 3, excl)}},
			},
		},
		{
			name: "expire with lock-delay holds the lock back until LiftDelay",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl, withDelay(5*sec)), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: expireSessions(1), want: withDelays(ended(fsm.Expired, 1), fsm.Delay{Lock: "a", Delay: 5 * sec, ID: 1}), after: locksAre(
					fsm.LockInfo{Name: "a", Waiters: []fsm.WaiterInfo{waiting(2, excl)}, Delay: 5 * sec, Delays: []fsm.Delay{{Lock: "a", Delay: 5 * sec, ID: 1}}})},
				{cmd: acquire(3, "a", shared, try), want: fails(fence.ErrLocked)},
				{cmd: acquire(3, "a", shared), want: queued()},
				{cmd: release(2, "a", 0), want: fails(fence.ErrNotHolder)},
				{cmd: liftDelay("b"), want: fsm.Result{}},
				{cmd: liftDelay("a"), want: handedTo(grant(2, "a", 2, excl))},
				{cmd: liftDelay("a"), want: fsm.Result{}},
				{cmd: release(2, "a", 2), want: handedTo(grant(3, "a", 3, shared))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 3, shared)}}},
		},
		{
			name: "a delayed lock nobody waits for is kept until LiftDelay, then forgotten",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl, withDelay(sec)), want: granted(1, "a", 1, excl)},
				{cmd: expireSessions(1), want: withDelays(ended(fsm.Expired, 1), fsm.Delay{Lock: "a", Delay: sec, ID: 1}), after: func(t *testing.T, s *fsm.State) {
					if got, want := s.DelayedLocks(), []fsm.Delay{{Lock: "a", Delay: sec, ID: 1}}; !reflect.DeepEqual(got, want) {
						t.Fatalf("DelayedLocks() = %+v, want %+v", got, want)
					}
				}},
				{cmd: acquire(2, "a", excl, try), want: fails(fence.ErrLocked)},
				{cmd: liftDelay("a"), want: fsm.Result{}, after: locksAre()},
				{cmd: acquire(2, "a", excl, try), want: granted(2, "a", 2, excl)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
		{
			name: "close, unlike expiry, does not delay",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl, withDelay(5*sec)), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: closeSession(1), want: withGrants(ended(fsm.Closed, 1), grant(2, "a", 2, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
		{
			name: "release, unlike expiry, does not delay",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl, withDelay(5*sec)), want: granted(1, "a", 1, excl)},
				{cmd: release(1, "a", 1), want: fsm.Result{}},
				{cmd: acquire(2, "a", excl, try), want: granted(2, "a", 2, excl)},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
		{
			name: "expire without lock-delay hands the lock on at once",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl), want: queued()},
				{cmd: expireSessions(1), want: withGrants(ended(fsm.Expired, 1), grant(2, "a", 2, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
		{
			name: "expire skips unknown and repeated ids",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: expireSessions(9, 1, 1, 0), want: ended(fsm.Expired, 1)},
			}),
			check: func(t *testing.T, s *fsm.State) {
				if got := s.Sessions(); len(got) != 1 || got[0].ID != 2 {
					t.Fatalf("Sessions() = %+v, want only session 2", got)
				}
			},
		},
		{
			// docs/design.md: "a waiter whose own session expires is told so at
			// once and is never granted", also when the holder ahead of it
			// expires in the same command.
			name: "expiring a holder and its next waiter together never grants to the waiter",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, withDelay(5*sec)), want: queued()},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: expireSessions(1, 2), want: withGrants(ended(fsm.Expired, 1, 2), grant(3, "a", 2, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 2, excl)}}},
		},
		{
			name: "expiring a waiter and the holder ahead of it, waiter first, grants the next one",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", excl, withDelay(5*sec)), want: queued()},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: expireSessions(2, 1), want: withGrants(ended(fsm.Expired, 2, 1), grant(3, "a", 2, excl))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(3, 2, excl)}}},
		},
		{
			name: "shared holders share; an exclusive waiter blocks later shared requests (FIFO)",
			steps: script(sessions(5), []applyStep{
				{cmd: acquire(1, "a", shared), want: granted(1, "a", 1, shared)},
				{cmd: acquire(2, "a", shared), want: granted(2, "a", 2, shared)},
				{cmd: acquire(3, "a", excl), want: queued()},
				{cmd: acquire(4, "a", shared), want: queued(), after: locksAre(fsm.LockInfo{
					Name:    "a",
					Holders: []fsm.HolderInfo{holding(1, 1, shared), holding(2, 2, shared)},
					Waiters: []fsm.WaiterInfo{waiting(3, excl), waiting(4, shared)},
				})},
				{cmd: acquire(5, "a", shared, try), want: fails(fence.ErrLocked)},
				{cmd: release(1, "a", 1), want: fsm.Result{}},
				{cmd: release(2, "a", 2), want: handedTo(grant(3, "a", 3, excl))},
				{cmd: release(3, "a", 3), want: handedTo(grant(4, "a", 4, shared))},
			}),
			locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(4, 4, shared)}}},
		},
		{
			name: "releasing an exclusive holder grants the run of shared waiters up to the next exclusive one",
			steps: script(sessions(5), []applyStep{
				{cmd: acquire(1, "a", excl), want: granted(1, "a", 1, excl)},
				{cmd: acquire(2, "a", shared), want: queued()},
				{cmd: acquire(3, "a", shared), want: queued()},
				{cmd: acquire(4, "a", excl), want: queued()},
				{cmd: acquire(5, "a", shared), want: queued()},
				{cmd: release(1, "a", 1), want: handedTo(grant(2, "a", 2, shared), grant(3, "a", 3, shared))},
			}),
			locks: []fsm.LockInfo{{
				Name:    "a",
				Holders: []fsm.HolderInfo{holding(2, 2, shared), holding(3, 3, shared)},
				Waiters: []fsm.WaiterInfo{waiting(4, excl), waiting(5, shared)},
			}},
		},
		sharedBehindExclusive("cancelling the exclusive waiter at the head lets the shared waiters behind it in",
			cancelWait(2, "a"), dequeued()),
		sharedBehindExclusive("closing the session of the exclusive waiter at the head lets the shared waiters behind it in",
			closeSession(2), ended(fsm.Closed, 2)),
		sharedBehindExclusive("expiring the session of the exclusive waiter at the head lets the shared waiters behind it in",
			expireSessions(2), ended(fsm.Expired, 2)),
		{
			name: "a command with no operation fails with ErrInvalidArgument",
			steps: script(sessions(1), []applyStep{
				{cmd: &fsmpb.Command{}, want: fails(fence.ErrInvalidArgument)},
				{cmd: nil, want: fails(fence.ErrInvalidArgument)},
			}),
		},
	}
	runApplyCases(t, cases, false)
}

// sharedBehindExclusive builds a case where shared holder 1 is followed in
// the queue by exclusive waiter 2, shared waiters 3 and 4, and exclusive
// waiter 5; ending 2's wait with cmd must let 3 and 4 in at once, and not 5.
func sharedBehindExclusive(name string, cmd *fsmpb.Command, want fsm.Result) applyCase {
	want.Effects.Grants = []fsm.Grant{grant(3, "a", 2, shared), grant(4, "a", 3, shared)}
	return applyCase{
		name: name,
		steps: script(sessions(5), []applyStep{
			{cmd: acquire(1, "a", shared), want: granted(1, "a", 1, shared)},
			{cmd: acquire(2, "a", excl), want: queued()},
			{cmd: acquire(3, "a", shared), want: queued()},
			{cmd: acquire(4, "a", shared), want: queued()},
			{cmd: acquire(5, "a", excl), want: queued()},
			{cmd: cmd, want: want},
		}),
		locks: []fsm.LockInfo{{
			Name:    "a",
			Holders: []fsm.HolderInfo{holding(1, 1, shared), holding(3, 2, shared), holding(4, 3, shared)},
			Waiters: []fsm.WaiterInfo{waiting(5, excl)},
		}},
	}
}

// A group is named once: the first SetClusterID stays, and a bad one is
// refused without a change.
func TestClusterIDIsSetOnce(t *testing.T) {
	s := fsm.NewState()
	if s.ClusterID() != "" {
		t.Fatalf("a new state's cluster id is %q, want none", s.ClusterID())
	}
	for _, id := range []string{"", strings.Repeat("x", fsm.MaxClusterIDLen+1)} {
		if res := s.Apply(setClusterID(id)); !errors.Is(res.Err, fence.ErrInvalidArgument) || s.ClusterID() != "" {
			t.Errorf("SetClusterID(%.10q...): %v, id now %q; want ErrInvalidArgument and no id", id, res.Err, s.ClusterID())
		}
	}
	for _, id := range []string{"first", "second"} {
		if res := s.Apply(setClusterID(id)); res.Err != nil {
			t.Fatalf("SetClusterID(%q): %v", id, res.Err)
		}
	}
	if s.ClusterID() != "first" {
		t.Errorf("cluster id %q after naming it first then second, want first", s.ClusterID())
	}
}
