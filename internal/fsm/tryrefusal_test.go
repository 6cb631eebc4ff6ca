package fsm_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// TryRefusal answers what an exclusive try of a new session would get, in
// every state a lock can be in, without changing the state: the edge
// refuses a Lease with it before creating the lease's session.
func TestTryRefusalAgreesWithTry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  []*fsmpb.Command // sessions 1 and 2 exist
		want   error            // nil, fence.ErrLocked or fence.ErrInvalidArgument
		holder uint64           // the holder the LockedError names
	}{
		{name: "free", want: nil},
		{name: "held", setup: []*fsmpb.Command{acquire(1, "l", excl)}, want: fence.ErrLocked, holder: 1},
		{name: "held shared", setup: []*fsmpb.Command{acquire(1, "l", shared)}, want: fence.ErrLocked, holder: 1},
		{name: "released", setup: []*fsmpb.Command{acquire(1, "l", excl), release(1, "l", 1)}, want: nil},
		{name: "waited for", setup: []*fsmpb.Command{acquire(1, "l", excl), acquire(2, "l", excl)}, want: fence.ErrLocked, holder: 1},
		{name: "delayed", setup: []*fsmpb.Command{acquire(1, "l", excl, withDelay(time.Second)), expireSessions(1)}, want: fence.ErrLocked},
		{name: "delay lifted", setup: []*fsmpb.Command{acquire(1, "l", excl, withDelay(time.Second)), expireSessions(1), liftDelay("l")}, want: nil},
		{name: "a semaphore", setup: []*fsmpb.Command{acquire(1, "l", sem, permits(3))}, want: fence.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.NewState()
			for _, cmd := range append([]*fsmpb.Command{newSession(), newSession(), newSession()}, tc.setup...) {
				if res := mustApply(t, s, cmd); res.Err != nil {
					t.Fatalf("setup %v: %v", cmd, res.Err)
				}
			}
			before := s.Snapshot()
			got := s.TryRefusal("l")
			if !errorIs(got, tc.want) {
				t.Fatalf("TryRefusal = %v, want %v", got, tc.want)
			}
			var locked *fence.LockedError
			if errors.As(got, &locked) && locked.HolderSession != tc.holder {
				t.Errorf("TryRefusal names holder %d, want %d", locked.HolderSession, tc.holder)
			}
			if after := s.Snapshot(); after.String() != before.String() {
				t.Errorf("TryRefusal changed the state")
			}
			// What a try of session 3 gets is the same.
			res := s.Apply(acquire(3, "l", excl, try))
			if !errorIs(res.Err, tc.want) || (got != nil && res.Err.Error() != got.Error()) {
				t.Errorf("a try of a new session failed with %v, TryRefusal said %v", res.Err, got)
			}
		})
	}
}

// errorIs is errors.Is that also holds for two nil errors.
func errorIs(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}
