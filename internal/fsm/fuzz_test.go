// Native fuzz tests. FuzzStateMachine proves, for any command stream the
// fuzzer makes, what runStream checks: docs/design.md invariants 1, 2, 4, 5, 6
// (fenced KV) and 7 after every step, and the exact answers to acquire
// requests, their cancels and idempotency keys (see requestModel).
// FuzzApplyBytes proves that no log entry, however malformed, panics
// FSM.ApplyBatch, breaks the state's invariants or half-applies: bytes that
// do not decode fail alone with ErrInvalidArgument and change nothing, and
// bytes that do decode are checked by the same model as any command. Both
// run their seed corpus as ordinary tests.
package fsm_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// FuzzStateMachine decodes the input into a command stream (see
// commandSource) and runs runStream on it.
func FuzzStateMachine(f *testing.F) {
	// Sessions 1..4 exist after runStream's prologue. An acquire is
	// {4, session, lock+mode, options}: session byte 8*i picks live session
	// i+1, lock+mode byte 3*k picks lock "a" in mode k (0 exclusive, 1 shared),
	// 3*k+1 lock "b" and 3*k+2 lock "c" (in semaphore mode for k 2, 3, 5..7);
	// a byte of 192 or more is a semaphore acquire of lock "a", "b" or "c".
	// Options: bit 0 try, 0x04 a 1 s lock-delay, and 0x40 (0x80) a semaphore
	// of 2 (3) permits if the name is idle, else the semaphore's own number;
	// 0xc0 a wrong number of permits (see acquirePermits).
	f.Add([]byte{})
	f.Add([]byte{
		4, 0, 0, 0, // session 1 acquires a
		4, 8, 0, 0, // session 2 queues for a
		4, 16, 3, 0, // session 3 queues for a, shared
		11, 0, 0, // the holder of a releases it
		8, 16, 0, // session 3 cancels its wait
	})
	f.Add([]byte{
		4, 0, 0, 4, // session 1 acquires a with a 2 s lock-delay
		4, 8, 0, 0, // session 2 queues for a
		14, 0, 0, // the holder of a expires: a is delayed
		4, 16, 0, 1, // session 3 tries a: locked
		13, 0, // the delayed lock is lifted
	})
	f.Add([]byte{
		4, 0, 3, 0, 4, 8, 3, 0, // sessions 1 and 2 share a
		4, 16, 0, 0, // session 3 queues exclusive
		4, 24, 3, 0, // session 4 queues shared behind it
		15, 0, 0, // everyone on a expires in one command, holders first
	})
	f.Add([]byte{
		4, 0, 0, 0, 4, 8, 0, 0, 4, 16, 0, 0, // 1 holds a, 2 and 3 wait
		3, 1, 0, 8, // sessions 1 and 2 expire together
		10, 0, 0, // a release with a wrong token
		0, 0x33, 0xff, // a session with a limit, an empty command
	})
	f.Add([]byte{ // a new leader raises the token floor, then grants above it
		4, 0, 0, 0, // session 1 acquires a: token 1
		0xfe, 228, // the floor rises to 101
		0xfe, 0, // a floor below the last token changes nothing
		4, 8, 1, 0, // session 2 acquires b: token 102
	})
	f.Add([]byte{ // leaders name the group: badly, then twice
		0xfd, 0, // an empty id is refused
		0xfd, 1, // the group is g1
		0xfd, 2, // a second name changes nothing
	})
	f.Add([]byte{ // a semaphore of 2 permits on a
		4, 0, 192, 0x40, // session 1 takes a as a semaphore of 2 permits: token 1
		4, 8, 192, 0x40, // session 2 takes the second permit: token 2
		4, 16, 192, 0x41, // session 3 tries: all permits taken
		4, 16, 192, 0x40, // session 3 queues
		4, 24, 192, 0x00, // session 4 queues (naming the semaphore's 2 permits)
		4, 24, 192, 0xc0, // session 4 names 3 permits: invalid
		4, 24, 0, 0, // session 4 asks for a as an exclusive lock: invalid
		11, 0, 0, // the first holder of a (session 1) releases: session 3 granted
		14, 0, 0, // the first holder of a (session 2) expires: session 4 granted
		15, 0, 0, // everyone on a expires: a is forgotten
		4, 0, 0, 0, // session 1 takes a as an exclusive lock
	})
	f.Add([]byte{ // lock-delay on a semaphore of 3 permits on c, several grants in one command
		4, 0, 23, 0x84, // session 1 takes c as a semaphore of 3 permits, with a 1 s lock-delay
		4, 8, 23, 0, // session 2 takes a second permit
		4, 16, 23, 0, // session 3 the third
		4, 24, 23, 0, // session 4 queues
		0, 0, // session 5
		4, 32, 23, 0, // session 5 queues
		14, 2, 0, // the first holder of c (session 1) expires: c is delayed
		11, 2, 0, // the first holder of c (now session 2) releases: no grant under delay
		4, 0, 23, 1, // session 2 tries c: locked under delay
		13, 0, // the delay lifts: sessions 4 and 5 granted in one command
		4, 8, 0, 0, // session 3 takes a as an exclusive lock
		4, 16, 192, 0x40, // session 4 asks for a as a semaphore: invalid
		4, 16, 23, 0xc0, // session 4 names 1 permit for c: invalid
		0, 0, 0, 0, // sessions 6 and 7
		4, 32, 23, 0, // session 6 queues for c
		4, 40, 23, 0, // session 7 queues for c
		3, 1, 8, 16, // sessions 3 and 4, holders of c, expire together: 6 and 7 granted
		15, 2, 0, // everyone on c expires: c is forgotten
		4, 0, 2, 0, // session 2 takes c as an exclusive lock
	})
	// A KV command is {op, key+lock, token choice, options} with op
	// 0xa0..0xfe (see kvOp): 0xa4 puts "v1", 0xa8 puts "v2", 0xa0 puts "",
	// 0xa3 deletes. Key byte 0 is "x", 1 "y", 2 "orders/17", each fenced by
	// lock "a". Token choice 0 is no token, 1 a holder's token, 3 the key's
	// highest, 4 one below it, 5 the last issued, 7 one above it (never
	// issued), 0x0f 2^64-1, 0x16 token 1. Options 0x00 strict, 0x02 plain,
	// 0x06 CAS on the current revision, 0x0e CAS on 0, 0x12 CAS on a wrong
	// revision, 0x82 max_keys 1, 0xa2 max_keys 2.
	f.Add([]byte{ // the article's timeline
		4, 0, 0, 0, // session 1 acquires a: token 1
		0xa4, 2, 1, 0x00, // strict put of orders/17 with token 1
		14, 0, 0, // the holder of a expires
		4, 8, 0, 0, // session 3 acquires a: token 2
		0xa4, 2, 1, 0x00, // strict put with token 2
		0xa8, 2, 4, 0x02, // put with token 1: stale
		0xa4, 2, 0x16, 0x00, // strict put with token 1: stale
		0xa0, 2, 0, 0x02, // unfenced put: refused
		0xa3, 2, 3, 0x02, // delete with token 2: tombstone
		0xa4, 2, 4, 0x02, // put with token 1 on the tombstone: stale
	})
	f.Add([]byte{ // compare-and-swap, max_keys, tombstones, no-op deletes
		4, 0, 0, 0, // session 1 acquires a: token 1
		0xa4, 0, 0, 0x0e, // put x if absent
		0xa4, 0, 0, 0x0e, // again: revision mismatch
		0xa4, 0, 0, 0x06, // CAS on x's revision
		0xa4, 0, 0, 0x12, // CAS on a wrong revision
		0xa4, 1, 5, 0x82, // fenced put of y (token 1) with max_keys 1: limit
		0xa4, 1, 5, 0xa2, // with max_keys 2
		0xa3, 1, 3, 0x02, // fenced delete of y: tombstone
		0xa3, 1, 3, 0x02, // again: no-op
		0xa3, 0, 0, 0x02, // unfenced delete of x: gone
		0xa4, 1, 0, 0x02, // unfenced put on y's tombstone: refused
		0xa3, 2, 5, 0x02, // fenced delete of orders/17, never written: a tombstone with token 1
		0xa4, 2, 0, 0x02, // unfenced put on it: refused
		0xa4, 1, 7, 0x02, // put of y with token 2, never issued: refused
		0xa4, 1, 0x0f, 0x02, // with 2^64-1: refused
		11, 0, 0, // the holder of a releases it
		4, 0, 0, 0, // and takes it again: token 2
		0xa3, 2, 5, 0x02, // no-op delete of orders/17 with token 2: its highest is now 2
		0xa4, 2, 0x16, 0x02, // put with token 1: stale
	})
	// A put's high nibble binds its key (see putBinding): 0xa to no
	// session, 0xb to a live one (picked by key byte>>4), 0xc to the holder
	// of its fencing lock, 0xd to one not live (key byte>>4 0: the next id,
	// never created), 0xe to the newest live one. A close (2) or an expiry
	// (3) with op 0x12 or 0x13 ends the sessions keys are bound to (a byte
	// per id: key byte 0 is "x", 1 "y", 2 "orders/17"; see keyOwner).
	f.Add([]byte{ // keys bound to sessions
		4, 0, 0, 0, // session 1 acquires a: token 1
		4, 8, 0, 0, // session 2 queues for a
		0xc4, 0, 1, 0x02, // put x fenced by a with token 1, bound to a's holder, session 1: revision 1
		0xb4, 2, 0, 0x02, // unfenced put of orders/17, bound to session 1: revision 2
		0xb8, 0x10, 0, 0x02, // unfenced put of y, bound to session 2: revision 3
		0xd4, 0, 1, 0x02, // put x with token 1, bound to session 5, never created: session not found
		0xd4, 0, 4, 0x02, // put x with token 0, bound to session 5: refused for the token first
		0xe4, 0x10, 0, 0x02, // put y again, rebound to the newest session, 4: revision 4
		0x12, 0, // the session x is bound to (1) closes: orders/17 and x deleted (x keeps its tombstone), a goes to session 2
		0xb4, 2, 0, 0x02, // put orders/17, bound to session 2
		0x13, 1, 1, 2, // the sessions of y (4) and orders/17 (2) expire together: y deleted, then orders/17
	})
	// An auth change is {0xfc, op, a, b} (see authOp): op%12 picks the
	// change, a the user (and a kind, a prefix), b the role (and an access).
	f.Add([]byte{
		0xfc, 0, 0, 0, // enable: refused, no root user
		0xfc, 1, 0, 0, // add user root
		0xfc, 3, 0, 0, // grant root the root role
		0xfc, 0, 0, 0, // enable
		0xfc, 2, 0, 0, // remove root: refused while enabled
		0xfc, 4, 0, 0, // revoke root's root role: refused while enabled
		0xfc, 1, 1, 0, // add user u1
		0xfc, 5, 0, 1, // add role r1
		0xfc, 7, 0x10, 0x24, // grant r1 lock write on prefix ""
		0xfc, 7, 0x14, 0x10, // grant r1 lock read on prefix "a"
		0xfc, 7, 0x14, 0x10, // again: refused
		0xfc, 7, 0x34, 0x10, // admin with a prefix: refused
		0xfc, 7, 0x30, 0x10, // admin read
		0xfc, 3, 1, 1, // grant u1 r1
		0xfc, 9, 1, 1, // a token for u1: id 1
		0xfc, 9, 1, 1, // the same secret again: refused
		0xfc, 9, 0, 7, // a short hash: refused
		0xfc, 9, 3, 2, // an expiry below 0: refused
		0xfc, 10, 1, 0, // revoke token 1
		0xfc, 9, 1, 2, // another token for u1: id 2
		0xfc, 8, 0x10, 0x24, // revoke r1's lock write
		0xfc, 6, 0, 1, // remove role r1: taken from u1
		0xfc, 2, 1, 0, // remove u1: its token goes
		0xfc, 0, 1, 0, // disable
	})
	for seed := range uint64(3) {
		f.Add(boundKeyStream(rand.New(rand.NewPCG(seed, 5)), 120))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3 {
		data := make([]byte, 200)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		f.Add(data)
	}
	for seed := range uint64(3) {
		f.Add(semaphoreStream(rand.New(rand.NewPCG(seed, 3)), 100))
	}
	// An op byte's high nibble reaches requests and keys (see
	// commandSource.next): an acquire {h<<4|4, ...} carries request id h
	// for h 1..3, the id of the session's own wait or grant for 4 (a
	// retry), the id it cancelled last for 5, 1 plus one more byte for 6.
	// A CancelAcquire is {h<<4|12, lock, x}, a CancelWait by request
	// {h<<4|8, lock, x}: for h 1, x&0x3f picks a holder or waiter of the
	// lock with a request id (holders first) and x>>6 names its request
	// whole (0), at its attempt (1), at the attempt before (2), or
	// another request of its session (3); for h 9 no request id (see
	// requestTarget). {h<<4|1, ...} puts key k1..k4 (h 1..4), the longest
	// key (5) or one over it (6) on the command that follows; {h<<4|1, b}
	// with h 7..9 retries the keyed command b+1 back (see keyedCommand).
	f.Add([]byte{
		0x14, 0, 0, 0, // session 1 takes a under request 1: attempt 1
		0x14, 8, 0, 0, // session 2 queues for a under request 1: attempt 2
		0x44, 8, 0, 0, // session 2 retries its request: the wait taken over, attempt 3
		0x24, 0, 0, 0, // session 1 asks for a under request 2: told of its grant, attempt 0
		0x14, 16, 0, 1, // session 3 tries a under request 1: locked
		0x1c, 0, 0x81, // CancelAcquire of session 2's request at attempt 2, taken over: nothing
		0x18, 0, 0x41, // CancelWait of session 2's request at attempt 3: dropped
		0x14, 16, 0, 0, // session 3 queues for a under request 1
		0x1c, 0, 0x00, // CancelAcquire of session 1's request 1, whole: released, a goes to session 3
		0x14, 0, 0, 0, // session 1 retries request 1: cancelled
		0x54, 0, 0, 0, // and again, as the id it cancelled last: cancelled
		0x18, 0, 0xc0, // CancelWait of another request of session 3 (2): nothing
		0x18, 0, 0x40, // CancelWait of session 3's request at its attempt: answers the grant
		0x9c, 0, 0, // CancelAcquire without a request id: invalid
		0x98, 0, 0, // a legacy CancelWait
	})
	f.Add([]byte{
		0x11, 0, 0x10, // CreateSession under key k1: session 5
		0x71, 0, // retried: Repeat of session 5, no session made
		0x21, 0xa4, 0, 0, 0x02, // unfenced put of x under key k2: revision 1
		0x71, 0, // retried: Repeat of revision 1, changed
		0x21, 0xa3, 1, 0, 0x02, // a delete of y under key k2: Repeat of the put
		0x31, 0, 0x50, // CreateSession under key k3, with a limit of 5 sessions: fails, leaves no key
		2, 0, // session 1 closes
		0x71, 0, // the CreateSession retried: applied now, session 6
		0x71, 0, // and again: Repeat of session 6
		0x61, 0, 0, // a key over the limit: invalid
		0x51, 0xa3, 1, 0, 0x02, // a delete of y, absent, under the longest key: revision 1, nothing changed
		0x71, 0, // retried: Repeat of revision 1, unchanged
		0x41, 0x14, 0, 0, 0, // session 2 takes a under request 1 and key k4
		0x71, 0, // retried: Repeat with nothing to report, no new attempt
	})
	for seed := range uint64(3) {
		f.Add(requestStream(rand.New(rand.NewPCG(seed, 4)), 100, 0))
	}
	f.Add(cancelStormStream(rand.New(rand.NewPCG(0, 4))))
	for seed := range uint64(2) {
		f.Add(quotaStream(rand.New(rand.NewPCG(seed, 4)), 100))
	}
	// A txn is a delete op byte of high nibble 0xe or 0xf followed by its
	// header, fence and parts (see commandSource.txnOp).
	f.Add([]byte{
		4, 0, 0, 0, // session 1 acquires a: token 1
		0xe3, 0x04, 0, 1, 0x02, // a txn fenced by a's holder, no compare, then of 2 operations:
		0x00, 1, // put x = v1
		0x01, 2, // put y = v2: both at revision 1
		0xe3, 0x15, 0, 1, 0x00, // strict, one compare, then of 2, else of 1:
		0x00, 0x00, // x's value is its own: holds
		0x08, 0, // delete x
		0x0d, 0, // get y
		0x0c, 0, // (else) get x
		14, 0, 0, // the holder of a expires
		4, 8, 0, 0, // session 2 acquires a: token 2
		0xe3, 0x04, 0, 1, 0x02, 0x01, 3, 0x02, 1, // put y, put orders/17 with token 2
		0xe3, 0x04, 0, 0x16, 0x02, 0x00, 1, 0x01, 1, // put x, put y with token 1: stale, for y
	})
	for seed := range uint64(3) {
		f.Add(txnStream(rand.New(rand.NewPCG(seed, 6)), 100))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runStream(t, data)
	})
}

// unknownValue reports whether cmd holds an enum value this version does
// not name (a session end, a txn compare's target or op): it decodes as a
// number, without a trace of being new.
func unknownValue(cmd *fsmpb.Command) bool {
	cmds := append([]*fsmpb.Command{cmd}, cmd.GetBatch().GetCommands()...)
	for _, c := range cmds {
		if fsmpb.SessionEnd_name[int32(c.GetCloseSession().GetEnd())] == "" {
			return true
		}
		for _, cmp := range c.GetKvTxn().GetCompares() {
			if fsmpb.KVCompareTarget_name[int32(cmp.GetTarget())] == "" || fsmpb.KVCompareOp_name[int32(cmp.GetOp())] == "" {
				return true
			}
		}
	}
	return false
}

// FuzzApplyBytes feeds the input, whole and halved, as raft command entries
// to an FSM holding locks, waiters, a delay, KV keys (some bound to
// sessions, one of them fenced), a tombstone and a full semaphore with a
// waiter, one entry at a time and again as one batch.
func FuzzApplyBytes(f *testing.F) {
	for _, cmd := range []*fsmpb.Command{
		newSession(),
		acquire(1, "a", excl, withDelay(time.Second)),
		acquire(3, "b", shared, try, maxWaiters(1)),
		acquire(2, "c", fsm.Mode(7)),
		release(1, "a", 1),
		release(2, "b", 99),
		cancelWait(3, "a"),
		closeSession(2),
		expireSessions(1, 2, 3, 1, 0),
		liftDelay("c"),
		kvPut("k", "v", fenced("a", 1), strict, expectRev(1)),
		kvPut("k", "v", fenced("a", 0)),
		kvPut("t", "v", fenced("b", 2), maxKeys(2)),
		kvDel("t", fenced("b", 9)),
		kvDel("k", fenced("a", 1), expectRev(0)),
		kvDel("new", fenced("a", 1)),
		kvPut("k", "v", fenced("a", math.MaxUint64)),
		{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k"}}}, // no fence
		{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "p"}}},
		{},
		acquire(1, "s", sem, permits(2), try),
		acquire(1, "s", sem, permits(2)),
		acquire(1, "s", sem, permits(3)),
		acquire(1, "s", shared),
		acquire(1, "a", sem, permits(1)),
		acquire(1, "c", sem, permits(2)),
		acquire(1, "d", sem),
		acquire(1, "d", excl, permits(1)),
		acquire(1, "d", sem, permits(math.MaxUint32)),
		release(5, "s", 5),
		expireSessions(5, 3),
		{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: "n1", ApiAddress: "127.0.0.1:7000"}}},
		{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: "n1"}}}, // unregisters
		{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{ApiAddress: "127.0.0.1:7000"}}},
		// Keys bound to sessions: p to session 3, q (fenced) and r to 2.
		kvPut("n", "v", boundTo(3)),
		kvPut("p", "w", boundTo(5)),
		kvPut("p", "w"),
		kvPut("n", "v", boundTo(4)),                                // expired
		kvPut("n", "v", boundTo(99), maxKeys(1)),                   // the session is checked before the limit
		kvPut("k", "v", fenced("a", 0), boundTo(99)),               // the fence is checked before the session
		kvPut("q", "v", fenced("b", 3), expectRev(0), boundTo(99)), // and so is a CAS
		kvDel("r"),
		kvDel("q", fenced("b", 3)),
		closeSession(3),
		expireSessions(3, 2),
		// Acquire requests: session 3 holds d under request 7 (attempt
		// 1), session 2 waits for it under request 7 (attempt 2);
		// session 1 gave up request 9.
		acquire(3, "d", excl, withRequest(7)),
		acquire(3, "d", excl, withRequest(8)),
		acquire(2, "d", excl, withRequest(7), try),
		acquire(1, "z", excl, withRequest(9)),
		acquire(5, "a", excl, withRequest(2), try),
		cancelAcquire(3, "d", 7, 0),
		cancelAcquire(3, "d", 7, 1),
		cancelAcquire(2, "d", 7, 1),
		cancelAcquire(2, "d", 7, 2),
		cancelAcquire(2, "d", 0, 0),
		cancelAcquire(9, "d", 7, 0),
		cancelWaitOf(2, "d", 7, 2),
		cancelWaitOf(3, "d", 7, 1),
		cancelWaitOf(3, "d", 8, 0),
		// Idempotency keys: k1 was applied.
		keyedCmd("k1", kvPut("u", "v")),
		keyedCmd("k1", newSession()),
		keyedCmd("k2", newSession()),
		keyedCmd("k3", acquire(9, "a", excl)),
		keyedCmd(strings.Repeat("k", fsm.MaxIdempotencyKeyBytes+1), kvPut("u", "w")),
		keyedCmd(strings.Repeat("k", fsm.MaxIdempotencyKeyBytes), kvDel("u")),
		// Txns: fenced, stale, malformed, one whose compare fails, keyed.
		txn(ifs(ifValue("k", eq, "v"), ifAbsent("x")), ops(tPut("k", "w"), tPut("x", "1"), tDel("p"), tGet("k")), ops(tGet("k")), fenced("a", 1), strict),
		txn(nil, ops(tPut("x", "1"), tPut("k", "w")), nil, fenced("a", 0)),
		txn(nil, ops(tPut("x", "1"), tPut("x", "2")), nil),
		txn(ifs(ifNumber("k", onMod, gt, 99)), nil, ops(tDel("k"), tPutBound("y", "v", 3)), fenced("a", 1), maxKeys(1)),
		txn(ifs(&fsmpb.KVCompare{Key: "k", Target: 9}), nil, nil),
		keyedCmd("k1", txn(nil, ops(tPut("u", "w")), nil)),
		keyedCmd("k9", txn(nil, ops(tPut("u", "w")), nil)),
		// Batches: commands in order, a batch inside, a keyed batch.
		batchOf(newSession(), release(1, "a", 1), keyedCmd("k1", kvPut("u", "w")), batchOf(), acquire(2, "a", excl), txn(nil, ops(tPut("b1", "")), nil)),
		keyedCmd("b", batchOf(newSession())),
		batchOf(),
	} {
		data, err := fsm.Encode(cmd)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0x22, 0x05, 0x12, 0x03, 0xc3, 0x28})       // acquire whose lock name is invalid UTF-8
	f.Add([]byte{0x0a, 0x00, 0x0a, 0x00, 0xf8, 0x01, 0x01}) // repeated field and an unknown one
	f.Fuzz(func(t *testing.T, data []byte) {
		one, batch := fsm.New(nil), fsm.New(nil)
		check := newModelChecker()
		var index uint64
		entry := func(data []byte) *raft.Log {
			index++
			return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
		}
		var logs []*raft.Log
		var want []fsm.Result
		// applyOne applies one entry to the checked FSM and queues the same
		// entry for the batched one.
		applyOne := func(data []byte) {
			t.Helper()
			l := entry(data)
			logs = append(logs, l)
			var before []byte
			one.Read(func(s *fsm.State) { before = snapshotBytes(t, s) })
			out := one.ApplyBatch([]*raft.Log{l})
			res, ok := out[0].(fsm.Result)
			if !ok {
				t.Fatalf("ApplyBatch returned %T, not a Result", out[0])
			}
			want = append(want, res)
			var cmd fsmpb.Command
			one.Read(func(s *fsm.State) {
				if halt := (*fsm.HaltError)(nil); errors.As(res.Err, &halt) && halt.Index != index {
					if !bytes.Equal(before, snapshotBytes(t, s)) {
						t.Fatal("an entry after one not understood changed the state")
					}
					return
				}
				if err := proto.Unmarshal(data, &cmd); err != nil {
					if !errors.Is(res.Err, fence.ErrInvalidArgument) {
						t.Fatalf("entry that does not decode (%v) answered %s", err, describe(res))
					}
					if err := s.CheckInvariants(); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(before, snapshotBytes(t, s)) {
						t.Fatal("entry that does not decode changed the state")
					}
					return
				}
				if halt := (*fsm.HaltError)(nil); errors.As(res.Err, &halt) {
					// A newer version's entry (or one after it): nothing
					// is applied, and the FSM said so for a reason.
					var known fsmpb.Command
					_ = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, &known)
					if halt.Index == index && proto.Equal(&known, &cmd) && !strings.Contains(halt.What, "protocol") && !unknownValue(&cmd) {
						t.Fatalf("%v: halted on an entry with nothing unknown in it: %v", &cmd, res.Err)
					}
					if !bytes.Equal(before, snapshotBytes(t, s)) {
						t.Fatal("an entry not understood changed the state")
					}
					return
				}
				if err := check.observe(t, &cmd, res, s, before); err != nil {
					t.Fatalf("%v: %v", &cmd, err)
				}
			})
		}
		// A state with holders, waiters, a delayed lock, a semaphore of 2
		// permits, both taken (session 2 waits), keys bound to sessions 2
		// and 3, a grant and a wait under requests, a cancelled request and
		// a keyed command applied, for the fuzzed entry to act on.
		for _, cmd := range []*fsmpb.Command{
			newSession(), newSession(), newSession(), newSession(),
			acquire(1, "a", excl, withDelay(time.Second)), acquire(2, "a", excl),
			acquire(3, "b", shared), acquire(2, "b", shared), acquire(4, "b", excl),
			acquire(4, "c", excl, withDelay(time.Second)), expireSessions(4),
			kvPut("k", "v", fenced("a", 1), strict), kvPut("t", "v", fenced("b", 3), strict),
			kvDel("t", fenced("b", 3)), kvPut("p", "v"),
			newSession(), acquire(5, "s", sem, permits(2)), acquire(3, "s", sem, permits(2)), acquire(2, "s", sem, permits(2)),
			kvPut("p", "v", boundTo(3)), kvPut("q", "v", fenced("b", 3), boundTo(2)), kvPut("r", "v", boundTo(2)),
			acquire(3, "d", excl, withRequest(7)), acquire(2, "d", excl, withRequest(7)), cancelAcquire(1, "z", 9, 0),
			keyedCmd("k1", kvPut("u", "v")),
		} {
			applyOne(mustEncode(t, cmd))
		}
		applyOne(data)
		half := len(data) / 2
		applyOne(data[:half])
		applyOne(data[half:])
		applyOne(data)

		// The same entries in one batch, with a configuration entry in the
		// middle, give the same results and the same state.
		mid := len(logs) / 2
		batchLogs := append(append(append([]*raft.Log{}, logs[:mid]...), &raft.Log{Index: 0, Type: raft.LogConfiguration, Data: data}), logs[mid:]...)
		out := batch.ApplyBatch(batchLogs)
		if out[mid] != nil {
			t.Fatalf("configuration entry answered %v", out[mid])
		}
		out = append(out[:mid], out[mid+1:]...)
		for i, o := range out {
			if res, ok := o.(fsm.Result); !ok || !sameAnswer(res, want[i]) {
				t.Fatalf("entry %d in a batch answered %v, alone %s", i, o, describe(want[i]))
			}
		}
		one.Read(func(a *fsm.State) {
			batch.Read(func(b *fsm.State) {
				if !bytes.Equal(snapshotBytes(t, a), snapshotBytes(t, b)) {
					t.Fatal("batched and one-by-one application left different states")
				}
			})
		})
	})
}
