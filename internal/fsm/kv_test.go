// Table tests for the fenced KV store of the state machine (KVPut,
// KVDelete, Get, List). Each case is a script run by runSteps, so every
// step's exact Result is checked, CheckInvariants runs after every step, and
// a failing step is proved to leave the snapshot bytes unchanged. They prove
// the "fenced write rule" and "Fenced KV" of docs/design.md and issue 3 section 1:
// revisions, the per-key highest token (equal accepted, lower refused with a
// StaleTokenError naming both tokens), tokens never issued refused, unfenced
// writes refused on a key that was ever fenced and recorded without a lock,
// strict mode against the lock's current grant, compare-and-swap by mod
// revision, tombstones that keep the highest token, no-op deletes (a fenced
// one records its token), watch events that share no bytes with the state,
// and the max_keys limit on live keys.
package fsm_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// kvAt is a key as Get or an event reports it.
func kvAt(key, value, lock string, token, highest, create, mod, version uint64) fsm.KeyValue {
	return fsm.KeyValue{Key: key, Value: val(value), Lock: lock, Token: token, HighestToken: highest,
		CreateRevision: create, ModRevision: mod, Version: version}
}

func getIs(key string, want fsm.KeyValue) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		got, ok := s.Get(key)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("Get(%q) = %s, %v; want %s", key, describeKV(got), ok, describeKV(want))
		}
	}
}

func notFound(key string) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if got, ok := s.Get(key); ok {
			t.Fatalf("Get(%q) found %s, want not found", key, describeKV(got))
		}
	}
}

// listIs checks the keys List(prefix, limit) returns and its more flag.
func listIs(prefix string, limit int, more bool, keys ...string) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		kvs, gotMore := s.List(prefix, limit)
		var got []string
		for _, kv := range kvs {
			got = append(got, kv.Key)
			if one, ok := s.Get(kv.Key); !ok || !reflect.DeepEqual(one, kv) {
				t.Fatalf("List(%q) gave %s, Get gives %s", prefix, describeKV(kv), describeKV(one))
			}
		}
		if !reflect.DeepEqual(got, keys) || gotMore != more {
			t.Fatalf("List(%q, %d) = %q, more %v; want %q, more %v", prefix, limit, got, gotMore, keys, more)
		}
	}
}

// storeIs checks the store's revision and its number of live keys.
func storeIs(rev uint64, keys int) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if s.KVRevision() != rev || s.NumKeys() != keys {
			t.Fatalf("KVRevision() = %d, NumKeys() = %d; want %d, %d", s.KVRevision(), s.NumKeys(), rev, keys)
		}
	}
}

// snapshotKV returns the snapshot's entry for key (live or tombstone).
func snapshotKV(s *fsm.State, key string) *fsmpb.KV {
	for _, kv := range s.Snapshot().GetKvs() {
		if kv.GetKey() == key {
			return kv
		}
	}
	return nil
}

// tombstoneIs checks that key is kept, deleted, with its highest token.
func tombstoneIs(key string, highest uint64) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		kv := snapshotKV(s, key)
		if kv == nil || !kv.GetDeleted() || kv.GetHighestToken() != highest || len(kv.GetValue()) != 0 {
			t.Fatalf("snapshot entry for %q is %v; want a tombstone with highest token %d", key, kv, highest)
		}
	}
}

// entryIs checks the snapshot's entry for a key (live or tombstone), every
// field of it.
func entryIs(want *fsmpb.KV) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if kv := snapshotKV(s, want.GetKey()); !proto.Equal(kv, want) {
			t.Fatalf("snapshot entry for %q is %v; want %v", want.GetKey(), kv, want)
		}
	}
}

// issue returns steps that make the state issue tokens from..to, one grant
// each: session sess takes lock "issuer" and releases it. KV writes may only
// carry tokens that were issued.
func issue(sess, from, to uint64) []applyStep {
	var steps []applyStep
	for tok := from; tok <= to; tok++ {
		steps = append(steps,
			applyStep{cmd: acquire(sess, "issuer", excl), want: granted(sess, "issuer", tok, excl)},
			applyStep{cmd: release(sess, "issuer", tok), want: fsm.Result{}})
	}
	return steps
}

// issueTokens makes a fresh state issue tokens 1..n, with session 1.
func issueTokens(t *testing.T, s *fsm.State, n uint64) {
	t.Helper()
	runSteps(t, s, script(sessions(1), issue(1, 1, n)))
}

// noEntry checks that the state keeps nothing at all for key.
func noEntry(key string) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		if kv := snapshotKV(s, key); kv != nil {
			t.Fatalf("snapshot keeps %v for %q; want nothing", kv, key)
		}
	}
}

func all(checks ...func(t *testing.T, s *fsm.State)) func(t *testing.T, s *fsm.State) {
	return func(t *testing.T, s *fsm.State) {
		t.Helper()
		for _, c := range checks {
			c(t, s)
		}
	}
}

// marker remembers a state's snapshot bytes, to prove a later successful
// step changed nothing.
type marker struct{ bytes []byte }

func (m *marker) mark(t *testing.T, s *fsm.State) { m.bytes = snapshotBytes(t, s) }

func (m *marker) same(t *testing.T, s *fsm.State) {
	t.Helper()
	if !bytes.Equal(m.bytes, snapshotBytes(t, s)) {
		t.Fatal("the step changed the state")
	}
}

// TestApplyKV runs the KV cases like TestApply: exact results, invariants
// after every step, failed steps change nothing.
func TestApplyKV(t *testing.T) {
	var noop, noopTomb, noopRecorded marker
	cases := []applyCase{
		{
			name: "put creates and overwrites keys: create/mod revision, version, store revision, get and list",
			steps: []applyStep{
				{cmd: kvPut("orders/17", "v1"), want: wrote(1, kvAt("orders/17", "v1", "", 0, 0, 1, 1, 1)), after: storeIs(1, 1)},
				{cmd: kvPut("orders/18", "w"), want: wrote(2, kvAt("orders/18", "w", "", 0, 0, 2, 2, 1))},
				{cmd: kvPut("orders/17", "v2"), want: wrote(3, kvAt("orders/17", "v2", "", 0, 0, 1, 3, 2))},
				{cmd: kvPut("other", ""), want: wrote(4, kvAt("other", "", "", 0, 0, 4, 4, 1))},
				{cmd: kvPut("orders/17", "v3"), want: wrote(5, kvAt("orders/17", "v3", "", 0, 0, 1, 5, 3))},
			},
			check: all(
				storeIs(5, 3),
				getIs("orders/17", kvAt("orders/17", "v3", "", 0, 0, 1, 5, 3)),
				getIs("orders/18", kvAt("orders/18", "w", "", 0, 0, 2, 2, 1)),
				getIs("other", kvAt("other", "", "", 0, 0, 4, 4, 1)),
				notFound("orders/19"),
				notFound("orders/"),
				listIs("orders/", 0, false, "orders/17", "orders/18"),
				listIs("", 2, true, "orders/17", "orders/18"),
				listIs("", 3, false, "orders/17", "orders/18", "other"),
				listIs("", 0, false, "orders/17", "orders/18", "other"),
				listIs("x", 0, false),
			),
		},
		{
			name: "fenced write rule: equal and higher tokens are accepted, a lower one is stale and names both tokens",
			steps: script(sessions(1), issue(1, 1, 35), []applyStep{
				{cmd: kvPut("orders/17", "a", fenced("L", 34)), want: wrote(1, kvAt("orders/17", "a", "L", 34, 34, 1, 1, 1))},
				{cmd: kvPut("orders/17", "b", fenced("L", 33)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 33 < 34 for key orders/17"},
				{cmd: kvPut("orders/17", "c", fenced("L", 34)), want: wrote(2, kvAt("orders/17", "c", "L", 34, 34, 1, 2, 2))},
				{cmd: kvDel("orders/17", fenced("L", 33)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 33 < 34 for key orders/17"},
				{cmd: kvPut("orders/17", "d", fenced("M", 35)), want: wrote(3, kvAt("orders/17", "d", "M", 35, 35, 1, 3, 3))},
				{cmd: kvPut("orders/17", "e", fenced("L", 34)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 34 < 35 for key orders/17"},
				{cmd: kvPut("orders/17", "e", fenced("L", 1)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 1 < 35 for key orders/17"},
				// The highest token is per key.
				{cmd: kvPut("orders/18", "x", fenced("L", 1)), want: wrote(4, kvAt("orders/18", "x", "L", 1, 1, 4, 4, 1))},
			}),
			check: all(storeIs(4, 2), getIs("orders/17", kvAt("orders/17", "d", "M", 35, 35, 1, 3, 3))),
		},
		{
			name: "a token never issued is refused, put or delete, strict or not, before any other check, and changes nothing",
			steps: script(sessions(1), issue(1, 1, 12), []applyStep{
				{cmd: kvPut("k", "v", fenced("L", 12)), want: wrote(1, kvAt("k", "v", "L", 12, 12, 1, 1, 1))},
				{cmd: kvPut("k", "x", fenced("L", 99)), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: token 99 was never issued (the last token is 12); write key k with the token of a grant"},
				// The attack it stops: a key locked for good with 2^64-1.
				{cmd: kvPut("k", "x", fenced("L", math.MaxUint64)), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: token 18446744073709551615 was never issued (the last token is 12); write key k with the token of a grant"},
				{cmd: kvDel("k", fenced("L", math.MaxUint64)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("k", "x", fenced("L", 13)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvDel("k", fenced("L", 13)), want: fails(fence.ErrInvalidArgument)},
				// Not ErrNotHolder, ErrRevisionMismatch or ErrLimit: the token is checked first.
				{cmd: kvPut("k", "x", fenced("L", 13), strict), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvDel("k", fenced("L", 13), strict), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("k", "x", fenced("L", 13), expectRev(7)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("new", "x", fenced("L", 13), maxKeys(1)), want: fails(fence.ErrInvalidArgument)},
				// On a key never seen, and as a no-op delete: no tombstone is made.
				{cmd: kvPut("new", "x", fenced("L", 13)), want: fails(fence.ErrInvalidArgument), after: noEntry("new")},
				{cmd: kvDel("new", fenced("L", 13)), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: token 13 was never issued (the last token is 12); write key new with the token of a grant",
					after:  noEntry("new")},
				// A stale token is stale, however high the last token is.
				{cmd: kvPut("k", "x", fenced("L", 11)), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 11 < 12 for key k"},
				// Once issued, the token is accepted.
				{cmd: acquire(1, "L", excl), want: granted(1, "L", 13, excl)},
				{cmd: kvPut("k", "x", fenced("L", 13), strict), want: wrote(2, kvAt("k", "x", "L", 13, 13, 1, 2, 2))},
				{cmd: kvDel("new", fenced("L", 13)), want: unchanged(2), after: entryIs(&fsmpb.KV{Key: "new", HighestToken: 13, Deleted: true})},
				{cmd: kvPut("k", "y", fenced("L", 14)), want: fails(fence.ErrInvalidArgument)},
			}),
			locks: []fsm.LockInfo{{Name: "L", Holders: []fsm.HolderInfo{holding(1, 13, excl)}}},
			check: all(storeIs(2, 1), lastTokenIs(13), getIs("k", kvAt("k", "x", "L", 13, 13, 1, 2, 2))),
		},
		{
			name: "an unfenced write records no lock, even when the request names one",
			steps: []applyStep{
				{cmd: kvPut("k", "1", fenced("L", 0)), want: wrote(1, kvAt("k", "1", "", 0, 0, 1, 1, 1))},
				{cmd: kvPut("k", "2", fenced("L", 0), expectRev(1)), want: wrote(2, kvAt("k", "2", "", 0, 0, 1, 2, 2))},
				{cmd: kvDel("k", fenced("L", 0)), want: removed(3, kvAt("k", "", "", 0, 0, 1, 3, 2)), after: noEntry("k")},
				{cmd: kvPut("k", "3", fenced("L", 0)), want: wrote(4, kvAt("k", "3", "", 0, 0, 4, 4, 1))},
			},
			check: all(storeIs(4, 1), getIs("k", kvAt("k", "3", "", 0, 0, 4, 4, 1)),
				entryIs(&fsmpb.KV{Key: "k", Value: []byte("3"), CreateRevision: 4, ModRevision: 4, Version: 1})),
		},
		{
			name: "an unfenced write to a key that was ever fenced is refused; to a never-fenced key it is accepted",
			steps: script(sessions(1), issue(1, 1, 8), []applyStep{
				{cmd: kvPut("plain", "1"), want: wrote(1, kvAt("plain", "1", "", 0, 0, 1, 1, 1))},
				// An unfenced delete of an unfenced key leaves no tombstone.
				{cmd: kvDel("plain"), want: removed(2, kvAt("plain", "", "", 0, 0, 1, 2, 1)), after: all(noEntry("plain"), storeIs(2, 0))},
				{cmd: kvPut("plain", "2"), want: wrote(3, kvAt("plain", "2", "", 0, 0, 3, 3, 1))},
				{cmd: kvPut("plain", "3", fenced("L", 7)), want: wrote(4, kvAt("plain", "3", "L", 7, 7, 3, 4, 2))},
				{cmd: kvPut("plain", "4"), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: key plain is fenced (highest token 7); write it with a fencing token"},
				{cmd: kvPut("plain", "4", fenced("L", 0)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvDel("plain"), want: fails(fence.ErrInvalidArgument)},
				// Outside strict mode the lock name is recorded, not checked.
				{cmd: kvPut("plain", "5", fenced("", 7)), want: wrote(5, kvAt("plain", "5", "", 7, 7, 3, 5, 3))},
				{cmd: kvDel("plain", fenced("L", 8)), want: removed(6, kvAt("plain", "", "L", 8, 8, 3, 6, 3)), after: tombstoneIs("plain", 8)},
				// The tombstone keeps the key fenced.
				{cmd: kvPut("plain", "6"), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvDel("plain"), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("plain", "6", fenced("L", 8)), want: wrote(7, kvAt("plain", "6", "L", 8, 8, 7, 7, 1))},
			}),
			check: storeIs(7, 1),
		},
		{
			name: "strict mode: the token must be a current grant of the lock",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "L", excl), want: granted(1, "L", 1, excl)},
				{cmd: kvPut("k", "a", fenced("L", 1), strict), want: wrote(1, kvAt("k", "a", "L", 1, 1, 1, 1, 1))},
				// A token not yet issued is refused as such, not as a non-holder's.
				{cmd: kvPut("k", "b", fenced("L", 2), strict), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: token 2 was never issued (the last token is 1); write key k with the token of a grant"},
				{cmd: kvPut("k", "b", fenced("M", 1), strict), want: fails(fence.ErrNotHolder),
					errMsg: `fence: not the lock's holder: token 1 is not a current grant: lock "M" is not held`},
				{cmd: kvPut("k", "b", fenced("", 1), strict), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("fresh", "b", fenced("L", 0), strict), want: fails(fence.ErrInvalidArgument)},
				{cmd: release(1, "L", 1), want: fsm.Result{}},
				// Lock free: the token is no longer a current grant.
				{cmd: kvPut("k", "b", fenced("L", 1), strict), want: fails(fence.ErrNotHolder),
					errMsg: `fence: not the lock's holder: token 1 is not a current grant: lock "L" is not held`},
				{cmd: kvDel("k", fenced("L", 1), strict), want: fails(fence.ErrNotHolder)},
				// Without strict the highest-token rule alone lets it through.
				{cmd: kvPut("k", "b", fenced("L", 1)), want: wrote(2, kvAt("k", "b", "L", 1, 1, 1, 2, 2))},
				{cmd: acquire(2, "L", excl), want: granted(2, "L", 2, excl)},
				// Lock regranted: the old token is refused, naming the current one.
				{cmd: kvPut("k", "c", fenced("L", 1), strict), want: fails(fence.ErrNotHolder),
					errMsg: `fence: not the lock's holder: token 1 is not the current grant of lock "L" (the current token is 2)`},
				{cmd: kvDel("k", fenced("L", 1), strict), want: fails(fence.ErrNotHolder)},
				{cmd: kvPut("k", "c", fenced("L", 2), strict), want: wrote(3, kvAt("k", "c", "L", 2, 2, 1, 3, 3))},
				// A stale token is stale first, whatever the lock says.
				{cmd: kvPut("k", "d", fenced("L", 1), strict), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 1 < 2 for key k"},
				// Any shared holder's token is a current grant.
				{cmd: acquire(1, "S", shared), want: granted(1, "S", 3, shared)},
				{cmd: acquire(2, "S", shared), want: granted(2, "S", 4, shared)},
				{cmd: kvPut("s", "x", fenced("S", 3), strict), want: wrote(4, kvAt("s", "x", "S", 3, 3, 4, 4, 1))},
				{cmd: kvPut("s", "y", fenced("S", 4), strict), want: wrote(5, kvAt("s", "y", "S", 4, 4, 4, 5, 2))},
				{cmd: kvDel("s", fenced("S", 4), strict), want: removed(6, kvAt("s", "", "S", 4, 4, 4, 6, 2))},
				// Expiry of the holder ends its grant.
				{cmd: expireSessions(2), want: ended(fsm.Expired, 2)},
				{cmd: kvPut("k", "e", fenced("L", 2), strict), want: fails(fence.ErrNotHolder)},
				{cmd: kvPut("s", "e", fenced("S", 4), strict), want: fails(fence.ErrNotHolder),
					errMsg: `fence: not the lock's holder: token 4 is not the current grant of lock "S" (the current token is 3)`},
				{cmd: kvPut("s", "e", fenced("S", 3), strict), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 3 < 4 for key s"},
			}),
			locks: []fsm.LockInfo{{Name: "S", Holders: []fsm.HolderInfo{holding(1, 3, shared)}}},
			check: all(storeIs(6, 1), lastTokenIs(4), getIs("k", kvAt("k", "c", "L", 2, 2, 1, 3, 3))),
		},
		{
			name: "compare-and-swap by mod revision",
			steps: script(sessions(1), issue(1, 1, 5), []applyStep{
				{cmd: kvPut("k", "a", expectRev(0)), want: wrote(1, kvAt("k", "a", "", 0, 0, 1, 1, 1))},
				{cmd: kvPut("k", "b", expectRev(0)), want: fails(fence.ErrRevisionMismatch),
					errMsg: "fence: revision mismatch: key k is at revision 1, expected 0"},
				{cmd: kvPut("k", "b", expectRev(2)), want: fails(fence.ErrRevisionMismatch)},
				{cmd: kvPut("other", "x"), want: wrote(2, kvAt("other", "x", "", 0, 0, 2, 2, 1))},
				// The key's mod revision counts, not the store's.
				{cmd: kvPut("k", "b", expectRev(2)), want: fails(fence.ErrRevisionMismatch)},
				{cmd: kvPut("k", "b", expectRev(1)), want: wrote(3, kvAt("k", "b", "", 0, 0, 1, 3, 2))},
				{cmd: kvDel("k", expectRev(1)), want: fails(fence.ErrRevisionMismatch)},
				{cmd: kvDel("k", expectRev(3)), want: removed(4, kvAt("k", "", "", 0, 0, 1, 4, 2))},
				{cmd: kvPut("k", "c", expectRev(3)), want: fails(fence.ErrRevisionMismatch),
					errMsg: "fence: revision mismatch: key k does not exist, expected revision 3"},
				{cmd: kvDel("k", expectRev(3)), want: fails(fence.ErrRevisionMismatch)},
				{cmd: kvDel("k", expectRev(0)), want: unchanged(4)},
				// Re-created: a new create revision, version 1.
				{cmd: kvPut("k", "c", expectRev(0)), want: wrote(5, kvAt("k", "c", "", 0, 0, 5, 5, 1))},
				// A tombstone does not exist for CAS, but stays fenced.
				{cmd: kvPut("t", "a", fenced("L", 5)), want: wrote(6, kvAt("t", "a", "L", 5, 5, 6, 6, 1))},
				{cmd: kvDel("t", fenced("L", 5)), want: removed(7, kvAt("t", "", "L", 5, 5, 6, 7, 1))},
				{cmd: kvPut("t", "b", fenced("L", 5), expectRev(7)), want: fails(fence.ErrRevisionMismatch),
					errMsg: "fence: revision mismatch: key t does not exist, expected revision 7"},
				{cmd: kvPut("t", "b", fenced("L", 4), expectRev(0)), want: fails(fence.ErrStaleToken)},
				{cmd: kvPut("t", "b", expectRev(0)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("t", "b", fenced("L", 5), expectRev(0)), want: wrote(8, kvAt("t", "b", "L", 5, 5, 8, 8, 1))},
			}),
			check: all(storeIs(8, 3), getIs("k", kvAt("k", "c", "", 0, 0, 5, 5, 1))),
		},
		{
			name: "a fenced delete leaves a tombstone that keeps the highest token: get and list skip it, lower tokens stay stale",
			steps: script(sessions(1), issue(1, 1, 6), []applyStep{
				{cmd: kvPut("orders/17", "v", fenced("L", 5)), want: wrote(1, kvAt("orders/17", "v", "L", 5, 5, 1, 1, 1))},
				{cmd: kvPut("orders/18", "w", fenced("L", 5)), want: wrote(2, kvAt("orders/18", "w", "L", 5, 5, 2, 2, 1))},
				{cmd: kvDel("orders/17", fenced("M", 6)), want: removed(3, kvAt("orders/17", "", "M", 6, 6, 1, 3, 1)), after: all(
					notFound("orders/17"),
					listIs("orders/", 0, false, "orders/18"),
					listIs("", 1, false, "orders/18"),
					tombstoneIs("orders/17", 6),
					storeIs(3, 1),
				)},
				{cmd: kvPut("orders/17", "stale", fenced("L", 5)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 5 < 6 for key orders/17"},
				{cmd: kvDel("orders/17", fenced("L", 5)), want: fails(fence.ErrStaleToken)},
				{cmd: kvPut("orders/17", "x"), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("orders/17", "back", fenced("L", 6)), want: wrote(4, kvAt("orders/17", "back", "L", 6, 6, 4, 4, 1))},
				// A fenced delete of a key written unfenced leaves a tombstone too.
				{cmd: kvPut("p", "1"), want: wrote(5, kvAt("p", "1", "", 0, 0, 5, 5, 1))},
				{cmd: kvDel("p", fenced("L", 2)), want: removed(6, kvAt("p", "", "L", 2, 2, 5, 6, 1)), after: tombstoneIs("p", 2)},
				{cmd: kvPut("p", "2"), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("p", "2", fenced("L", 1)), want: fails(fence.ErrStaleToken)},
			}),
			check: all(storeIs(6, 2), listIs("", 0, false, "orders/17", "orders/18")),
		},
		{
			name: "an unfenced delete of a missing key changes nothing and bumps no revision; nor does a fenced one of a tombstone with its token",
			steps: script(sessions(1), issue(1, 1, 9), []applyStep{
				{cmd: kvPut("k", "v"), want: wrote(1, kvAt("k", "v", "", 0, 0, 1, 1, 1)), after: noop.mark},
				{cmd: kvDel("nosuch"), want: unchanged(1), after: noop.same},
				// A lock without a token is no fence.
				{cmd: kvDel("nosuch", fenced("L", 0)), want: unchanged(1), after: all(noop.same, noEntry("nosuch"))},
				{cmd: kvDel("nosuch", fenced("L", 9), strict), want: fails(fence.ErrNotHolder)},
				{cmd: kvDel("k"), want: removed(2, kvAt("k", "", "", 0, 0, 1, 2, 1)), after: all(noEntry("k"), noop.mark)},
				{cmd: kvDel("k"), want: unchanged(2), after: noop.same},
				{cmd: kvPut("t", "v", fenced("L", 3)), want: wrote(3, kvAt("t", "v", "L", 3, 3, 3, 3, 1))},
				{cmd: kvDel("t", fenced("L", 3)), want: removed(4, kvAt("t", "", "L", 3, 3, 3, 4, 1)), after: noopTomb.mark},
				// The tombstone's highest token is already 3: nothing to record.
				{cmd: kvDel("t", fenced("M", 3)), want: unchanged(4), after: noopTomb.same},
				{cmd: kvDel("t", fenced("L", 2)), want: fails(fence.ErrStaleToken)},
				{cmd: kvDel("t"), want: fails(fence.ErrInvalidArgument)},
			}),
			check: all(storeIs(4, 0), tombstoneIs("t", 3), noEntry("nosuch"), noEntry("k")),
		},
		{
			// docs/design.md's fenced write rule: a write with t >= highest is
			// accepted "and then highest := t", a delete of a missing key
			// included. Only nothing visible changes: no revision, no event.
			name: "a fenced delete of a missing key is an accepted write: it records its token (in a new tombstone for a key never seen), so lower tokens become stale",
			steps: script(sessions(1), issue(1, 1, 34), []applyStep{
				// A (token 33) deletes k; B (token 34) deletes it again.
				{cmd: kvPut("k", "v", fenced("orders", 33)), want: wrote(1, kvAt("k", "v", "orders", 33, 33, 1, 1, 1))},
				{cmd: kvDel("k", fenced("orders", 33)), want: removed(2, kvAt("k", "", "orders", 33, 33, 1, 2, 1))},
				{cmd: kvDel("k", fenced("orders", 34)), want: unchanged(2), after: all(
					// Only the highest token moves; the tombstone still tells of A's delete.
					entryIs(&fsmpb.KV{Key: "k", Token: 33, Lock: "orders", HighestToken: 34, CreateRevision: 1, ModRevision: 2, Version: 1, Deleted: true}),
					storeIs(2, 0), notFound("k"), noopRecorded.mark,
				)},
				// A's late put with 33 is refused.
				{cmd: kvPut("k", "late", fenced("orders", 33)), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 33 < 34 for key k"},
				{cmd: kvDel("k", fenced("orders", 33)), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 33 < 34 for key k"},
				{cmd: kvPut("k", "late"), want: fails(fence.ErrInvalidArgument)},
				// Again with 34: nothing changes at all.
				{cmd: kvDel("k", fenced("orders", 34)), want: unchanged(2), after: noopRecorded.same},
				{cmd: kvPut("k", "B", fenced("orders", 34)), want: wrote(3, kvAt("k", "B", "orders", 34, 34, 3, 3, 1))},
				// A key never seen gets a tombstone that was never written:
				// revisions, version and token 0, only the highest token.
				{cmd: kvDel("new", fenced("orders", 20)), want: unchanged(3), after: all(
					entryIs(&fsmpb.KV{Key: "new", HighestToken: 20, Deleted: true}),
					storeIs(3, 1), notFound("new"), listIs("", 0, false, "k"),
				)},
				{cmd: kvPut("new", "x", fenced("orders", 19)), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 19 < 20 for key new"},
				{cmd: kvPut("new", "x"), want: fails(fence.ErrInvalidArgument),
					errMsg: "fence: invalid argument: key new is fenced (highest token 20); write it with a fencing token"},
				{cmd: kvDel("new"), want: fails(fence.ErrInvalidArgument)},
				// It does not exist for compare-and-swap.
				{cmd: kvPut("new", "x", fenced("orders", 20), expectRev(1)), want: fails(fence.ErrRevisionMismatch),
					errMsg: "fence: revision mismatch: key new does not exist, expected revision 1"},
				{cmd: kvDel("new", fenced("orders", 21), expectRev(0)), want: unchanged(3),
					after: entryIs(&fsmpb.KV{Key: "new", HighestToken: 21, Deleted: true})},
				{cmd: kvPut("new", "x", fenced("orders", 21), expectRev(0)), want: wrote(4, kvAt("new", "x", "orders", 21, 21, 4, 4, 1))},
				// A strict one with the lock's current grant records it too.
				{cmd: acquire(1, "L", excl), want: granted(1, "L", 35, excl)},
				{cmd: kvDel("ghost", fenced("L", 35), strict), want: unchanged(4),
					after: entryIs(&fsmpb.KV{Key: "ghost", HighestToken: 35, Deleted: true})},
				{cmd: kvDel("ghost", fenced("L", 34)), want: fails(fence.ErrStaleToken)},
				{cmd: kvDel("never", fenced("L", 34), strict), want: fails(fence.ErrNotHolder), after: noEntry("never")},
			}),
			locks: []fsm.LockInfo{{Name: "L", Holders: []fsm.HolderInfo{holding(1, 35, excl)}}},
			// The runner's final Restore round-trips the never-written tombstone.
			check: all(storeIs(4, 2), listIs("", 0, false, "k", "new"), tombstoneIs("ghost", 35)),
		},
		{
			name: "max_keys limits live keys only; overwriting an existing key at the limit is fine",
			steps: script(sessions(1), issue(1, 1, 1), []applyStep{
				{cmd: kvPut("a", "1", maxKeys(2)), want: wrote(1, kvAt("a", "1", "", 0, 0, 1, 1, 1))},
				{cmd: kvPut("b", "1", fenced("L", 1), maxKeys(2)), want: wrote(2, kvAt("b", "1", "L", 1, 1, 2, 2, 1))},
				{cmd: kvPut("c", "1", maxKeys(2)), want: fails(fence.ErrLimit),
					errMsg: "fence: limit reached: the KV store already has 2 keys, its limit"},
				{cmd: kvPut("a", "2", maxKeys(2)), want: wrote(3, kvAt("a", "2", "", 0, 0, 1, 3, 2))},
				{cmd: kvPut("b", "2", fenced("L", 1), maxKeys(1)), want: wrote(4, kvAt("b", "2", "L", 1, 1, 2, 4, 2))},
				// The limit travels in each command; 0 is no limit.
				{cmd: kvPut("c", "1", maxKeys(3)), want: wrote(5, kvAt("c", "1", "", 0, 0, 5, 5, 1))},
				{cmd: kvPut("d", "1"), want: wrote(6, kvAt("d", "1", "", 0, 0, 6, 6, 1))},
				{cmd: kvDel("b", fenced("L", 1)), want: removed(7, kvAt("b", "", "L", 1, 1, 2, 7, 2))},
				{cmd: kvDel("d"), want: removed(8, kvAt("d", "", "", 0, 0, 6, 8, 1)), after: storeIs(8, 2)},
				// The tombstone of b does not count...
				{cmd: kvPut("e", "1", maxKeys(3)), want: wrote(9, kvAt("e", "1", "", 0, 0, 9, 9, 1))},
				// ...but bringing b back makes a new live key.
				{cmd: kvPut("b", "3", fenced("L", 1), maxKeys(3)), want: fails(fence.ErrLimit),
					errMsg: "fence: limit reached: the KV store already has 3 keys, its limit"},
				{cmd: kvPut("f", "1", maxKeys(3)), want: fails(fence.ErrLimit)},
				// A refused fence is reported before the limit.
				{cmd: kvPut("b", "3", fenced("L", 0), maxKeys(3)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvPut("e", "2", maxKeys(3)), want: wrote(10, kvAt("e", "2", "", 0, 0, 9, 10, 2))},
				// Nor does a tombstone left by a delete of a key never seen.
				{cmd: kvDel("g", fenced("L", 1)), want: unchanged(10), after: storeIs(10, 3)},
				{cmd: kvPut("a", "3", maxKeys(3)), want: wrote(11, kvAt("a", "3", "", 0, 0, 1, 11, 3))},
			}),
			check: all(storeIs(11, 3), listIs("", 0, false, "a", "c", "e"), tombstoneIs("b", 1), tombstoneIs("g", 1)),
		},
		{
			// State.Apply must not panic on any well-formed message: a KV
			// command without a fence (or without a body) is an unfenced
			// write.
			name: "a put or delete without a fence is unfenced",
			steps: script(sessions(1), issue(1, 1, 3), []applyStep{
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: []byte("v")}}},
					want: wrote(1, kvAt("k", "v", "", 0, 0, 1, 1, 1))},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "k"}}},
					want: removed(2, kvAt("k", "", "", 0, 0, 1, 2, 1))},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "k"}}}, want: unchanged(2)},
				{cmd: kvPut("f", "v", fenced("L", 3)), want: wrote(3, kvAt("f", "v", "L", 3, 3, 3, 3, 1))},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "f", MaxKeys: 1}}}, want: fails(fence.ErrInvalidArgument)},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "f"}}}, want: fails(fence.ErrInvalidArgument)},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvPut{}}, want: wrote(4, kvAt("", "", "", 0, 0, 4, 4, 1))},
				{cmd: &fsmpb.Command{Op: &fsmpb.Command_KvDelete{}}, want: removed(5, kvAt("", "", "", 0, 0, 4, 5, 1))},
			}),
			check: storeIs(5, 1),
		},
		{
			name: "KV commands leave locks and the token counter alone",
			steps: script(sessions(1), []applyStep{
				{cmd: acquire(1, "L", excl), want: granted(1, "L", 1, excl)},
				{cmd: kvPut("k", "v", fenced("L", 1), strict), want: wrote(1, kvAt("k", "v", "L", 1, 1, 1, 1, 1))},
				{cmd: acquire(1, "M", excl), want: granted(1, "M", 2, excl)},
				{cmd: kvPut("k", "v", fenced("M", 2)), want: wrote(2, kvAt("k", "v", "M", 2, 2, 1, 2, 2))},
				// Nor does a refused token never issued move the counter.
				{cmd: kvPut("k", "v", fenced("L", 5)), want: fails(fence.ErrInvalidArgument)},
				{cmd: kvDel("k", fenced("M", 2)), want: removed(3, kvAt("k", "", "M", 2, 2, 1, 3, 2))},
				{cmd: kvDel("gone", fenced("M", 2)), want: unchanged(3)},
				{cmd: acquire(1, "N", excl), want: granted(1, "N", 3, excl)},
			}),
			locks: []fsm.LockInfo{
				{Name: "L", Holders: []fsm.HolderInfo{holding(1, 1, excl)}},
				{Name: "M", Holders: []fsm.HolderInfo{holding(1, 2, excl)}},
				{Name: "N", Holders: []fsm.HolderInfo{holding(1, 3, excl)}},
			},
			check: all(lastTokenIs(3), storeIs(3, 0)),
		},
	}
	runApplyCases(t, cases, true)
}

// TestKVStaleTokenError proves a stale KV write fails with a
// *fence.StaleTokenError carrying the key and both tokens, which is
// ErrStaleToken and no other sentinel, with the message of issue 3.
func TestKVStaleTokenError(t *testing.T) {
	s := fsm.NewState()
	issueTokens(t, s, 34)
	mustApply(t, s, kvPut("orders/17", "new", fenced("orders", 34)))
	for _, cmd := range []*fsmpb.Command{
		kvPut("orders/17", "old", fenced("orders", 33)),
		kvPut("orders/17", "old", fenced("orders", 33), strict, expectRev(1)),
		kvDel("orders/17", fenced("orders", 33)),
	} {
		res := mustApply(t, s, cmd)
		var stale *fence.StaleTokenError
		if !errors.As(res.Err, &stale) {
			t.Fatalf("%v failed with %T %v, want *fence.StaleTokenError", cmd, res.Err, res.Err)
		}
		if *stale != (fence.StaleTokenError{Key: "orders/17", Token: 33, Highest: 34}) {
			t.Fatalf("%v: %+v", cmd, *stale)
		}
		if got, want := res.Err.Error(), "stale fencing token 33 < 34 for key orders/17"; got != want {
			t.Fatalf("message %q, want %q", got, want)
		}
		if !errors.Is(res.Err, fence.ErrStaleToken) {
			t.Fatal("not errors.Is ErrStaleToken")
		}
		for _, other := range []error{fence.ErrNotHolder, fence.ErrInvalidArgument, fence.ErrRevisionMismatch, fence.ErrLimit} {
			if errors.Is(res.Err, other) {
				t.Fatalf("stale error is also %v", other)
			}
		}
	}
	getIs("orders/17", kvAt("orders/17", "new", "orders", 34, 34, 1, 1, 1))(t, s)
}

// TestKVArticleTimeline is the article's story at the state machine: A gets
// token 33 and writes, pauses, its session expires, B gets 34 and writes,
// then A wakes and writes with 33. A's late write is refused however it is
// sent (fenced, strict, CAS, delete, unfenced) and B's value survives.
func TestKVArticleTimeline(t *testing.T) {
	s := fsm.NewState()
	const a, b, warm = 1, 2, 3
	for range 3 {
		mustApply(t, s, newSession())
	}
	for tok := uint64(1); tok <= 32; tok++ {
		mustApply(t, s, acquire(warm, "warm-up", excl))
		mustApply(t, s, release(warm, "warm-up", tok))
	}
	if res := mustApply(t, s, acquire(a, "orders", excl)); !sameResult(res, granted(a, "orders", 33, excl)) {
		t.Fatalf("A's grant: %s", describe(res))
	}
	if res := mustApply(t, s, kvPut("orders/17", "from A", fenced("orders", 33), strict)); res.Err != nil {
		t.Fatal(res.Err)
	}
	mustApply(t, s, expireSessions(a)) // A is paused; the leader expires its session
	if res := mustApply(t, s, acquire(b, "orders", excl)); !sameResult(res, granted(b, "orders", 34, excl)) {
		t.Fatalf("B's grant: %s", describe(res))
	}
	if res := mustApply(t, s, kvPut("orders/17", "from B", fenced("orders", 34), strict, expectRev(1))); res.Err != nil {
		t.Fatal(res.Err)
	}
	for _, late := range []struct {
		cmd  *fsmpb.Command
		want error
	}{
		{kvPut("orders/17", "from A, late", fenced("orders", 33)), fence.ErrStaleToken},
		{kvPut("orders/17", "from A, late", fenced("orders", 33), strict), fence.ErrStaleToken},
		{kvPut("orders/17", "from A, late", fenced("orders", 33), expectRev(2)), fence.ErrStaleToken},
		{kvDel("orders/17", fenced("orders", 33)), fence.ErrStaleToken},
		{kvPut("orders/17", "from A, late"), fence.ErrInvalidArgument},
		{kvPut("orders/18", "from A, late", fenced("orders", 33), strict), fence.ErrNotHolder},
	} {
		before := snapshotBytes(t, s)
		res := mustApply(t, s, late.cmd)
		if !sameResult(res, fails(late.want)) {
			t.Fatalf("late %v answered %s, want %v", late.cmd, describe(res), late.want)
		}
		if !bytes.Equal(before, snapshotBytes(t, s)) {
			t.Fatalf("late %v changed the state", late.cmd)
		}
	}
	getIs("orders/17", kvAt("orders/17", "from B", "orders", 34, 34, 1, 2, 2))(t, s)
}

// TestKVReadsReturnCopies proves Get and List hand out values the caller
// may change without changing the state.
func TestKVReadsReturnCopies(t *testing.T) {
	s := fsm.NewState()
	mustApply(t, s, kvPut("k", "value"))
	want := snapshotBytes(t, s)
	kv, _ := s.Get("k")
	kv.Value[0] = 'X'
	kvs, _ := s.List("", 0)
	kvs[0].Value[1] = 'X'
	if !bytes.Equal(want, snapshotBytes(t, s)) {
		t.Fatal("changing a value read from the state changed the state")
	}
	getIs("k", kvAt("k", "value", "", 0, 0, 1, 1, 1))(t, s)
}

// TestKVEventsAreCopies proves a watch event carries its own copy of the
// value: a watcher that changes it changes nothing in the state.
func TestKVEventsAreCopies(t *testing.T) {
	s := fsm.NewState()
	res := mustApply(t, s, kvPut("k", "value"))
	want := snapshotBytes(t, s)
	res.Effects.Events[0].KV.Value[0] = 'X'
	if !bytes.Equal(want, snapshotBytes(t, s)) {
		t.Fatal("changing a watch event's value changed the state")
	}
	getIs("k", kvAt("k", "value", "", 0, 0, 1, 1, 1))(t, s)
	if err := eventsOwnValues(t, s, mustApply(t, s, kvPut("k", "again"))); err != nil {
		t.Fatal(err)
	}
}
