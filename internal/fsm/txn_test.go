// Table tests for the KV store's transactions (KVTxn): compares pick the
// list that runs, its writes apply at one revision or not at all (a stale
// token, an unfenced write of a fenced key, strict mode, a session not
// live, max_keys, a quota), gets read what the operations before them
// left, and an idempotency key answers a retry with the branch that ran.
package fsm_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

const (
	eq  = fsmpb.KVCompareOp_KV_COMPARE_OP_EQUAL
	neq = fsmpb.KVCompareOp_KV_COMPARE_OP_NOT_EQUAL
	lt  = fsmpb.KVCompareOp_KV_COMPARE_OP_LESS
	gt  = fsmpb.KVCompareOp_KV_COMPARE_OP_GREATER

	onValue   = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VALUE
	onVersion = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VERSION
	onCreate  = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_CREATE_REVISION
	onMod     = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_MOD_REVISION
	onAbsent  = fsmpb.KVCompareTarget_KV_COMPARE_TARGET_ABSENT
)

func ifValue(key string, op fsmpb.KVCompareOp, value string) *fsmpb.KVCompare {
	return &fsmpb.KVCompare{Key: key, Target: onValue, Op: op, Value: []byte(value)}
}

func ifNumber(key string, target fsmpb.KVCompareTarget, op fsmpb.KVCompareOp, n uint64) *fsmpb.KVCompare {
	return &fsmpb.KVCompare{Key: key, Target: target, Op: op, Number: n}
}

func ifAbsent(key string) *fsmpb.KVCompare { return &fsmpb.KVCompare{Key: key, Target: onAbsent} }

func tPut(key, value string) *fsmpb.KVTxnOp {
	return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Put{Put: &fsmpb.KVTxnPut{Key: key, Value: []byte(value)}}}
}

func tPutBound(key, value string, session uint64) *fsmpb.KVTxnOp {
	op := tPut(key, value)
	op.GetPut().SessionId = session
	return op
}

func tDel(key string) *fsmpb.KVTxnOp { return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Delete{Delete: key}} }
func tGet(key string) *fsmpb.KVTxnOp { return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Get{Get: key}} }

// ops is a list of txn operations.
func ops(o ...*fsmpb.KVTxnOp) []*fsmpb.KVTxnOp { return o }

// txn is a KVTxn command; opts set its fence, max_keys and user.
func txn(compares []*fsmpb.KVCompare, then, els []*fsmpb.KVTxnOp, opts ...kvOpt) *fsmpb.Command {
	a := kvOpts(opts)
	return &fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: &fsmpb.KVTxn{Compares: compares, Then: then, Else: els,
		Fence: &a.fence, MaxKeys: a.maxKeys, User: a.user}}}
}

// ifs is a txn's compares.
func ifs(c ...*fsmpb.KVCompare) []*fsmpb.KVCompare { return c }

// txnDid is the result of a txn that ran its then list (succeeded) or its
// else list, left the store at revision rev, answered ops and made events.
func txnDid(succeeded bool, rev uint64, answers []fsm.TxnOpAnswer, events ...fsm.KVEvent) fsm.Result {
	return fsm.Result{Answer: fsm.TxnAnswer{Succeeded: succeeded, Revision: rev, Ops: answers}, Effects: fsm.Effects{Events: events}}
}

func put(kv fsm.KeyValue) fsm.KVEvent { return fsm.KVEvent{KV: kv} }
func del(kv fsm.KeyValue) fsm.KVEvent { return fsm.KVEvent{Deleted: true, KV: kv} }

// found is a get's answer; none a put's, or a get's of a missing key.
func found(kv fsm.KeyValue) fsm.TxnOpAnswer { return fsm.TxnOpAnswer{Found: true, KV: kv} }

var none fsm.TxnOpAnswer

// TestApplyTxn runs the txn cases like TestApplyKV: exact results,
// invariants after every step, failed steps change nothing.
func TestApplyTxn(t *testing.T) {
	var untouched marker
	cases := []applyCase{
		{
			name: "then runs when every compare holds: its writes share one revision, gets read what came before them",
			steps: []applyStep{
				{cmd: kvPut("a", "1"), want: wrote(1, kvAt("a", "1", "", 0, 0, 1, 1, 1))},
				{cmd: kvPut("b", "2"), want: wrote(2, kvAt("b", "2", "", 0, 0, 2, 2, 1))},
				{cmd: txn(ifs(ifValue("a", eq, "1"), ifNumber("b", onMod, eq, 2)),
					ops(tGet("a"), tPut("a", "0"), tPut("b", "3"), tGet("a"), tDel("gone"), tPut("c", "new"), tGet("nope")),
					ops(tPut("a", "else"))),
					want: txnDid(true, 3, []fsm.TxnOpAnswer{found(kvAt("a", "1", "", 0, 0, 1, 1, 1)), none, none, found(kvAt("a", "0", "", 0, 0, 1, 3, 2)), none, none, none},
						put(kvAt("a", "0", "", 0, 0, 1, 3, 2)), put(kvAt("b", "3", "", 0, 0, 2, 3, 2)), put(kvAt("c", "new", "", 0, 0, 3, 3, 1)))},
			},
			check: all(storeIs(3, 3), getIs("b", kvAt("b", "3", "", 0, 0, 2, 3, 2))),
		},
		{
			name: "a compare that fails runs else; a txn that changes nothing makes no revision",
			steps: []applyStep{
				{cmd: kvPut("a", "1"), want: wrote(1, kvAt("a", "1", "", 0, 0, 1, 1, 1))},
				{cmd: txn(ifs(ifValue("a", eq, "1"), ifValue("a", eq, "2")), ops(tPut("a", "then")), ops(tGet("a"), tDel("b"))),
					want: txnDid(false, 1, []fsm.TxnOpAnswer{found(kvAt("a", "1", "", 0, 0, 1, 1, 1)), none})},
				{cmd: txn(ifs(ifAbsent("a")), ops(tPut("a", "then")), nil), want: txnDid(false, 1, nil)},
				{cmd: txn(nil, nil, nil), want: txnDid(true, 1, nil)},
				{cmd: txn(ifs(ifNumber("a", onVersion, gt, 0)), ops(tDel("a"), tGet("a")), nil),
					want: txnDid(true, 2, []fsm.TxnOpAnswer{{Deleted: true}, none}, del(kvAt("a", "", "", 0, 0, 1, 2, 1)))},
			},
			check: all(storeIs(2, 0), noEntry("a")),
		},
		{
			name: "a fenced txn applies whole for the holder and is refused whole, naming the key, for a stale token",
			steps: script(sessions(2), []applyStep{
				{cmd: acquire(1, "L", excl), want: granted(1, "L", 1, excl)},
				{cmd: txn(nil, ops(tPut("x", "10"), tPut("y", "0")), nil, fenced("L", 1), strict),
					want: txnDid(true, 1, []fsm.TxnOpAnswer{none, none}, put(kvAt("x", "10", "L", 1, 1, 1, 1, 1)), put(kvAt("y", "0", "L", 1, 1, 1, 1, 1)))},
				{cmd: expireSessions(1), want: ended(fsm.Expired, 1)},
				{cmd: acquire(2, "L", excl), want: granted(2, "L", 2, excl)},
				{cmd: txn(nil, ops(tPut("y", "1")), nil, fenced("L", 2)),
					want: txnDid(true, 2, []fsm.TxnOpAnswer{none}, put(kvAt("y", "1", "L", 2, 2, 1, 2, 2)))},
				// The stale holder moves a unit from x to y: x alone would be accepted, y refuses the whole txn.
				{cmd: txn(nil, ops(tPut("x", "9"), tPut("y", "1")), nil, fenced("L", 1)), want: fails(fence.ErrStaleToken),
					errMsg: "stale fencing token 1 < 2 for key y", after: untouched.mark},
				{cmd: txn(nil, ops(tPut("x", "9"), tPut("y", "1")), nil, fenced("L", 1), strict), want: fails(fence.ErrNotHolder)},
				{cmd: txn(nil, ops(tDel("y")), nil), want: fails(fence.ErrInvalidArgument)},                     // unfenced write of a fenced key
				{cmd: txn(nil, ops(tPut("z", "")), nil, fenced("L", 3)), want: fails(fence.ErrInvalidArgument)}, // never issued
				// A compare that fails runs else, which writes nothing: not refused, whatever the token.
				{cmd: txn(ifs(ifValue("x", eq, "nope")), ops(tPut("x", "9")), nil, fenced("L", 1)), want: txnDid(false, 2, nil), after: untouched.same},
				{cmd: txn(nil, ops(tPut("x", "9"), tDel("y"), tDel("never")), nil, fenced("L", 2)),
					want: txnDid(true, 3, []fsm.TxnOpAnswer{none, {Deleted: true}, none}, put(kvAt("x", "9", "L", 2, 2, 1, 3, 2)), del(kvAt("y", "", "L", 2, 2, 1, 3, 2)))},
			}),
			locks: []fsm.LockInfo{{Name: "L", Holders: []fsm.HolderInfo{holding(2, 2, excl)}}},
			check: all(storeIs(3, 1), tombstoneIs("y", 2), tombstoneIs("never", 2)),
		},
		{
			name: "malformed txns are refused whole: a key written twice, an expected revision, a compare or operation of no kind",
			steps: []applyStep{
				{cmd: txn(nil, ops(tPut("a", "1"), tDel("a")), nil), want: fails(fence.ErrInvalidArgument), errMsg: "fence: invalid argument: a txn writes key a twice in one list"},
				{cmd: txn(nil, nil, ops(tPut("a", "1"), tPut("a", "2"))), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(nil, ops(tPut("a", "1")), nil, expectRev(0)), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(ifs(&fsmpb.KVCompare{Key: "a", Target: onAbsent, Op: lt}), nil, nil), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(ifs(&fsmpb.KVCompare{Key: "a", Target: 9}), nil, nil), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(ifs(&fsmpb.KVCompare{Key: "a", Op: 9}), nil, nil), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(nil, ops(&fsmpb.KVTxnOp{}), nil), want: fails(fence.ErrInvalidArgument)},
				{cmd: txn(nil, ops(tGet("a"), tGet("a"), tPut("a", "1")), nil), want: txnDid(true, 1, []fsm.TxnOpAnswer{none, none, none}, put(kvAt("a", "1", "", 0, 0, 1, 1, 1)))},
			},
		},
		{
			name: "max_keys counts what the txn creates and deletes; a session not live refuses the txn; bound keys go with their session",
			steps: script(sessions(1), []applyStep{
				{cmd: kvPut("a", "1"), want: wrote(1, kvAt("a", "1", "", 0, 0, 1, 1, 1))},
				{cmd: txn(nil, ops(tPut("b", "1"), tPut("c", "1")), nil, maxKeys(2)), want: fails(fence.ErrLimit),
					errMsg: "fence: limit reached: the KV store has 1 keys and the txn would make 3, over its limit of 2"},
				{cmd: txn(nil, ops(tPutBound("b", "1", 1), tDel("a")), nil, maxKeys(1)),
					want: txnDid(true, 2, []fsm.TxnOpAnswer{none, {Deleted: true}}, put(fsm.KeyValue{Key: "b", Value: val("1"), CreateRevision: 2, ModRevision: 2, Version: 1, Session: 1}), del(kvAt("a", "", "", 0, 0, 1, 2, 1)))},
				{cmd: txn(nil, ops(tPut("a", "1"), tPutBound("c", "1", 7)), nil), want: fails(fence.ErrSessionNotFound)},
				{cmd: closeSession(1), want: withEvents(ended(fsm.Closed, 1), del(kvAt("b", "", "", 0, 0, 2, 3, 1)))},
			}),
			check: storeIs(3, 0),
		},
	}
	runApplyCases(t, cases, true)
}

// TestTxnCompares: each target and op on a live key, a missing key and a
// tombstone. A missing key has version and revisions 0 and no value: a
// value compare on it fails, whatever its op.
func TestTxnCompares(t *testing.T) {
	s := fsm.NewState()
	issueTokens(t, s, 1)                 // revision 0 still
	mustApply(t, s, kvPut("k", "m"))     // 1
	mustApply(t, s, kvPut("other", "x")) // 2
	mustApply(t, s, kvPut("k", "m"))     // 3: k is version 2, create 1, mod 3
	mustApply(t, s, kvPut("t", "x", fenced("issuer", 1)))
	mustApply(t, s, kvDel("t", fenced("issuer", 1))) // a tombstone
	for _, tc := range []struct {
		c    *fsmpb.KVCompare
		want bool
	}{
		{ifValue("k", eq, "m"), true}, {ifValue("k", eq, "n"), false}, {ifValue("k", neq, "n"), true},
		{ifValue("k", lt, "n"), true}, {ifValue("k", gt, "l"), true}, {ifValue("k", gt, "m"), false},
		{ifValue("none", eq, ""), false}, {ifValue("none", neq, "x"), false}, {ifValue("t", neq, "x"), false},
		{ifNumber("k", onVersion, eq, 2), true}, {ifNumber("k", onVersion, lt, 2), false}, {ifNumber("k", onVersion, gt, 1), true},
		{ifNumber("k", onCreate, eq, 1), true}, {ifNumber("k", onCreate, neq, 1), false},
		{ifNumber("k", onMod, eq, 3), true}, {ifNumber("k", onMod, lt, 4), true}, {ifNumber("k", onMod, gt, 3), false},
		{ifNumber("none", onVersion, eq, 0), true}, {ifNumber("none", onCreate, eq, 0), true}, {ifNumber("t", onMod, eq, 0), true},
		{ifNumber("t", onMod, gt, 0), false},
		{ifAbsent("none"), true}, {ifAbsent("t"), true}, {ifAbsent("k"), false},
		{&fsmpb.KVCompare{Key: "k", Target: onAbsent, Op: neq}, true}, {&fsmpb.KVCompare{Key: "t", Target: onAbsent, Op: neq}, false},
	} {
		res := mustApply(t, s, txn(ifs(tc.c), nil, nil))
		if _, ok := res.Answer.(fsm.TxnAnswer); res.Err != nil || !ok || res.Txn().Succeeded != tc.want {
			t.Errorf("compare %v: %s, want succeeded %v", tc.c, describe(res), tc.want)
		}
	}
}

// TestTxnQuota: a txn's puts are charged to its user as a put's are, its
// deletes free what they held, and a txn that would leave the user over
// the quota is refused whole.
func TestTxnQuota(t *testing.T) {
	s := fsm.NewState()
	applyAll(t, s, addUser("root"), grantRole("root", "root"), addUser("alice"), setQuotaOf("alice", fsm.Quota{MaxKVBytes: 10}), setEnabled(true))
	mustApply(t, s, kvPut("k1", "abcd", byUser("alice"))) // 6 bytes
	for i, st := range []struct {
		cmd  *fsmpb.Command
		want string
	}{
		{txn(nil, ops(tPut("k2", "ab"), tPut("k3", "")), nil, byUser("alice")), "user alice: kv bytes quota 10 reached; the txn's 2 puts would make 12"},
		{txn(nil, ops(tPut("k2", "ab"), tDel("k1")), nil, byUser("alice")), ""}, // frees k1: 4
		{txn(nil, ops(tPut("k2", "abcdefgh")), nil, byUser("alice")), ""},       // her own key: 10
		{txn(nil, ops(tPut("k3", "")), nil, byUser("alice")), "kv bytes quota 10"},
		{txn(nil, ops(tDel("k2"), tGet("k2")), nil, byUser("alice")), ""}, // deletes alone are never refused
	} {
		res := mustApply(t, s, st.cmd)
		switch {
		case st.want == "" && res.Err != nil:
			t.Fatalf("step %d: %v", i, res.Err)
		case st.want != "" && (!errors.Is(res.Err, fence.ErrLimit) || !strings.Contains(res.Err.Error(), st.want)):
			t.Fatalf("step %d: %v, want ErrLimit with %q", i, res.Err, st.want)
		}
	}
	if u := s.UserUsage("alice"); u.KVBytes != 0 {
		t.Fatalf("alice is charged %d bytes, want 0", u.KVBytes)
	}
	mustRestore(t, s)
}

// TestTxnIdempotencyKey: a keyed txn's retry is not applied again; it
// answers the first application's revision and branch.
func TestTxnIdempotencyKey(t *testing.T) {
	s := fsm.NewState()
	cmd := txn(ifs(ifAbsent("a")), ops(tPut("a", "1")), ops(tGet("a")))
	cmd.IdempotencyKey = "k1"
	if res := mustApply(t, s, cmd); res.Err != nil || !res.Txn().Succeeded || res.Txn().Revision != 1 {
		t.Fatalf("first: %s", describe(res))
	}
	again := mustRestore(t, s).Apply(cmd)
	if want := (fsm.Repeat{Revision: 1, Changed: true, Succeeded: true}); !sameResult(again, fsm.Result{Answer: want}) {
		t.Fatalf("retry: %s, want only Repeat %+v", describe(again), want)
	}
	other := txn(ifs(ifAbsent("a")), ops(tPut("a", "1")), ops(tGet("a")))
	other.IdempotencyKey = "k2"
	if res := mustApply(t, s, other); res.Err != nil || res.Txn().Succeeded {
		t.Fatalf("second key: %s", describe(res))
	}
	if res := s.Apply(other); !sameResult(res, fsm.Result{Answer: fsm.Repeat{Revision: 1}}) {
		t.Fatalf("retry of the else: %s", describe(res))
	}
}
