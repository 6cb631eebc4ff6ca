package fsm

// Transactions of the fenced KV store (KVTxn, protocol 5), as etcd's Txn:
// compares on keys, then one list of puts, deletes and gets when every
// compare holds, else another, all in one command. A failed compare is no
// error: it picks the else list. The writes of the list that runs are
// checked first, each as a single write of the txn's fence would be (the
// fenced write rule, a token issued, strict mode), then the txn's limits
// on its totals (max_keys, the user's kv bytes quota); the first refusal
// refuses the whole command, which changes nothing. Otherwise every write
// applies at one new revision (none when the txn changes nothing anyone
// can see), and each get reads its key as the operations before it left
// it. A key is written at most once in each list, so that no two events
// of a revision are of one key.

import (
	"bytes"
	"cmp"
	"fmt"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// TxnAnswer answers a KVTxn.
type TxnAnswer struct {
	// Succeeded is true when every compare held and then ran, false when
	// else ran.
	Succeeded bool
	// Revision is the KV store's revision after the txn: the one its
	// writes made, or the unchanged one when it changed nothing.
	Revision uint64
	// Ops answers the operations of the list that ran, in order.
	Ops []TxnOpAnswer
}

// TxnOpAnswer answers one operation of a txn. A put has nothing of its
// own to answer: its key's mod revision is the txn's.
type TxnOpAnswer struct {
	// Deleted is true for a delete that removed a live key.
	Deleted bool
	// Found and KV answer a get: whether the key exists, and the key (a
	// copy that shares nothing with the state).
	Found bool
	KV    KeyValue
}

// kvTxn applies a KVTxn all or nothing.
func (s *State) kvTxn(c *fsmpb.KVTxn) Result {
	if err := checkTxnShape(c); err != nil {
		return Result{Err: err}
	}
	succeeded := true
	for _, cmp := range c.GetCompares() {
		succeeded = succeeded && s.compareHolds(cmp)
	}
	ops := c.GetThen()
	if !succeeded {
		ops = c.GetElse()
	}
	if err := s.checkTxnWrites(ops, c.GetFence(), c.GetMaxKeys(), c.GetUser()); err != nil {
		return Result{Err: err}
	}
	ans, eff := s.applyTxnOps(ops, c.GetFence(), c.GetUser())
	ans.Succeeded = succeeded
	return Result{Answer: ans, Effects: eff}
}

// checkTxnShape refuses a txn that no state could apply as asked: a fence
// with an expected revision, a compare or an operation of no known kind,
// a key written twice in one list.
func checkTxnShape(c *fsmpb.KVTxn) error {
	if f := c.GetFence(); f != nil && f.ExpectRevision != nil {
		return fmt.Errorf("%w: a txn's fence has no expected revision; compare the keys' mod revisions instead", fence.ErrInvalidArgument)
	}
	for _, cmp := range c.GetCompares() {
		if _, ok := fsmpb.KVCompareTarget_name[int32(cmp.GetTarget())]; !ok {
			return fmt.Errorf("%w: txn compare on key %s has an unknown target (%d)", fence.ErrInvalidArgument, cmp.GetKey(), cmp.GetTarget())
		}
		switch op := cmp.GetOp(); {
		case fsmpb.KVCompareOp_name[int32(op)] == "":
			return fmt.Errorf("%w: txn compare on key %s has an unknown op (%d)", fence.ErrInvalidArgument, cmp.GetKey(), op)
		case cmp.GetTarget() == fsmpb.KVCompareTarget_KV_COMPARE_TARGET_ABSENT &&
			op != fsmpb.KVCompareOp_KV_COMPARE_OP_EQUAL && op != fsmpb.KVCompareOp_KV_COMPARE_OP_NOT_EQUAL:
			return fmt.Errorf("%w: txn compare on key %s: whether a key is absent is compared with equal or not equal", fence.ErrInvalidArgument, cmp.GetKey())
		}
	}
	for _, ops := range [][]*fsmpb.KVTxnOp{c.GetThen(), c.GetElse()} {
		written := map[string]bool{}
		for _, op := range ops {
			var key string
			switch o := op.GetOp().(type) {
			case *fsmpb.KVTxnOp_Put:
				key = o.Put.GetKey()
			case *fsmpb.KVTxnOp_Delete:
				key = o.Delete
			case *fsmpb.KVTxnOp_Get:
				continue
			default:
				return fmt.Errorf("%w: a txn operation of no known kind", fence.ErrInvalidArgument)
			}
			if written[key] {
				return fmt.Errorf("%w: a txn writes key %s twice in one list", fence.ErrInvalidArgument, key)
			}
			written[key] = true
		}
	}
	return nil
}

// compareHolds evaluates one compare. A missing key (absent, or a
// tombstone) has version and revisions 0 and no value: a value compare
// on it fails, whatever its op, as etcd's does.
func (s *State) compareHolds(c *fsmpb.KVCompare) bool {
	e := s.kv[c.GetKey()]
	var kv KeyValue
	if e.live() {
		kv = e.kv
	}
	var order int
	switch c.GetTarget() {
	case fsmpb.KVCompareTarget_KV_COMPARE_TARGET_ABSENT:
		return e.live() == (c.GetOp() == fsmpb.KVCompareOp_KV_COMPARE_OP_NOT_EQUAL)
	case fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VALUE:
		if !e.live() {
			return false
		}
		order = bytes.Compare(kv.Value, c.GetValue())
	case fsmpb.KVCompareTarget_KV_COMPARE_TARGET_VERSION:
		order = cmp.Compare(kv.Version, c.GetNumber())
	case fsmpb.KVCompareTarget_KV_COMPARE_TARGET_CREATE_REVISION:
		order = cmp.Compare(kv.CreateRevision, c.GetNumber())
	case fsmpb.KVCompareTarget_KV_COMPARE_TARGET_MOD_REVISION:
		order = cmp.Compare(kv.ModRevision, c.GetNumber())
	}
	switch c.GetOp() {
	case fsmpb.KVCompareOp_KV_COMPARE_OP_NOT_EQUAL:
		return order != 0
	case fsmpb.KVCompareOp_KV_COMPARE_OP_LESS:
		return order < 0
	case fsmpb.KVCompareOp_KV_COMPARE_OP_GREATER:
		return order > 0
	}
	return order == 0
}

// checkTxnWrites decides whether the writes of ops may apply: each one as
// a single write fenced by f (in order: the first refused names its key),
// each put's session, then the totals against maxKeys and user's kv bytes
// quota. It changes nothing. The keys written are distinct, so that no
// write's check depends on another's.
func (s *State) checkTxnWrites(ops []*fsmpb.KVTxnOp, f *fsmpb.KVFence, maxKeys uint64, user string) error {
	created, removed := 0, 0
	for _, op := range ops {
		switch o := op.GetOp().(type) {
		case *fsmpb.KVTxnOp_Put:
			key := o.Put.GetKey()
			e := s.kv[key]
			if err := s.checkKVFence(key, e, f); err != nil {
				return err
			}
			if id := o.Put.GetSessionId(); id != 0 {
				if _, err := s.session(id); err != nil {
					return err
				}
			}
			if !e.live() {
				created++
			}
		case *fsmpb.KVTxnOp_Delete:
			e := s.kv[o.Delete]
			if err := s.checkKVFence(o.Delete, e, f); err != nil {
				return err
			}
			if e.live() {
				removed++
			}
		}
	}
	if after := s.liveKeys + created - removed; maxKeys > 0 && created > 0 && uint64(after) > maxKeys {
		return fmt.Errorf("%w: the KV store has %d keys and the txn would make %d, over its limit of %d", fence.ErrLimit, s.liveKeys, after, maxKeys)
	}
	return s.checkTxnQuota(ops, user)
}

// checkTxnQuota refuses a txn with puts that would leave user's keys over
// the user's kv bytes quota, counting what its puts and deletes free.
func (s *State) checkTxnQuota(ops []*fsmpb.KVTxnOp, user string) error {
	q, ok := s.quotaOf(user)
	if !ok || q.MaxKVBytes == 0 {
		return nil
	}
	used, puts := s.UserUsage(user).KVBytes, 0
	for _, op := range ops {
		var key string
		switch o := op.GetOp().(type) {
		case *fsmpb.KVTxnOp_Put:
			key, puts = o.Put.GetKey(), puts+1
			used += uint64(len(key) + len(o.Put.GetValue()))
		case *fsmpb.KVTxnOp_Delete:
			key = o.Delete
		default:
			continue
		}
		if e := s.kv[key]; e.live() && e.user == user {
			used -= kvCharge(e)
		}
	}
	if puts > 0 && used > q.MaxKVBytes {
		return fmt.Errorf("%w: user %s: kv bytes quota %d reached; the txn's %d puts would make %d; delete keys or raise the quota (fence user set-quota)",
			fence.ErrLimit, user, q.MaxKVBytes, puts, used)
	}
	return nil
}

// applyTxnOps applies the checked operations of a txn's list, its writes
// at one new revision, and answers them (all but Succeeded) with the
// events of the writes.
func (s *State) applyTxnOps(ops []*fsmpb.KVTxnOp, f *fsmpb.KVFence, user string) (TxnAnswer, Effects) {
	var ans TxnAnswer
	var eff Effects
	if len(ops) > 0 {
		ans.Ops = make([]TxnOpAnswer, len(ops))
	}
	bumped := false
	write := func() {
		if !bumped {
			s.kvRevision++
			bumped = true
		}
	}
	for i, op := range ops {
		switch o := op.GetOp().(type) {
		case *fsmpb.KVTxnOp_Put:
			key := o.Put.GetKey()
			var owner *session
			if id := o.Put.GetSessionId(); id != 0 {
				owner = s.sessions[id]
			}
			write()
			eff.Events = append(eff.Events, s.putKey(key, s.kv[key], o.Put.GetValue(), f, owner, user))
		case *fsmpb.KVTxnOp_Delete:
			e := s.kv[o.Delete]
			if !e.live() {
				s.recordToken(o.Delete, e, f.GetToken())
				continue
			}
			write()
			eff.Events = append(eff.Events, s.deleteKey(e, f))
			ans.Ops[i].Deleted = true
		case *fsmpb.KVTxnOp_Get:
			if kv, ok := s.Get(o.Get); ok {
				ans.Ops[i] = TxnOpAnswer{Found: true, KV: kv}
			}
		}
	}
	ans.Revision = s.kvRevision
	return ans, eff
}
