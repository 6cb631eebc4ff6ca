package fsm_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func maxLocks(n uint64) acquireOpt        { return func(a *fsmpb.Acquire) { a.MaxLocks = n } }
func maxSessionLocks(n uint64) acquireOpt { return func(a *fsmpb.Acquire) { a.MaxSessionLocks = n } }

// An acquire beyond the limit on all locks, or on one session's, fails
// with ErrLimit and changes nothing; one on a name the session holds, or
// already counted, passes.
func TestLockLimits(t *testing.T) {
	s := fsm.NewState()
	a := mustApply(t, s, createSession(time.Minute, "a", 0)).CreateSession().SessionID
	b := mustApply(t, s, createSession(time.Minute, "b", 0)).CreateSession().SessionID

	mustApply(t, s, acquire(a, "x", excl, maxSessionLocks(2), maxLocks(3)))
	mustApply(t, s, acquire(a, "y", excl, maxSessionLocks(2), maxLocks(3)))
	if err := mustApply(t, s, acquire(a, "z", excl, maxSessionLocks(2), maxLocks(3))).Err; !errors.Is(err, fence.ErrLimit) {
		t.Fatalf("a third lock of a session limited to 2: %v, want ErrLimit", err)
	}
	if err := mustApply(t, s, acquire(a, "x", excl, maxSessionLocks(2), maxLocks(3))).Err; err != nil {
		t.Fatalf("acquiring a lock the session holds again: %v", err)
	}
	// b queues for x: x is counted already, b has room.
	if res := mustApply(t, s, acquire(b, "x", excl, maxSessionLocks(2), maxLocks(2))); res.Err != nil || !res.Acquire().Queued {
		t.Fatalf("queueing for an existing lock at the limit on all locks: %+v", res)
	}
	if err := mustApply(t, s, acquire(b, "w", excl, maxSessionLocks(2), maxLocks(2))).Err; !errors.Is(err, fence.ErrLimit) {
		t.Fatalf("a new lock beyond the limit on all locks: %v, want ErrLimit", err)
	}
	if n := s.NumLocks(); n != 2 {
		t.Fatalf("%d locks after refused acquires, want 2", n)
	}
}
