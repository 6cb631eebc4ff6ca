// The txn half of the KV model checker. kvModel.expectTxn says, from the
// model alone, what a KVTxn must answer:
//
//   - a malformed txn (a fence with an expected revision, a compare of an
//     unknown target or op, "absent" compared otherwise than with equal or
//     not equal, an operation of no kind, a key written twice in one list)
//     fails with ErrInvalidArgument;
//   - otherwise the compares pick the list: then if every one holds (a
//     missing key has version and revisions 0, and fails every value
//     compare), else otherwise; a failed compare is no error;
//   - each write of that list, in order, is checked as a single write with
//     the txn's fence (fenceRefusal), each put's session must be live, then
//     max_keys on the keys the txn leaves (when it creates one) and the
//     user's kv bytes quota (when it puts); the first refusal fails the
//     whole txn with a single write's error, naming that key, and changes
//     nothing;
//   - otherwise every write applies at one new revision (none when no key
//     changes), events in the list's order, each get answers its key as
//     the operations before it left it, and a fenced delete of a missing
//     key records its token as a single one does.
//
// kvModel.observe then checks the answer exactly, invariant 6 on every
// event, and compare checks the state against the model as after any
// command.
package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// isKVWrite reports whether cmd is a KV command the kvModel follows: a
// put, a delete or a txn.
func isKVWrite(cmd *fsmpb.Command) bool {
	_, _, _, _, _, ok := kvCommand(cmd)
	return ok || cmd.GetKvTxn() != nil
}

// txnWrite returns the key an operation of a txn writes, and whether it
// is a put; ok is false for a get (or an operation of no kind).
func txnWrite(op *fsmpb.KVTxnOp) (key string, isPut, ok bool) {
	if p := op.GetPut(); p != nil {
		return p.GetKey(), true, true
	}
	if d, isDel := op.GetOp().(*fsmpb.KVTxnOp_Delete); isDel {
		return d.Delete, false, true
	}
	return "", false, false
}

// txnMalformed says why no state could apply t, "" if one could.
func txnMalformed(t *fsmpb.KVTxn) string {
	if f := t.GetFence(); f != nil && f.ExpectRevision != nil {
		return "an expected revision"
	}
	for _, c := range t.GetCompares() {
		target, op := c.GetTarget(), c.GetOp()
		switch {
		case target < onValue || target > onAbsent:
			return "a compare target"
		case op < eq || op > gt:
			return "a compare op"
		case target == onAbsent && op != eq && op != neq:
			return "absent compared in order"
		}
	}
	for _, list := range [][]*fsmpb.KVTxnOp{t.GetThen(), t.GetElse()} {
		seen := map[string]bool{}
		for _, op := range list {
			if op.GetOp() == nil {
				return "an operation of no kind"
			}
			key, _, ok := txnWrite(op)
			if !ok {
				continue
			}
			if seen[key] {
				return "a key written twice"
			}
			seen[key] = true
		}
	}
	return ""
}

// holds evaluates a compare on the model.
func (k *kvModel) holds(c *fsmpb.KVCompare) bool {
	e := k.keys[c.GetKey()]
	live := e != nil && !e.deleted
	if c.GetTarget() == onAbsent {
		if c.GetOp() == eq {
			return !live
		}
		return live
	}
	if c.GetTarget() == onValue && !live {
		return false
	}
	var kv fsm.KeyValue
	if live {
		kv = e.kv
	}
	order := 0
	switch c.GetTarget() {
	case onValue:
		order = bytes.Compare(kv.Value, c.GetValue())
	case onVersion, onCreate, onMod:
		have := map[fsmpb.KVCompareTarget]uint64{onVersion: kv.Version, onCreate: kv.CreateRevision, onMod: kv.ModRevision}[c.GetTarget()]
		switch {
		case have < c.GetNumber():
			order = -1
		case have > c.GetNumber():
			order = 1
		}
	}
	return map[fsmpb.KVCompareOp]bool{eq: order == 0, neq: order != 0, lt: order < 0, gt: order > 0}[c.GetOp()]
}

// clone returns a copy of the model's store that shares nothing with it.
func (k *kvModel) clone() *kvModel {
	out := *k
	out.keys, out.accepted = map[string]*modelKey{}, map[string]uint64{}
	for key, e := range k.keys {
		c := *e
		out.keys[key] = &c
	}
	for key, t := range k.accepted {
		out.accepted[key] = t
	}
	return &out
}

// expectTxn returns what a KVTxn must answer, and a commit that applies
// it to the model when it succeeds (see the file comment).
func (k *kvModel) expectTxn(t *fsmpb.KVTxn, holders map[string][]fsm.HolderInfo, lastToken uint64, sessions map[uint64]bool) (fsm.Result, func()) {
	nothing := func() {}
	if why := txnMalformed(t); why != "" {
		return fails(fence.ErrInvalidArgument), nothing
	}
	succeeded := true
	for _, c := range t.GetCompares() {
		succeeded = succeeded && k.holds(c)
	}
	list := t.GetThen()
	if !succeeded {
		list = t.GetElse()
	}
	f, user := t.GetFence(), t.GetUser()
	created, removed, puts := 0, 0, 0
	used := k.charged(user)
	limit, quota := k.quota(user)
	for _, op := range list {
		key, isPut, ok := txnWrite(op)
		if !ok {
			continue
		}
		if refusal := k.fenceRefusal(key, f, holders, lastToken); refusal.Err != nil {
			return refusal, nothing
		}
		if sid := op.GetPut().GetSessionId(); sid != 0 && !sessions[sid] {
			return fsm.Result{Err: fmt.Errorf("%w: session %d does not exist or has expired; create a new session", fence.ErrSessionNotFound, sid)}, nothing
		}
		e := k.keys[key]
		live := e != nil && !e.deleted
		switch {
		case isPut && !live:
			created++
		case !isPut && live:
			removed++
		}
		if live && e.user == user {
			used -= uint64(len(key) + len(e.kv.Value))
		}
		if isPut {
			puts++
			used += uint64(len(key) + len(op.GetPut().GetValue()))
		}
	}
	if max := t.GetMaxKeys(); max > 0 && created > 0 && uint64(k.liveKeys()+created-removed) > max {
		return fails(fence.ErrLimit), nothing
	}
	if quota && puts > 0 && used > limit {
		k.note("quota: kv bytes quota refused a txn")
		return fails(fence.ErrLimit), nothing
	}
	next := k.clone()
	res := next.applyTxn(list, f, user)
	res = editAnswer(res, func(a *fsm.TxnAnswer) { a.Succeeded = succeeded })
	return res, func() { k.rev, k.keys, k.accepted = next.rev, next.keys, next.accepted }
}

// applyTxn applies the checked operations of a txn's list to the model
// and returns what the txn answers (all but Succeeded) and its events.
func (k *kvModel) applyTxn(list []*fsmpb.KVTxnOp, f *fsmpb.KVFence, user string) fsm.Result {
	token, lock := f.GetToken(), f.GetLock()
	if token == 0 {
		lock = ""
	}
	var res fsm.Result
	var ans fsm.TxnAnswer
	if len(list) > 0 {
		ans.Ops = make([]fsm.TxnOpAnswer, len(list))
	}
	rev := k.rev + 1
	for i, op := range list {
		key, isPut, isWrite := txnWrite(op)
		if !isWrite {
			key = op.GetGet()
		}
		e := k.keys[key]
		live := e != nil && !e.deleted
		var highest uint64
		if e != nil {
			highest = e.kv.HighestToken
		}
		switch {
		case !isWrite:
			if live {
				kv := e.kv
				kv.Value = val(string(kv.Value))
				ans.Ops[i] = fsm.TxnOpAnswer{Found: true, KV: kv}
			}
			continue
		case !isPut && !live:
			if token > 0 {
				if e == nil {
					k.keys[key] = &modelKey{kv: fsm.KeyValue{Key: key}, deleted: true}
				}
				k.keys[key].kv.HighestToken = max(highest, token)
				k.accepted[key] = max(k.accepted[key], token)
			}
			continue
		}
		k.rev = rev
		kv := fsm.KeyValue{Key: key, CreateRevision: rev}
		if live {
			kv = e.kv
		}
		kv.Token, kv.Lock, kv.HighestToken, kv.ModRevision = token, lock, max(highest, token), rev
		k.accepted[key] = max(k.accepted[key], token)
		if isPut {
			kv.Value, kv.Session = val(string(op.GetPut().GetValue())), op.GetPut().GetSessionId()
			kv.Version++
			k.keys[key] = &modelKey{kv: kv, user: user}
			res.Effects.Events = append(res.Effects.Events, fsm.KVEvent{KV: kv})
			continue
		}
		kv.Value, kv.Session = nil, 0
		k.keys[key] = &modelKey{kv: kv, deleted: true}
		if kv.HighestToken == 0 {
			delete(k.keys, key)
		}
		res.Effects.Events = append(res.Effects.Events, fsm.KVEvent{Deleted: true, KV: kv})
		ans.Ops[i].Deleted = true
	}
	ans.Revision = k.rev
	res.Answer = ans
	return res
}

// txnOp decodes a KVTxn from the bytes after its op byte (a delete op
// byte of high nibble 0xe or 0xf, see kvOp): a header h, whose bits 0-1
// count the compares (0..3), 2-3 the operations of then (1, 2, 2, 3), 4-5
// those of else (0, 0, 1, 2), and 6-7 pick max_keys (0, 0, 2, 3); three
// bytes k, t, o that fence it as kvOp fences a write of kvKeys[k%3] (the
// lock, the token, strict, no fence at all; o>>2 of 7 asks for an
// expected revision, which a txn refuses), k's top bits its user; then two
// bytes a compare, two an operation (see txnCompare, txnOperation).
func (c *commandSource) txnOp(s *fsm.State) *fsmpb.Command {
	h, k, t, o := c.byte(), c.byte(), c.byte(), c.byte()
	key, lock := kvKeys[int(k)%len(kvKeys)], lockName(k>>2)
	txn := &fsmpb.KVTxn{MaxKeys: []uint64{0, 0, 2, 3}[h>>6], User: putWriter(k)}
	if t&0x0f != 0x08 {
		txn.Fence = &fsmpb.KVFence{Lock: lock, Token: tokenChoice(s, lock, highestOf(s, key), t)}
		txn.Fence.Strict = o&3 == 0 || (o&3 == 1 && t&7 <= 2)
		if (o>>2)&7 == 7 {
			txn.Fence.ExpectRevision = new(uint64)
		}
	}
	for range h & 3 {
		txn.Compares = append(txn.Compares, txnCompare(s, c.byte(), c.byte()))
	}
	for range []int{1, 2, 2, 3}[(h>>2)&3] {
		txn.Then = append(txn.Then, txnOperation(s, lock, c.byte(), c.byte()))
	}
	for range []int{0, 0, 1, 2}[(h>>4)&3] {
		txn.Else = append(txn.Else, txnOperation(s, lock, c.byte(), c.byte()))
	}
	return &fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: txn}}
}

// tokenChoice picks a write's token as kvOp does from t: 0, a current
// holder's of lock, the key's highest, one below it (stale), the last
// issued, a small issued one, or one never issued.
func tokenChoice(s *fsm.State, lock string, highest uint64, t byte) uint64 {
	switch t & 7 {
	case 1, 2:
		if h, ok := holderOf(s, lock, t>>3); ok {
			return h.Token
		}
		return s.LastToken()
	case 3:
		return highest
	case 4:
		return max(highest, 1) - 1
	case 5:
		return s.LastToken()
	case 6:
		return uint64(t>>4) % (s.LastToken() + 1)
	case 7:
		if t&0x08 != 0 {
			return math.MaxUint64 - uint64(t>>6)
		}
		return s.LastToken() + 1 + uint64(t>>6)
	}
	return 0
}

// txnCompare decodes a compare of kvKeys[a%3]: a>>2&7 picks the target
// (value, version, create revision, mod revision, absent, value, mod
// revision, or absent compared in order, which is refused), a>>5&3 the op
// (for absent, a>>5&1: equal or not equal); b picks the operand: for a
// value, the key's own (b even) or one of "", v1, v2, v3; for a number,
// the key's own, or one above or below it. b of 0xff is an op no version
// knows.
func txnCompare(s *fsm.State, a, b byte) *fsmpb.KVCompare {
	key := kvKeys[int(a)%len(kvKeys)]
	kv, _ := s.Get(key)
	target := []fsmpb.KVCompareTarget{onValue, onVersion, onCreate, onMod, onAbsent, onValue, onMod, onAbsent}[(a>>2)&7]
	c := &fsmpb.KVCompare{Key: key, Target: target, Op: fsmpb.KVCompareOp((a >> 5) & 3)}
	switch {
	case b == 0xff:
		c.Op = 7
	case (a>>2)&7 == 7:
		c.Op = lt
	case target == onAbsent:
		c.Op = fsmpb.KVCompareOp((a >> 5) & 1)
	case target == onValue && b&1 == 0:
		c.Value = kv.Value
	case target == onValue:
		c.Value = []byte([]string{"", "v1", "v2", "v3"}[(b>>1)&3])
	default:
		n := map[fsmpb.KVCompareTarget]uint64{onVersion: kv.Version, onCreate: kv.CreateRevision, onMod: kv.ModRevision}[target]
		switch (b >> 1) & 3 {
		case 2:
			n++
		case 3:
			n = max(n, 1) - 1
		}
		c.Number = n
	}
	return c
}

// txnOperation decodes an operation on kvKeys[x%3]: x>>2&3 picks a put
// (0, 1), a delete (2) or a get (3), and x>>4 of 0xf one of no kind; y&3
// the value ("", v1, v2, v3), and y>>2&7 a put's binding: none (0..4), a
// live session (5, picked by y>>5), the holder of lock (6, a live session
// if it has none), or a session not live (7).
func txnOperation(s *fsm.State, lock string, x, y byte) *fsmpb.KVTxnOp {
	key := kvKeys[int(x)%len(kvKeys)]
	if x>>4 == 0xf {
		return &fsmpb.KVTxnOp{}
	}
	switch (x >> 2) & 3 {
	case 2:
		return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Delete{Delete: key}}
	case 3:
		return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Get{Get: key}}
	}
	put := &fsmpb.KVTxnPut{Key: key, Value: []byte([]string{"", "v1", "v2", "v3"}[y&3])}
	live := s.Sessions()
	switch (y >> 2) & 7 {
	case 5:
		if len(live) > 0 {
			put.SessionId = live[int(y>>5)%len(live)].ID
		}
	case 6:
		if h, ok := holderOf(s, lock, y>>5); ok {
			put.SessionId = h.Session
		} else if len(live) > 0 {
			put.SessionId = live[int(y>>5)%len(live)].ID
		}
	case 7:
		put.SessionId = s.Snapshot().GetLastSessionId() + 1
	}
	return &fsmpb.KVTxnOp{Op: &fsmpb.KVTxnOp_Put{Put: put}}
}

// txnOutcomes names the paths a KVTxn reached, so that
// TestRandomCommandStreams can show its streams reach them.
func txnOutcomes(cmd *fsmpb.Command, res fsm.Result) []string {
	t := cmd.GetKvTxn()
	if t == nil {
		return nil
	}
	var out []string
	add := func(o string) { out = append(out, "txn: "+o) }
	for _, e := range []struct {
		err  error
		name string
	}{
		{fence.ErrStaleToken, "stale"}, {fence.ErrInvalidArgument, "invalid"}, {fence.ErrNotHolder, "not holder"},
		{fence.ErrLimit, "limit"}, {fence.ErrSessionNotFound, "session not found"},
	} {
		if errors.Is(res.Err, e.err) {
			add(e.name)
		}
	}
	var stale *fence.StaleTokenError
	if errors.As(res.Err, &stale) {
		for _, op := range append(append([]*fsmpb.KVTxnOp(nil), t.GetThen()...), t.GetElse()...) {
			if key, _, ok := txnWrite(op); ok {
				if key != stale.Key {
					add("refused by a write after another")
				}
				break
			}
		}
	}
	if neverIssued(res.Err) {
		add("never issued")
	}
	ans, ok := res.Answer.(fsm.TxnAnswer)
	if res.Err != nil || !ok {
		return out
	}
	list := t.GetThen()
	if ans.Succeeded {
		add("then ran")
	} else {
		add("else ran")
		list = t.GetElse()
	}
	switch {
	case len(res.Effects.Events) > 1:
		add("several writes at one revision")
	case len(res.Effects.Events) == 0:
		add("changed nothing")
	}
	written := map[string]bool{}
	for i, op := range list {
		key, isPut, isWrite := txnWrite(op)
		switch {
		case !isWrite && written[op.GetGet()]:
			add("a get after a write of its key")
		case !isWrite && ans.Ops[i].Found:
			add("a get found its key")
		case isPut && op.GetPut().GetSessionId() != 0:
			add("a bound put")
		case !isPut && isWrite && !ans.Ops[i].Deleted && t.GetFence().GetToken() > 0:
			add("fenced no-op delete")
		}
		written[key] = isWrite
	}
	if t.GetFence().GetStrict() && len(res.Effects.Events) > 0 {
		add("strict writes")
	}
	return out
}

// txnStream returns the input of a stream of about n commands that are
// mostly txns (see commandSource.txnOp for the encoding): sessions and
// acquires of the fencing locks, holders that release or expire, single
// puts, and txns of distinct keys fenced by a holder's token, a stale one,
// an unfenced one or strict, with compares that hold or not, some with
// max_keys, bound puts and gets, now and then a malformed one; some carry
// an idempotency key, and are retried.
func txnStream(r *rand.Rand, n int) []byte {
	session := func() byte { return byte(8 * r.IntN(8)) }
	var data []byte
	for range n {
		switch x := r.IntN(100); {
		case x < 8: // a session
			data = append(data, 0, byte(r.IntN(0x30)))
		case x < 22: // an exclusive acquire of "a", "b" or "c"
			data = append(data, 4, session(), byte(r.IntN(3)), 0)
		case x < 28: // a holder releases, or its session expires
			data = append(data, []byte{11, 14}[r.IntN(2)], byte(r.IntN(3)), byte(r.IntN(256)))
		case x < 36: // a fenced put with a holder's token
			data = append(data, 0xa4, byte(r.IntN(256)), 1, 0x02)
		case x < 40: // a retry of a keyed command made before
			data = append(data, 0x71, byte(r.IntN(4)))
		default: // a txn, now and then keyed
			if r.IntN(5) == 0 {
				data = append(data, byte(1+r.IntN(6))<<4|1)
			}
			nc, nt, ne := r.IntN(3), r.IntN(4), r.IntN(4)
			h := byte(nc) | byte(nt)<<2 | byte(ne)<<4 | []byte{0, 0, 0, 0x80, 0xc0}[r.IntN(5)]
			t := []byte{1, 1, 1, 2, 3, 4, 4, 5, 7, 0x08}[r.IntN(10)]
			o := []byte{0x02, 0x02, 0x02, 0x00, 0x01, 0x1e}[r.IntN(6)]
			data = append(data, []byte{0xe3, 0xf3, 0xe7, 0xf7}[r.IntN(4)], h, byte(r.IntN(256)), t, o)
			for range nc {
				a := byte(r.IntN(3)) | byte(r.IntN(7))<<2 | byte(r.IntN(4))<<5
				data = append(data, a, byte(r.IntN(255)))
			}
			keys := r.Perm(3)
			for _, count := range []int{[]int{1, 2, 2, 3}[nt], []int{0, 0, 1, 2}[ne]} {
				for i := range count {
					x := byte(keys[i%3]) | byte([]int{0, 0, 1, 2, 3}[r.IntN(5)])<<2
					if r.IntN(40) == 0 {
						x = 0xf0 // an operation of no kind
					}
					data = append(data, x, byte(r.IntN(256)))
				}
			}
		}
	}
	return data
}
