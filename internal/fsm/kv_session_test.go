package fsm_test

import (
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
)

// bound is a key as Get or an event reports it, bound to a session.
func bound(kv fsm.KeyValue, session uint64) fsm.KeyValue {
	kv.Session = session
	return kv
}

// TestKVBoundToSession runs the scripts of keys bound to sessions (etcd
// lease keys, ZooKeeper ephemeral nodes): deleted in the command that ends
// the session, in key order at revisions of their own; rebound or unbound
// by each put; unbound by a delete; a fenced one leaves its tombstone.
func TestKVBoundToSession(t *testing.T) {
	cases := []applyCase{
		{
			name: "closing the session deletes its keys, in key order, and releases its locks in the same command",
			steps: script(sessions(2), []applyStep{
				{cmd: kvPut("svc/b", "B", boundTo(1)), want: wrote(1, bound(kvAt("svc/b", "B", "", 0, 0, 1, 1, 1), 1)),
					after: getIs("svc/b", bound(kvAt("svc/b", "B", "", 0, 0, 1, 1, 1), 1))},
				{cmd: kvPut("svc/a", "A", boundTo(1)), want: wrote(2, bound(kvAt("svc/a", "A", "", 0, 0, 2, 2, 1), 1))},
				{cmd: kvPut("other", "O"), want: wrote(3, kvAt("other", "O", "", 0, 0, 3, 3, 1))},
				{cmd: acquire(1, "l", excl), want: granted(1, "l", 1, excl)},
				{cmd: acquire(2, "l", excl), want: queued()},
				{cmd: closeSession(1), want: withEvents(withGrants(ended(fsm.Closed, 1), grant(2, "l", 2, excl)),
					del(kvAt("svc/a", "", "", 0, 0, 2, 4, 1)),
					del(kvAt("svc/b", "", "", 0, 0, 1, 5, 1)),
				), after: listIs("", 0, false, "other")},
			}),
			locks: []fsm.LockInfo{{Name: "l", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
		{
			name: "expiry deletes the keys too",
			steps: script(sessions(1), []applyStep{
				{cmd: kvPut("k", "v", boundTo(1)), want: wrote(1, bound(kvAt("k", "v", "", 0, 0, 1, 1, 1), 1))},
				{cmd: expireSessions(1), want: withEvents(ended(fsm.Expired, 1), del(kvAt("k", "", "", 0, 0, 1, 2, 1))),
					after: notFound("k")},
			}),
		},
		{
			name: "a put without a session unbinds the key, a put with another rebinds it",
			steps: script(sessions(3), []applyStep{
				{cmd: kvPut("k", "1", boundTo(1)), want: wrote(1, bound(kvAt("k", "1", "", 0, 0, 1, 1, 1), 1))},
				{cmd: kvPut("k", "2"), want: wrote(2, kvAt("k", "2", "", 0, 0, 1, 2, 2))},
				{cmd: closeSession(1), want: ended(fsm.Closed, 1), after: getIs("k", kvAt("k", "2", "", 0, 0, 1, 2, 2))},
				{cmd: kvPut("k", "3", boundTo(2)), want: wrote(3, bound(kvAt("k", "3", "", 0, 0, 1, 3, 3), 2))},
				{cmd: kvPut("k", "4", boundTo(3)), want: wrote(4, bound(kvAt("k", "4", "", 0, 0, 1, 4, 4), 3))},
				{cmd: closeSession(2), want: ended(fsm.Closed, 2)},
				{cmd: closeSession(3), want: withEvents(ended(fsm.Closed, 3), del(kvAt("k", "", "", 0, 0, 1, 5, 4))),
					after: notFound("k")},
			}),
		},
		{
			name: "a delete unbinds the key; a put bound to an unknown session changes nothing",
			steps: script(sessions(1), []applyStep{
				{cmd: kvPut("k", "v", boundTo(1)), want: wrote(1, bound(kvAt("k", "v", "", 0, 0, 1, 1, 1), 1))},
				{cmd: kvDel("k"), want: removed(2, kvAt("k", "", "", 0, 0, 1, 2, 1))},
				{cmd: kvPut("j", "v", boundTo(7)), want: fails(fence.ErrSessionNotFound)},
				{cmd: closeSession(1), want: ended(fsm.Closed, 1), after: storeIs(2, 0)},
				{cmd: kvPut("j", "v", boundTo(1)), want: fails(fence.ErrSessionNotFound)},
			}),
		},
		{
			name: "a fenced key deleted with its session keeps its tombstone",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "l", excl), want: granted(1, "l", 1, excl)},
				{cmd: kvPut("k", "v", fenced("l", 1), boundTo(1)), want: wrote(1, bound(kvAt("k", "v", "l", 1, 1, 1, 1, 1), 1))},
				{cmd: closeSession(1), want: withEvents(ended(fsm.Closed, 1), del(kvAt("k", "", "", 0, 1, 1, 2, 1)))},
				{cmd: kvPut("k", "late"), want: fails(fence.ErrInvalidArgument)},
				{cmd: acquire(2, "l", excl), want: granted(2, "l", 2, excl)},
				{cmd: kvPut("k", "new", fenced("l", 2), boundTo(2)), want: wrote(3, bound(kvAt("k", "new", "l", 2, 2, 3, 3, 1), 2))},
			}),
			locks: []fsm.LockInfo{{Name: "l", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.NewState()
			runSteps(t, s, tc.steps)
			locksAre(tc.locks...)(t, s)
			// The bindings survive a snapshot: ending every session on a
			// restored copy does what it does on the original.
			r := mustRestore(t, s)
			for _, info := range s.Sessions() {
				if got, want := r.Apply(closeSession(info.ID)), s.Apply(closeSession(info.ID)); !sameResult(got, want) {
					t.Fatalf("closing session %d after a restore: %s, before: %s", info.ID, describe(got), describe(want))
				}
			}
			if err := r.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
