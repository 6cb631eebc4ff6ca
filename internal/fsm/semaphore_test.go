package fsm_test

import (
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// TestSemaphore runs the semaphore's scripts: up to N holders, each with a
// token of its own; FIFO waiters granted in the releasing command as permits
// free up; one number of permits per name while the name is in use; and
// lock-delay holding back every permit.
func TestSemaphore(t *testing.T) {
	cases := []applyCase{
		{
			name: "N holders at once, then FIFO waiters as permits free up",
			steps: script(sessions(5), []applyStep{
				{cmd: acquire(1, "s", sem, permits(2)), want: granted(1, "s", 1, sem)},
				{cmd: acquire(2, "s", sem, permits(2)), want: granted(2, "s", 2, sem)},
				{cmd: acquire(3, "s", sem, permits(2)), want: queued()},
				{cmd: acquire(4, "s", sem, permits(2)), want: queued()},
				{cmd: acquire(5, "s", sem, permits(2), try), want: fails(fence.ErrLocked), errMsg: `fence: lock is held: semaphore "s" has all 2 permits taken`},
				{cmd: acquire(2, "s", sem, permits(2)), want: alreadyHeld(2, "s", 2, sem)},
				{cmd: release(1, "s", 1), want: handedTo(grant(3, "s", 3, sem))},
				{cmd: closeSession(2), want: withGrants(ended(fsm.Closed, 2), grant(4, "s", 4, sem))},
				{cmd: acquire(5, "s", sem, permits(2)), want: queued(), after: locksAre(fsm.LockInfo{
					Name: "s", Permits: 2,
					Holders: []fsm.HolderInfo{holding(3, 3, sem), holding(4, 4, sem)},
					Waiters: []fsm.WaiterInfo{waiting(5, sem)},
				})},
				{cmd: cancelWait(5, "s"), want: dequeued()},
				{cmd: release(3, "s", 3), want: fsm.Result{}},
				{cmd: release(4, "s", 4), want: fsm.Result{}},
			}),
			// Once idle the name is forgotten, and may become a lock.
			check: func(t *testing.T, s *fsm.State) {
				runSteps(t, s, []applyStep{{cmd: acquire(5, "s", excl), want: granted(5, "s", 5, excl)}})
			},
		},
		{
			name: "a name in use is one kind, with one number of permits",
			steps: script(sessions(3), []applyStep{
				{cmd: acquire(1, "s", sem, permits(3)), want: granted(1, "s", 1, sem)},
				{cmd: acquire(2, "s", sem, permits(4)), want: fails(fence.ErrInvalidArgument),
					errMsg: `fence: invalid argument: semaphore "s" has 3 permits, not 4; every holder must name the same number`},
				{cmd: acquire(2, "s", excl), want: fails(fence.ErrInvalidArgument),
					errMsg: `fence: invalid argument: "s" is in use as a semaphore of 3 permits, not a lock`},
				{cmd: acquire(2, "s", shared, try), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(2, "l", excl), want: granted(2, "l", 2, excl)},
				{cmd: acquire(3, "l", sem, permits(2)), want: fails(fence.ErrInvalidArgument),
					errMsg: `fence: invalid argument: "l" is in use as a lock, not a semaphore`},
				{cmd: acquire(3, "x", sem), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(3, "x", excl, permits(2)), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(3, "x", shared, permits(1)), want: fails(fence.ErrInvalidArgument)},
			}),
			locks: []fsm.LockInfo{
				{Name: "l", Holders: []fsm.HolderInfo{holding(2, 2, excl)}},
				{Name: "s", Permits: 3, Holders: []fsm.HolderInfo{holding(1, 1, sem)}},
			},
		},
		{
			name: "a permit holder's expiry with lock-delay holds back every permit until lifted",
			steps: script(sessions(4), []applyStep{
				{cmd: acquire(1, "s", sem, permits(2), withDelay(time.Second)), want: granted(1, "s", 1, sem)},
				{cmd: acquire(2, "s", sem, permits(2)), want: granted(2, "s", 2, sem)},
				{cmd: acquire(3, "s", sem, permits(2)), want: queued()},
				{cmd: acquire(4, "s", sem, permits(2)), want: queued()},
				{cmd: expireSessions(1), want: withDelays(ended(fsm.Expired, 1), fsm.Delay{Lock: "s", Delay: time.Second, ID: 1})},
				{cmd: release(2, "s", 2), want: fsm.Result{}},
				{cmd: liftDelay("s"), want: handedTo(grant(3, "s", 3, sem), grant(4, "s", 4, sem))},
			}),
			locks: []fsm.LockInfo{{Name: "s", Permits: 2, Holders: []fsm.HolderInfo{holding(3, 3, sem), holding(4, 4, sem)}}},
		},
		{
			name: "a semaphore of one permit is a mutex",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "s", sem, permits(1)), want: granted(1, "s", 1, sem)},
				{cmd: acquire(2, "s", sem, permits(1), try), want: fails(fence.ErrLocked)},
				{cmd: acquire(2, "s", sem, permits(1)), want: queued()},
				{cmd: release(1, "s", 1), want: handedTo(grant(2, "s", 2, sem))},
			}),
			locks: []fsm.LockInfo{{Name: "s", Permits: 1, Holders: []fsm.HolderInfo{holding(2, 2, sem)}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.NewState()
			runSteps(t, s, tc.steps)
			if tc.check != nil {
				tc.check(t, s)
				return
			}
			locksAre(tc.locks...)(t, s)
		})
	}
}

// A snapshot keeps a semaphore's permits, holders and waiters; Restore
// refuses one whose semaphore has more holders than permits, or a lock
// with a holder in semaphore mode.
func TestSemaphoreSnapshot(t *testing.T) {
	s := fsm.NewState()
	runSteps(t, s, script(sessions(3), []applyStep{
		{cmd: acquire(1, "s", sem, permits(2)), want: granted(1, "s", 1, sem)},
		{cmd: acquire(2, "s", sem, permits(2)), want: granted(2, "s", 2, sem)},
		{cmd: acquire(3, "s", sem, permits(2)), want: queued()},
	}))
	r := mustRestore(t, s)
	runSteps(t, r, []applyStep{
		{cmd: acquire(3, "s", sem, permits(3)), want: fails(fence.ErrInvalidArgument)},
		{cmd: release(1, "s", 1), want: handedTo(grant(3, "s", 3, sem))},
	})

	bad := []*fsmpb.Snapshot{
		{LastToken: 2, LastSessionId: 2, Sessions: []*fsmpb.Session{{Id: 1}, {Id: 2}}, Locks: []*fsmpb.Lock{{
			Name: "s", Permits: 1,
			Holders: []*fsmpb.Holder{{SessionId: 1, Token: 1, Mode: uint32(sem)}, {SessionId: 2, Token: 2, Mode: uint32(sem)}},
		}}},
		{LastToken: 1, LastSessionId: 1, Sessions: []*fsmpb.Session{{Id: 1}}, Locks: []*fsmpb.Lock{{
			Name: "l", Holders: []*fsmpb.Holder{{SessionId: 1, Token: 1, Mode: uint32(sem)}},
		}}},
		{LastToken: 1, LastSessionId: 1, Sessions: []*fsmpb.Session{{Id: 1}}, Locks: []*fsmpb.Lock{{
			Name: "s", Permits: 2, Holders: []*fsmpb.Holder{{SessionId: 1, Token: 1, Mode: uint32(excl)}},
		}}},
	}
	for i, snap := range bad {
		if _, err := fsm.Restore(snap); err == nil {
			t.Errorf("bad snapshot %d was restored: %v", i, snap)
		}
	}
}
