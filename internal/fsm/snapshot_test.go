// Snapshot and Restore tests. They prove that a snapshot captures the whole
// state (a restored state snapshots identically, to the byte, and behaves
// identically on every further command, including the token and session
// counters and lock-delays), that a snapshot is a copy independent of the
// state it came from, and that Restore refuses snapshots that break the
// state's invariants instead of loading them.
package fsm_test

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// richScript builds a state with every kind of content: sessions with
// different TTLs and owners and a gap in the ids, exclusive and shared
// holders, queues of both modes, lock-delays held and pending, a lock
// under delay with a waiter, and KV keys: fenced, unfenced, empty, a
// tombstone, a key deleted without one, and the tombstone a fenced delete
// of a key never written leaves (revisions 0, only a highest token).
func richScript() []*fsmpb.Command {
	const sec = time.Second
	return []*fsmpb.Command{
		setClusterID("group-1"),
		createSession(sec, "alice", 0),                      // 1
		createSession(2*sec, "bob", 0),                      // 2
		createSession(3*sec, "", 0),                         // 3
		createSession(4*sec, "carol", 0),                    // 4
		createSession(5*sec, "dave", 0),                     // 5
		createSession(6*sec, "erin", 0),                     // 6
		createSession(7*sec, "frank", 0),                    // 7
		acquire(1, "a", excl, withDelay(2*sec)),             // token 1
		acquire(2, "a", shared, withDelay(sec)),             // waits
		acquire(3, "a", excl),                               // waits
		acquire(4, "a", shared),                             // waits
		acquire(2, "b", shared),                             // token 2
		acquire(4, "b", shared, withDelay(3*sec)),           // token 3
		acquire(5, "b", excl),                               // waits
		acquire(6, "d", excl, withDelay(4*sec)),             // token 4
		acquire(7, "d", excl),                               // waits
		expireSessions(6),                                   // d delayed, 7 waits
		acquire(5, "e", excl),                               // token 5
		closeSession(5),                                     // e freed, 5 leaves b's queue
		acquire(1, "e", shared, withDelay(time.Hour)),       // token 6
		kvPut("k/live", "v1", fenced("a", 1), strict),       // KV revision 1
		kvPut("k/plain", "p"),                               // 2
		kvPut("k/tomb", "t", fenced("b", 3), strict),        // 3
		kvDel("k/tomb", fenced("b", 3)),                     // 4: tombstone, highest 3
		kvPut("k/gone", "g"),                                // 5
		kvDel("k/gone"),                                     // 6: no tombstone
		kvPut("k/live", "v2", fenced("e", 6), expectRev(1)), // 7
		kvPut("k/empty", "", fenced("b", 2)),                // 8
		kvDel("k/never", fenced("b", 2)),                    // no revision: a tombstone with highest 2
	}
}

// followUp exercises the restored state: counters, hand-offs, delays, and
// failures.
func followUp() []*fsmpb.Command {
	return []*fsmpb.Command{
		newSession(),          // id 8: the session counter survived
		acquire(8, "f", excl), // token 7: the token counter survived
		kvPut("k/live", "v3", fenced("f", 7), strict, expectRev(7)), // KV revision 9: the KV revision survived
		kvPut("k/live", "stale", fenced("e", 6)),                    // stale
		kvPut("k/tomb", "x", fenced("b", 2)),                        // stale: the tombstone kept token 3
		kvPut("k/never", "x", fenced("b", 1)),                       // stale: the never-written tombstone kept token 2
		kvPut("k/tomb", "x"),                                        // unfenced on a fenced key
		kvPut("k/new", "n", maxKeys(3)),                             // limit: 3 live keys
		kvPut("k/plain", "p2", maxKeys(3)),                          // 10: overwriting at the limit
		acquire(8, "a", excl, try),                                  // locked
		release(1, "a", 99),                                         // wrong token
		expireSessions(1),                                           // a and e delayed by 1's lock-delays
		acquire(8, "a", shared),                                     // queues behind the delay
		liftDelay("d"),                                              // d to 7
		liftDelay("a"),                                              // a to 2 (shared); 3 (exclusive) blocks 4 and 8
		cancelWait(3, "a"),                                          // 4 and 8 join 2
		release(2, "b", 2),                                          // b stays with 4 (shared)
		expireSessions(4, 2, 7),                                     // a and b delayed, d freed
		acquire(3, "d", excl),                                       // d free again
		liftDelay("a"),                                              //
		liftDelay("b"),                                              //
		liftDelay("e"),                                              //
		acquire(3, "a", excl),                                       // a was left to 8
		closeSession(8),                                             // a to 3
		createSession(time.Second, "", 3),                           // limit
		acquire(3, "a", fsm.Mode(9)),                                // bad mode
		kvDel("k/live", fenced("f", 7), strict),                     // f was released with session 8
		kvDel("k/plain"),                                            // 11
		kvDel("k/plain"),                                            // missing: no-op
		kvPut("k/tomb", "back", fenced("b", 3)),                     // 12: the tombstone comes back
		kvPut("k/gone", "g2", expectRev(0)),                         // 13
	}
}

func buildState(t *testing.T, cmds []*fsmpb.Command) *fsm.State {
	t.Helper()
	s := fsm.NewState()
	for _, cmd := range cmds {
		if res := mustApply(t, s, cmd); res.Err != nil {
			t.Fatalf("building state: %v: %v", cmd, res.Err)
		}
	}
	return s
}

// TestSnapshotRestoreRoundTrip proves a restored state equals the original
// (proto.Equal, same bytes, same queries) and answers every further command
// exactly as the original does.
func TestSnapshotRestoreRoundTrip(t *testing.T) {
	orig := buildState(t, richScript())
	snap := orig.Snapshot()
	if len(snap.GetSessions()) != 5 || len(snap.GetLocks()) != 4 || snap.GetLastToken() != 6 || snap.GetLastSessionId() != 7 {
		t.Fatalf("the rich state is not what the script meant to build: %v", snap)
	}
	var keys []string
	for _, kv := range snap.GetKvs() {
		keys = append(keys, kv.GetKey())
	}
	never := &fsmpb.KV{Key: "k/never", HighestToken: 2, Deleted: true}
	if snap.GetKvRevision() != 8 || !reflect.DeepEqual(keys, []string{"k/empty", "k/live", "k/never", "k/plain", "k/tomb"}) ||
		!snap.GetKvs()[4].GetDeleted() || snap.GetKvs()[4].GetHighestToken() != 3 || !proto.Equal(snap.GetKvs()[2], never) || orig.NumKeys() != 3 {
		t.Fatalf("the rich KV is not what the script meant to build: %v", snap)
	}
	restored, err := fsm.Restore(snap)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := restored.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if restored.ClusterID() != "group-1" {
		t.Errorf("restored cluster id %q, want group-1", restored.ClusterID())
	}
	if got := restored.Snapshot(); !proto.Equal(got, snap) {
		t.Fatalf("restored snapshot differs:\n got %v\nwant %v", got, snap)
	}
	if !bytes.Equal(snapshotBytes(t, restored), snapshotBytes(t, orig)) {
		t.Fatal("restored snapshot encodes to different bytes")
	}
	for _, q := range []struct {
		name string
		got  any
		want any
	}{
		{"Sessions", restored.Sessions(), orig.Sessions()},
		{"Locks", restored.Locks(""), orig.Locks("")},
		{"DelayedLocks", restored.DelayedLocks(), orig.DelayedLocks()},
		{"LastToken", restored.LastToken(), orig.LastToken()},
		{"KVRevision", restored.KVRevision(), orig.KVRevision()},
		{"NumKeys", restored.NumKeys(), orig.NumKeys()},
		{"List", listAll(restored), listAll(orig)},
	} {
		if !reflect.DeepEqual(q.got, q.want) {
			t.Fatalf("%s: restored %+v, original %+v", q.name, q.got, q.want)
		}
	}

	var failures, grants, events int
	for i, cmd := range followUp() {
		want := mustApply(t, orig, cmd)
		got := mustApply(t, restored, cmd)
		if !reflect.DeepEqual(cmpForm(got), cmpForm(want)) {
			t.Fatalf("follow-up %d %v: restored answered %s, original %s", i, cmd, describe(got), describe(want))
		}
		if !bytes.Equal(snapshotBytes(t, restored), snapshotBytes(t, orig)) {
			t.Fatalf("follow-up %d %v: states diverged", i, cmd)
		}
		if want.Err != nil {
			failures++
		}
		grants += len(want.Effects.Grants)
		events += len(want.Effects.Events)
	}
	// The follow-up must have exercised both paths for the comparison to mean anything.
	if failures < 8 || grants < 6 || events < 5 {
		t.Fatalf("follow-up made %d failures, %d grants and %d KV changes; the script no longer exercises the state", failures, grants, events)
	}
	if orig.KVRevision() != 13 {
		t.Fatalf("KV revision after the follow-up is %d, want 13", orig.KVRevision())
	}
}

// listAll returns every live key with its value as a string, so that
// values compare by content.
func listAll(s *fsm.State) []string {
	kvs, _ := s.List("", 0)
	var out []string
	for _, kv := range kvs {
		out = append(out, describeKV(kv))
	}
	return out
}

// TestSnapshotIsACopy proves a snapshot shares nothing with the state it
// was taken from or the state restored from it.
func TestSnapshotIsACopy(t *testing.T) {
	s := buildState(t, richScript())
	snap := s.Snapshot()
	want := snapshotBytes(t, s)
	for _, cmd := range followUp() {
		mustApply(t, s, cmd)
	}
	got, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("applying commands changed a snapshot taken earlier")
	}

	// Neither does the state restored from a snapshot share anything with it.
	restored, err := fsm.Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range followUp() {
		mustApply(t, restored, cmd)
	}
	got, err = proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatal("applying commands to a restored state changed the snapshot it came from")
	}
}

// TestRestoreEmpty proves an empty (or nil) snapshot restores to an empty
// state whose counters start afresh.
func TestRestoreEmpty(t *testing.T) {
	for _, snap := range []*fsmpb.Snapshot{{}, nil} {
		s, err := fsm.Restore(snap)
		if err != nil {
			t.Fatalf("Restore(%v): %v", snap, err)
		}
		if s.NumSessions() != 0 || s.NumLocks() != 0 || s.LastToken() != 0 || s.KVRevision() != 0 || s.NumKeys() != 0 {
			t.Fatalf("Restore(%v) is not empty", snap)
		}
		if res := mustApply(t, s, newSession()); res.CreateSession().SessionID != 1 {
			t.Fatalf("first session of a restored empty state is %d", res.CreateSession().SessionID)
		}
	}
}

// validSnapshot is a consistent snapshot: session 1 holds a (exclusive,
// token 1) with session 2 waiting; sessions 2 and 3 share b (tokens 2, 3);
// KV revision 5 with fenced key k, unfenced key p, tombstone t, and n, the
// tombstone a fenced delete of a key never written leaves.
func validSnapshot() *fsmpb.Snapshot {
	return &fsmpb.Snapshot{
		LastToken:     3,
		LastSessionId: 3,
		Sessions:      []*fsmpb.Session{{Id: 1, TtlNs: 1e9}, {Id: 2, TtlNs: 1e9}, {Id: 3, TtlNs: 1e9}},
		Locks: []*fsmpb.Lock{
			{Name: "a", Holders: []*fsmpb.Holder{{SessionId: 1, Token: 1, Mode: uint32(excl)}}, Waiters: []*fsmpb.Waiter{{SessionId: 2, Mode: uint32(excl)}}},
			{Name: "b", Holders: []*fsmpb.Holder{{SessionId: 2, Token: 2, Mode: uint32(shared)}, {SessionId: 3, Token: 3, Mode: uint32(shared)}}},
		},
		KvRevision: 5,
		Kvs: []*fsmpb.KV{
			{Key: "k", Value: []byte("v"), Token: 3, Lock: "b", HighestToken: 3, CreateRevision: 1, ModRevision: 4, Version: 2},
			{Key: "p", Value: []byte("x"), CreateRevision: 2, ModRevision: 2, Version: 1},
			{Key: "t", Token: 1, Lock: "a", HighestToken: 1, CreateRevision: 3, ModRevision: 5, Version: 1, Deleted: true},
			{Key: "n", HighestToken: 2, Deleted: true},
		},
	}
}

// TestRestoreRejectsInconsistentSnapshots breaks one invariant at a time in
// a valid snapshot and proves Restore refuses each, for that reason.
func TestRestoreRejectsInconsistentSnapshots(t *testing.T) {
	if _, err := fsm.Restore(validSnapshot()); err != nil {
		t.Fatalf("the valid snapshot is rejected: %v", err)
	}
	cases := []struct {
		name   string
		break_ func(s *fsmpb.Snapshot)
		// why is a word the error must contain, to show the snapshot was
		// rejected for the broken invariant and not another.
		why string
	}{
		{"holder session missing", func(s *fsmpb.Snapshot) { s.Sessions = s.Sessions[1:] }, "unknown session 1"},
		{"waiter session missing", func(s *fsmpb.Snapshot) { s.Locks[0].Waiters[0].SessionId = 9 }, "unknown session 9"},
		{"duplicate lock", func(s *fsmpb.Snapshot) { s.Locks = append(s.Locks, proto.Clone(s.Locks[0]).(*fsmpb.Lock)) }, "twice"},
		{"duplicate session", func(s *fsmpb.Snapshot) { s.Sessions = append(s.Sessions, &fsmpb.Session{Id: 2}) }, "twice"},
		{"two exclusive holders", func(s *fsmpb.Snapshot) {
			s.Locks[0].Waiters = nil
			s.Locks[0].Holders = append(s.Locks[0].Holders, &fsmpb.Holder{SessionId: 2, Token: 4, Mode: uint32(excl)})
			s.LastToken = 4
		}, "exclusive"},
		{"exclusive holder beside a shared one", func(s *fsmpb.Snapshot) { s.Locks[1].Holders[1].Mode = uint32(excl) }, "exclusive"},
		{"holder in an unknown mode", func(s *fsmpb.Snapshot) { s.Locks[0].Holders[0].Mode = 0 }, "mode"},
		{"token above the counter", func(s *fsmpb.Snapshot) { s.LastToken = 2 }, "token"},
		{"token zero", func(s *fsmpb.Snapshot) { s.Locks[0].Holders[0].Token = 0 }, "token"},
		{"one token on two locks", func(s *fsmpb.Snapshot) { s.Locks[1].Holders[0].Token = 1 }, "token 1"},
		{"session id above the counter", func(s *fsmpb.Snapshot) { s.LastSessionId = 2 }, "session id 3"},
		{"session id zero", func(s *fsmpb.Snapshot) { s.Sessions = append(s.Sessions, &fsmpb.Session{Id: 0}) }, "session id 0"},
		{"idle lock", func(s *fsmpb.Snapshot) { s.Locks = append(s.Locks, &fsmpb.Lock{Name: "c"}) }, "idle"},
		{"session holds and waits for one lock", func(s *fsmpb.Snapshot) {
			s.Locks[1].Waiters = []*fsmpb.Waiter{{SessionId: 2, Mode: uint32(excl)}}
		}, "twice"},
		{"session twice in a queue", func(s *fsmpb.Snapshot) {
			s.Locks[0].Waiters = append(s.Locks[0].Waiters, &fsmpb.Waiter{SessionId: 2, Mode: uint32(excl)})
		}, "twice"},
		{"duplicate key", func(s *fsmpb.Snapshot) { s.Kvs = append(s.Kvs, proto.Clone(s.Kvs[0]).(*fsmpb.KV)) }, `key "k" twice`},
		{"duplicate tombstone", func(s *fsmpb.Snapshot) {
			dup := proto.Clone(s.Kvs[0]).(*fsmpb.KV)
			dup.Key, dup.Deleted = "t", true
			s.Kvs = append(s.Kvs, dup)
		}, `key "t" twice`},
		{"key token above its highest", func(s *fsmpb.Snapshot) { s.Kvs[0].Token = 4 }, "token 4 above its highest 3"},
		{"tombstone token above its highest", func(s *fsmpb.Snapshot) { s.Kvs[2].Token = 2 }, "token 2 above its highest 1"},
		{"unfenced tombstone", func(s *fsmpb.Snapshot) { s.Kvs[2].Token, s.Kvs[2].Lock, s.Kvs[2].HighestToken = 0, "", 0 }, "unfenced tombstone"},
		{"unfenced never-written tombstone", func(s *fsmpb.Snapshot) { s.Kvs[3].HighestToken = 0 }, `key "n" is an unfenced tombstone`},
		{"key highest token above the counter", func(s *fsmpb.Snapshot) { s.Kvs[0].HighestToken = 4 }, `key "k" has highest token 4, above the last token issued 3`},
		{"tombstone highest token above the counter", func(s *fsmpb.Snapshot) { s.Kvs[3].HighestToken = math.MaxUint64 }, `key "n" has highest token 18446744073709551615`},
		{"lock without a token", func(s *fsmpb.Snapshot) { s.Kvs[1].Lock = "a" }, `key "p" names lock "a" without a token`},
		{"tombstone with a value", func(s *fsmpb.Snapshot) { s.Kvs[2].Value = []byte("x") }, `tombstone "t" has a value`},
		{"tombstone with version 0", func(s *fsmpb.Snapshot) { s.Kvs[2].Version = 0 }, `key "t" was created at revision 3 but has version 0`},
		{"never-written entry with a mod revision", func(s *fsmpb.Snapshot) { s.Kvs[3].ModRevision = 1 }, `key "n" was never written`},
		{"never-written entry with a version", func(s *fsmpb.Snapshot) { s.Kvs[3].Version = 1 }, `key "n" was never written`},
		{"never-written entry with a token", func(s *fsmpb.Snapshot) { s.Kvs[3].Token, s.Kvs[3].Lock = 1, "a" }, `key "n" was never written`},
		{"never-written live key", func(s *fsmpb.Snapshot) { s.Kvs[3].Deleted = false }, `key "n"`},
		{"key revision beyond the store's", func(s *fsmpb.Snapshot) { s.KvRevision = 4 }, `key "t" has revisions`},
		{"key created after its last change", func(s *fsmpb.Snapshot) { s.Kvs[0].CreateRevision = 5 }, `key "k" has revisions create 5, mod 4`},
		{"live key never written", func(s *fsmpb.Snapshot) { s.Kvs[1].CreateRevision, s.Kvs[1].ModRevision = 0, 0 }, `key "p"`},
		{"live key with version 0", func(s *fsmpb.Snapshot) { s.Kvs[1].Version = 0 }, `key "p"`},
		{"session holds a lock twice", func(s *fsmpb.Snapshot) {
			s.Locks[1].Holders = append(s.Locks[1].Holders, &fsmpb.Holder{SessionId: 3, Token: 4, Mode: uint32(shared)})
			s.LastToken = 4
		}, "twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			snap := validSnapshot()
			tc.break_(snap)
			s, err := fsm.Restore(snap)
			if err == nil {
				t.Fatalf("Restore accepted an inconsistent snapshot: %v", snap)
			}
			if s != nil {
				t.Fatal("Restore returned a state with its error")
			}
			if !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Restore rejected it for another reason: %v (want one mentioning %q)", err, tc.why)
			}
		})
	}
}

// TestRestoreKVQueries proves the valid snapshot's keys load as written:
// live keys readable, the tombstones hidden but still fencing, the live-key
// count (which max_keys uses) rebuilt.
func TestRestoreKVQueries(t *testing.T) {
	s, err := fsm.Restore(validSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	all(
		storeIs(5, 2),
		getIs("k", kvAt("k", "v", "b", 3, 3, 1, 4, 2)),
		getIs("p", kvAt("p", "x", "", 0, 0, 2, 2, 1)),
		notFound("t"),
		notFound("n"),
		listIs("", 0, false, "k", "p"),
	)(t, s)
	runSteps(t, s, []applyStep{
		{cmd: kvPut("t", "x"), want: fails(fence.ErrInvalidArgument)},
		{cmd: kvPut("t", "x", fenced("a", 0)), want: fails(fence.ErrInvalidArgument)},
		{cmd: kvPut("k", "x", fenced("b", 2)), want: fails(fence.ErrStaleToken)},
		{cmd: kvPut("q", "x", maxKeys(2)), want: fails(fence.ErrLimit)},
		{cmd: kvPut("t", "x", fenced("a", 1), strict, maxKeys(3)), want: wrote(6, kvAt("t", "x", "a", 1, 1, 6, 6, 1))},
		{cmd: kvPut("n", "x", fenced("b", 1)), want: fails(fence.ErrStaleToken), errMsg: "stale fencing token 1 < 2 for key n"},
		{cmd: kvPut("n", "x"), want: fails(fence.ErrInvalidArgument)},
		{cmd: kvPut("n", "x", fenced("b", 4)), want: fails(fence.ErrInvalidArgument)},
		{cmd: kvPut("n", "x", fenced("b", 2), expectRev(0)), want: wrote(7, kvAt("n", "x", "b", 2, 2, 7, 7, 1))},
	})
}

// TestRestoreRejectsLiveKeyWithoutRevision: a live key with create and mod
// revision 0 would look absent to a compare-and-swap, so a "create only if
// absent" put (expect revision 0) would overwrite it. Restore must refuse
// such a snapshot.
func TestRestoreRejectsLiveKeyWithoutRevision(t *testing.T) {
	snap := validSnapshot()
	snap.Kvs[1].CreateRevision, snap.Kvs[1].ModRevision = 0, 0
	s, err := fsm.Restore(snap)
	if err == nil {
		res := s.Apply(kvPut("p", "overwritten", expectRev(0)))
		t.Fatalf("Restore accepted a live key at revision 0; a create-only put of it then answered %s", describe(res))
	}
}

// TestRestoreRejectsWaiterInUnknownMode: a queued waiter in mode 0 would
// become a holder that breaks the invariants at the next hand-off, so
// Restore must refuse the snapshot.
func TestRestoreRejectsWaiterInUnknownMode(t *testing.T) {
	snap := validSnapshot()
	snap.Locks[0].Waiters[0].Mode = 0
	s, err := fsm.Restore(snap)
	if err == nil {
		res := s.Apply(release(1, "a", 1))
		t.Fatalf("Restore accepted a waiter in mode 0; releasing a then answered %s and CheckInvariants says %v", describe(res), s.CheckInvariants())
	}
}
