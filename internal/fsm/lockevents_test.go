package fsm_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Shorthands for the expected events: sessions are owned "test"
// (newSession).
func evGranted(sess uint64, lock string, token uint64, mode fsm.Mode) fsm.LockEvent {
	return fsm.LockEvent{Kind: fsm.LockGranted, Lock: lock, Session: sess, Owner: "test", Token: token, Mode: mode}
}

func evHolderEnd(kind fsm.LockEventKind, how fsm.End, sess uint64, lock string, token uint64) fsm.LockEvent {
	return fsm.LockEvent{Kind: kind, Lock: lock, Session: sess, Owner: "test", Token: token, Mode: excl, End: how}
}

func evQueued(sess uint64, lock string) fsm.LockEvent {
	return fsm.LockEvent{Kind: fsm.LockQueued, Lock: lock, Session: sess, Owner: "test", Mode: excl}
}

func evGaveUp(why fsm.GiveUp, how fsm.End, sess uint64, lock string) fsm.LockEvent {
	return fsm.LockEvent{Kind: fsm.LockGaveUp, Lock: lock, Session: sess, Owner: "test", Mode: excl, GaveUp: why, End: how}
}

func timedOut(sess uint64, lock string) *fsmpb.Command {
	cmd := cancelWait(sess, lock)
	cmd.GetCancelWait().TimedOut = true
	return cmd
}

// Every command lists the changes it made to locks, in the order it made
// them: a release before the hand-off it causes, a session's waits and
// grants (each grant's lock-delay after it) before the hand-offs of its
// end. A command that changes no lock, or fails, lists none.
func TestLockEvents(t *testing.T) {
	const sec = time.Second
	held := []*fsmpb.Command{
		newSession(), newSession(), newSession(),
		acquire(1, "a", excl, withDelay(5*sec)), // token 1
		acquire(2, "a", excl),                   // queued
		acquire(3, "b", excl),                   // token 2
	}
	cases := []struct {
		name  string
		setup []*fsmpb.Command
		cmd   *fsmpb.Command
		want  []fsm.LockEvent
	}{
		{"a grant", []*fsmpb.Command{newSession()}, acquire(1, "a", excl), []fsm.LockEvent{evGranted(1, "a", 1, excl)}},
		{"a wait", held, acquire(3, "a", excl), []fsm.LockEvent{evQueued(3, "a")}},
		{"asking again for a held lock", held, acquire(1, "a", excl), nil},
		{"a release hands on", held, release(1, "a", 1), []fsm.LockEvent{
			evHolderEnd(fsm.LockReleased, 0, 1, "a", 1), evGranted(2, "a", 3, excl)}},
		{"a cancelled wait", held, cancelWait(2, "a"), []fsm.LockEvent{evGaveUp(fsm.GaveUpCancelled, 0, 2, "a")}},
		{"a timed-out wait", held, timedOut(2, "a"), []fsm.LockEvent{evGaveUp(fsm.GaveUpTimedOut, 0, 2, "a")}},
		{"a cancelled acquire's wait", []*fsmpb.Command{newSession(), newSession(), acquire(1, "a", excl), acquire(2, "a", excl, withRequest(7))},
			cancelAcquire(2, "a", 7, 0), []fsm.LockEvent{evGaveUp(fsm.GaveUpCancelled, 0, 2, "a")}},
		{"a cancelled acquire's grant", []*fsmpb.Command{newSession(), acquire(1, "a", excl, withRequest(7))},
			cancelAcquire(1, "a", 7, 0), []fsm.LockEvent{evHolderEnd(fsm.LockReleased, 0, 1, "a", 1)}},
		{"a close releases, with no lock-delay", held, closeSession(1), []fsm.LockEvent{
			evHolderEnd(fsm.LockReleased, fsm.Closed, 1, "a", 1), evGranted(2, "a", 3, excl)}},
		{"an expiry starts the holder's lock-delay", held, expireSessions(1), []fsm.LockEvent{
			evHolderEnd(fsm.LockExpired, fsm.Expired, 1, "a", 1),
			{Kind: fsm.LockDelayStarted, Lock: "a", Session: 1, Owner: "test", Token: 1, Mode: excl, End: fsm.Expired, Delay: 5 * sec, DelayID: 1}}},
		{"a revoke", held, closeSessionAs(3, fsmpb.SessionEnd_SESSION_END_REVOKED), []fsm.LockEvent{
			evHolderEnd(fsm.LockRevoked, fsm.Revoked, 3, "b", 2)}},
		{"an abandonment", held, closeSessionAs(3, fsmpb.SessionEnd_SESSION_END_ABANDONED), []fsm.LockEvent{
			evHolderEnd(fsm.LockAbandoned, fsm.Abandoned, 3, "b", 2)}},
		{"a waiter's session ends", held, expireSessions(2), []fsm.LockEvent{evGaveUp(fsm.GaveUpSessionEnded, fsm.Expired, 2, "a")}},
		{"sessions end together: each one's waits, grants, then the hand-offs", append(slices.Clone(held), acquire(2, "c", excl), acquire(1, "c", excl)),
			expireSessions(2, 1), []fsm.LockEvent{
				evGaveUp(fsm.GaveUpSessionEnded, fsm.Expired, 2, "a"),
				evHolderEnd(fsm.LockExpired, fsm.Expired, 2, "c", 3),
				evGaveUp(fsm.GaveUpSessionEnded, fsm.Expired, 1, "c"),
				evHolderEnd(fsm.LockExpired, fsm.Expired, 1, "a", 1),
				{Kind: fsm.LockDelayStarted, Lock: "a", Session: 1, Owner: "test", Token: 1, Mode: excl, End: fsm.Expired, Delay: 5 * sec, DelayID: 1},
			}},
		{"a lifted delay hands on", append(slices.Clone(held), expireSessions(1)), liftDelayID("a", 1), []fsm.LockEvent{
			{Kind: fsm.LockDelayEnded, Lock: "a", DelayID: 1}, evGranted(2, "a", 3, excl)}},
		{"a delay lifted as older versions logged it", append(slices.Clone(held), expireSessions(1)), liftDelay("a"), []fsm.LockEvent{
			{Kind: fsm.LockDelayEnded, Lock: "a", DelayID: 1}, evGranted(2, "a", 3, excl)}},
		{"a semaphore's events carry its permits", []*fsmpb.Command{newSession()}, acquire(1, "s", fsm.Semaphore, permits(3)), []fsm.LockEvent{
			{Kind: fsm.LockGranted, Lock: "s", Session: 1, Owner: "test", Token: 1, Mode: fsm.Semaphore, Permits: 3}}},
		{"a KV write", held, kvPut("k", "v"), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fsm.NewState()
			for _, cmd := range c.setup {
				mustApply(t, s, cmd)
			}
			res := mustApply(t, s, c.cmd)
			if res.Err != nil {
				t.Fatalf("%v: %v", c.cmd, res.Err)
			}
			if !reflect.DeepEqual(res.Effects.LockEvents, c.want) {
				t.Fatalf("%v: events\n%s\nwant\n%s", c.cmd, describeLockEvents(res.Effects.LockEvents), describeLockEvents(c.want))
			}
		})
	}
}

// A command that fails lists no event, and a Batch lists each command's
// events in its own result, none of its own.
func TestLockEventsOfFailuresAndBatches(t *testing.T) {
	s := fsm.NewState()
	mustApply(t, s, newSession())
	mustApply(t, s, newSession())
	mustApply(t, s, acquire(1, "a", excl))
	if res := mustApply(t, s, release(1, "a", 99)); res.Err == nil || res.Effects.LockEvents != nil {
		t.Fatalf("a release with a wrong token: %v, events %v", res.Err, res.Effects.LockEvents)
	}
	res := mustApply(t, s, &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{
		acquire(2, "a", excl), release(1, "a", 1), release(1, "a", 1),
	}}}})
	if res.Effects.LockEvents != nil || len(res.Batch()) != 3 {
		t.Fatalf("batch answered events %v and %d results", res.Effects.LockEvents, len(res.Batch()))
	}
	want := [][]fsm.LockEvent{
		{evQueued(2, "a")},
		{evHolderEnd(fsm.LockReleased, 0, 1, "a", 1), evGranted(2, "a", 2, excl)},
		nil, // session 1 no longer holds a
	}
	for i, r := range res.Batch() {
		if !reflect.DeepEqual(r.Effects.LockEvents, want[i]) {
			t.Errorf("command %d of the batch: events %s, want %s", i, describeLockEvents(r.Effects.LockEvents), describeLockEvents(want[i]))
		}
	}
}

// lockMirror is the locks' holders, waiters and lock-delays as a watcher
// rebuilds them from the lock events alone.
type lockMirror map[string]*fsm.LockInfo

// apply plays one result's events (a Batch's commands' in order).
func (m lockMirror) apply(res fsm.Result) error {
	for _, sub := range res.Batch() {
		if err := m.apply(sub); err != nil {
			return err
		}
	}
	for _, ev := range res.Effects.LockEvents {
		if err := m.play(ev); err != nil {
			return fmt.Errorf("%s: %w", describeLockEvent(ev), err)
		}
	}
	return nil
}

func (m lockMirror) play(ev fsm.LockEvent) error {
	l := m[ev.Lock]
	if l == nil {
		l = &fsm.LockInfo{Name: ev.Lock, Permits: ev.Permits}
		m[ev.Lock] = l
	}
	if l.Permits != ev.Permits {
		return fmt.Errorf("permits %d, the lock's %d", ev.Permits, l.Permits)
	}
	holder := slices.IndexFunc(l.Holders, func(h fsm.HolderInfo) bool { return h.Session == ev.Session })
	waiter := slices.IndexFunc(l.Waiters, func(w fsm.WaiterInfo) bool { return w.Session == ev.Session })
	switch ev.Kind {
	case fsm.LockGranted:
		if holder >= 0 {
			return fmt.Errorf("granted to a holder")
		}
		if waiter >= 0 {
			l.Waiters = slices.Delete(l.Waiters, waiter, waiter+1)
		}
		l.Holders = append(l.Holders, fsm.HolderInfo{Session: ev.Session, Token: ev.Token, Mode: ev.Mode})
	case fsm.LockReleased, fsm.LockExpired, fsm.LockRevoked, fsm.LockAbandoned:
		if holder < 0 || l.Holders[holder].Token != ev.Token {
			return fmt.Errorf("no such grant")
		}
		l.Holders = slices.Delete(l.Holders, holder, holder+1)
	case fsm.LockQueued:
		if holder >= 0 || waiter >= 0 {
			return fmt.Errorf("queued twice")
		}
		l.Waiters = append(l.Waiters, fsm.WaiterInfo{Session: ev.Session, Mode: ev.Mode})
	case fsm.LockGaveUp:
		if waiter < 0 {
			return fmt.Errorf("no such wait")
		}
		l.Waiters = slices.Delete(l.Waiters, waiter, waiter+1)
	case fsm.LockDelayStarted:
		l.Delays = append(l.Delays, fsm.Delay{Lock: ev.Lock, Delay: ev.Delay, ID: ev.DelayID})
		l.Delay = max(l.Delay, ev.Delay)
	case fsm.LockDelayEnded:
		i := slices.IndexFunc(l.Delays, func(d fsm.Delay) bool { return d.ID == ev.DelayID })
		if i < 0 {
			return fmt.Errorf("no such delay")
		}
		l.Delays = slices.Delete(l.Delays, i, i+1)
		l.Delay = 0
		for _, d := range l.Delays {
			l.Delay = max(l.Delay, d.Delay)
		}
	default:
		return fmt.Errorf("unknown kind")
	}
	if len(l.Holders) == 0 && len(l.Waiters) == 0 && len(l.Delays) == 0 {
		delete(m, ev.Lock)
	}
	return nil
}

// differs says how the mirror differs from the state's locks, "" if not.
func (m lockMirror) differs(s *fsm.State) string {
	var got []fsm.LockInfo
	for _, l := range m {
		c := *l
		if len(c.Holders) == 0 {
			c.Holders = nil
		}
		if len(c.Waiters) == 0 {
			c.Waiters = nil
		}
		if len(c.Delays) == 0 {
			c.Delays = nil
		}
		got = append(got, c)
	}
	slices.SortFunc(got, func(a, b fsm.LockInfo) int { return strings.Compare(a.Name, b.Name) })
	want := s.Locks("")
	for i := range want {
		if len(want[i].Delays) == 0 {
			want[i].Delays = nil
		}
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Sprintf("the events say\n%+v\nthe state has\n%+v", got, want)
	}
	return ""
}

// allLockEvents is a result's events, a Batch's commands' in order.
func allLockEvents(res fsm.Result) []fsm.LockEvent {
	out := res.Effects.LockEvents
	for _, sub := range res.Batch() {
		out = append(out, allLockEvents(sub)...)
	}
	return out
}

func describeLockEvents(evs []fsm.LockEvent) string {
	var out []string
	for _, ev := range evs {
		out = append(out, "  "+describeLockEvent(ev))
	}
	return strings.Join(out, "\n")
}

func describeLockEvent(ev fsm.LockEvent) string {
	return fmt.Sprintf("%s %q session %d (%s) token %d %s/%d gave up %d end %s delay %v #%d",
		ev.Kind, ev.Lock, ev.Session, ev.Owner, ev.Token, ev.Mode, ev.Permits, ev.GaveUp, ev.End, ev.Delay, ev.DelayID)
}
