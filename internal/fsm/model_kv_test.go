// The KV half of the model checker. kvModel follows the fenced KV store
// through a command stream, from the commands alone (and the lock model's
// holders, for strict mode), and checks docs/design.md invariant 6 at every step:
//
//   - a put or delete is accepted iff its token is >= the highest token
//     accepted for the key before (and is not 0 once the key was ever
//     fenced), was issued (is <= the last token), strict writes carry a
//     current grant of the named lock, and a CAS names the key's mod
//     revision (0 when absent); otherwise it fails with the right error (a
//     *fence.StaleTokenError naming both tokens for a stale one,
//     ErrInvalidArgument for a token never issued) and changes nothing;
//   - an accepted write's exact Result (store revision, event with create
//     and mod revision, version, token, highest token, and lock "" when
//     unfenced) is the model's, and its event shares no bytes with the state;
//   - no write that took effect carried a token lower than one accepted
//     before on that key, and the state's highest token per key (tombstones
//     included, read from the snapshot) is the highest accepted, never
//     decreases and never disappears once above 0;
//   - Get, List, KVRevision, NumKeys and every snapshot entry match the
//     model after every command, KV or not, the key's session included.
//
// Keys bound to sessions (KVPut.session_id): a put that names a session
// must name a live one, else it fails with ErrSessionNotFound and changes
// nothing; that check comes after the fenced write checks (a put that fails
// them fails with their error, whatever its session) and before max_keys.
// Every accepted put binds its key anew (to no session when it names none),
// an accepted delete of a live key unbinds it, and a tombstone is never
// bound. The command that ends sessions (CloseSession, ExpireSessions)
// deletes the keys bound to each session it ends, sessions in the order of
// its ids and each one's keys in key order, each at a revision of its own,
// as an unfenced delete: token 0 and lock "" recorded, the highest token
// kept in a tombstone if the key was ever fenced, the key gone otherwise.
// Such a delete is the one write that takes effect below a key's highest
// token: it is the session's end, not a writer's. Its Result carries one
// Deleted event per key, in that order, and the store's revision after the
// last (Revision 0 when no key was deleted); see endSession.
//
// A delete of a key that is absent (or only a tombstone) succeeds with no
// revision and no event. An unfenced one changes nothing. A fenced one is
// an accepted write: it raises the key's highest token to its own, in a
// tombstone made for it (revisions, version and token 0) if the key had no
// entry (see the no-op delete cases in kv_test.go).
package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

type modelKey struct {
	kv      fsm.KeyValue
	deleted bool
	// user is the writer a live key's bytes are charged to ("": nobody).
	user string
}

type kvModel struct {
	rev  uint64
	keys map[string]*modelKey // live keys and fenced tombstones
	// accepted is, per key, the highest token of a write accepted (a
	// fenced no-op delete included); seen is the state's highest token per
	// key after the previous step.
	accepted map[string]uint64
	seen     map[string]uint64
	// quota is the kv bytes quota a put by a user is held to, if any;
	// note records a path taken (see requestModel.note).
	quota func(user string) (uint64, bool)
	note  func(path string)
}

// charged is the bytes of the live keys charged to user.
func (k *kvModel) charged(user string) uint64 {
	var n uint64
	for key, e := range k.keys {
		if !e.deleted && e.user == user {
			n += uint64(len(key) + len(e.kv.Value))
		}
	}
	return n
}

// putUser returns the user a KV put charges its key to, "" for none (and
// for a command that is not a put).
func putUser(cmd *fsmpb.Command) string {
	if op, ok := cmd.GetOp().(*fsmpb.Command_KvPut); ok {
		return op.KvPut.GetUser()
	}
	return ""
}

func newKVModel() *kvModel {
	return &kvModel{keys: map[string]*modelKey{}, accepted: map[string]uint64{}, seen: map[string]uint64{}}
}

// putSession returns the session a KV put binds its key to, 0 for none
// (and for a command that is not a put).
func putSession(cmd *fsmpb.Command) uint64 {
	if op, ok := cmd.GetOp().(*fsmpb.Command_KvPut); ok {
		return op.KvPut.GetSessionId()
	}
	return 0
}

// kvCommand returns the parts of a KV command.
func kvCommand(cmd *fsmpb.Command) (key string, value []byte, f *fsmpb.KVFence, maxKeys uint64, isPut, ok bool) {
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_KvPut:
		p := op.KvPut
		return p.GetKey(), p.GetValue(), p.GetFence(), p.GetMaxKeys(), true, true
	case *fsmpb.Command_KvDelete:
		d := op.KvDelete
		return d.GetKey(), nil, d.GetFence(), 0, false, true
	}
	return "", nil, nil, 0, false, false
}

func (k *kvModel) liveKeys() int {
	n := 0
	for _, e := range k.keys {
		if !e.deleted {
			n++
		}
	}
	return n
}

// expect returns what the KV command must answer, and a commit that
// applies it to the model when it succeeds. lastToken is the last token
// issued before the command, sessions the sessions live before it.
func (k *kvModel) expect(cmd *fsmpb.Command, holders map[string][]fsm.HolderInfo, lastToken uint64, sessions map[uint64]bool) (fsm.Result, func()) {
	key, value, f, maxKeys, isPut, _ := kvCommand(cmd)
	sid := putSession(cmd)
	e := k.keys[key]
	live := e != nil && !e.deleted
	var highest uint64
	if e != nil {
		highest = e.kv.HighestToken
	}
	token, lock := f.GetToken(), f.GetLock()
	if token == 0 {
		lock = "" // an unfenced write records no lock
	}
	nothing := func() {}
	if refusal := k.fenceRefusal(key, f, holders, lastToken); refusal.Err != nil {
		return refusal, nothing
	}
	if f != nil && f.ExpectRevision != nil {
		var rev uint64
		if live {
			rev = e.kv.ModRevision
		}
		if rev != f.GetExpectRevision() {
			return fails(fence.ErrRevisionMismatch), nothing
		}
	}
	if isPut && sid != 0 && !sessions[sid] {
		return fsm.Result{Err: fmt.Errorf("%w: session %d does not exist or has expired; create a new session", fence.ErrSessionNotFound, sid)}, nothing
	}
	if isPut && maxKeys > 0 && !live && uint64(k.liveKeys()) >= maxKeys {
		return fails(fence.ErrLimit), nothing
	}
	user := putUser(cmd)
	if limit, ok := k.quota(user); isPut && ok {
		used := k.charged(user)
		if live && e.user == user {
			used -= uint64(len(key) + len(e.kv.Value))
		}
		if used+uint64(len(key)+len(value)) > limit {
			k.note("quota: kv bytes quota refused a put")
			return fails(fence.ErrLimit), nothing
		}
	}
	if !isPut && !live {
		if token == 0 {
			return unchanged(k.rev), nothing
		}
		return unchanged(k.rev), func() {
			if e == nil {
				k.keys[key] = &modelKey{kv: fsm.KeyValue{Key: key}, deleted: true}
			}
			k.keys[key].kv.HighestToken = max(highest, token)
			k.accepted[key] = max(k.accepted[key], token)
		}
	}
	rev := k.rev + 1
	kv := fsm.KeyValue{Key: key, HighestToken: highest, CreateRevision: rev}
	if live {
		kv = e.kv
	}
	kv.Token, kv.Lock, kv.HighestToken, kv.ModRevision = token, lock, max(highest, token), rev
	kv.Session = sid // a put binds anew (0: to none), a delete unbinds
	if isPut {
		kv.Value = val(string(value))
		kv.Version++
	} else {
		kv.Value = nil
	}
	commit := func() {
		k.rev = rev
		k.keys[key] = &modelKey{kv: kv, deleted: !isPut}
		if isPut {
			k.keys[key].user = user
		}
		if !isPut && kv.HighestToken == 0 {
			delete(k.keys, key)
		}
		k.accepted[key] = max(k.accepted[key], token)
	}
	if isPut {
		return wrote(rev, kv), commit
	}
	return removed(rev, kv), commit
}

// fenceRefusal is what a write of key fenced by f must fail with, as a
// single write or in a txn, before any other check: the fenced write rule,
// a token never issued, strict mode. An empty Result when it passes.
func (k *kvModel) fenceRefusal(key string, f *fsmpb.KVFence, holders map[string][]fsm.HolderInfo, lastToken uint64) fsm.Result {
	var highest uint64
	if e := k.keys[key]; e != nil {
		highest = e.kv.HighestToken
	}
	token, lock := f.GetToken(), f.GetLock()
	switch {
	case token == 0 && highest > 0:
		return fails(fence.ErrInvalidArgument)
	case token < highest:
		return fsm.Result{Err: &fence.StaleTokenError{Key: key, Token: token, Highest: highest}}
	case token > lastToken:
		return fsm.Result{Err: fmt.Errorf("%w: token %d was never issued (the last token is %d); write key %s with the token of a grant",
			fence.ErrInvalidArgument, token, lastToken, key)}
	}
	if f.GetStrict() {
		if lock == "" || token == 0 {
			return fails(fence.ErrInvalidArgument)
		}
		current := false
		for _, h := range holders[lock] {
			current = current || h.Token == token
		}
		if !current {
			return fails(fence.ErrNotHolder)
		}
	}
	return fsm.Result{}
}

// observe checks a KV command's answer against the model and commits it.
func (k *kvModel) observe(cmd *fsmpb.Command, res fsm.Result, holders map[string][]fsm.HolderInfo, lastToken uint64, live map[uint64]bool) error {
	key, _, f, _, _, _ := kvCommand(cmd)
	var want fsm.Result
	var commit func()
	if t := cmd.GetKvTxn(); t != nil {
		f = t.GetFence()
		want, commit = k.expectTxn(t, holders, lastToken, live)
	} else {
		want, commit = k.expect(cmd, holders, lastToken, live)
	}
	if want.Err != nil {
		if res.Err == nil {
			what := ""
			var stale *fence.StaleTokenError
			if errors.As(want.Err, &stale) {
				what = "invariant 6: "
			}
			return fmt.Errorf("%s%v was accepted (%s), the model refuses it: %v", what, cmd, describe(res), want.Err)
		}
		var wantStale, gotStale *fence.StaleTokenError
		if errors.As(want.Err, &wantStale) {
			if !errors.As(res.Err, &gotStale) || *gotStale != *wantStale || res.Err.Error() != wantStale.Error() {
				return fmt.Errorf("%v failed with %T %q, want %q", cmd, res.Err, res.Err, wantStale.Error())
			}
			return nil
		}
		if errors.Is(want.Err, fence.ErrSessionNotFound) {
			if !errors.Is(res.Err, fence.ErrSessionNotFound) || res.Err.Error() != want.Err.Error() {
				return fmt.Errorf("%v failed with %q; the model fails it for its session: %q", cmd, res.Err, want.Err)
			}
			return nil
		}
		if neverIssued(want.Err) {
			if !errors.Is(res.Err, fence.ErrInvalidArgument) || res.Err.Error() != want.Err.Error() {
				return fmt.Errorf("%v failed with %q, want %q", cmd, res.Err, want.Err)
			}
			return nil
		}
		if !errors.Is(res.Err, want.Err) || errors.Is(res.Err, fence.ErrStaleToken) || errors.Is(res.Err, fence.ErrSessionNotFound) {
			return fmt.Errorf("%v failed with %v, want %v", cmd, res.Err, want.Err)
		}
		return nil
	}
	if res.Err != nil {
		return fmt.Errorf("%v failed with %v; the model accepts it: %s", cmd, res.Err, describe(want))
	}
	for _, ev := range res.Effects.Events {
		if (cmd.GetKvTxn() == nil && ev.KV.Key != key) || ev.KV.Token != f.GetToken() {
			return fmt.Errorf("%v reported a change of %s", cmd, describeKV(ev.KV))
		}
		if ev.KV.Token < k.accepted[ev.KV.Key] {
			return fmt.Errorf("invariant 6: %v took effect with token %d after token %d was accepted", cmd, ev.KV.Token, k.accepted[ev.KV.Key])
		}
	}
	if !reflect.DeepEqual(cmpForm(res), cmpForm(want)) {
		return fmt.Errorf("%v answered %s, the model %s", cmd, describe(res), describe(want))
	}
	commit()
	return nil
}

// endSession deletes the keys bound to session id from the model, in key
// order, each at a revision of its own, as unfenced deletes, and returns
// their events; the caller ends the sessions a command ends in its order.
func (k *kvModel) endSession(id uint64) []fsm.KVEvent {
	var names []string
	for name, e := range k.keys {
		if !e.deleted && e.kv.Session == id {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var events []fsm.KVEvent
	for _, name := range names {
		k.rev++
		kv := k.keys[name].kv
		kv.Value, kv.Token, kv.Lock, kv.Session, kv.ModRevision = nil, 0, "", 0, k.rev
		k.keys[name] = &modelKey{kv: kv, deleted: true}
		if kv.HighestToken == 0 {
			delete(k.keys, name) // an unfenced key leaves no tombstone
		}
		events = append(events, fsm.KVEvent{Deleted: true, KV: kv})
	}
	return events
}

// neverIssued reports whether err refuses a token the service never issued.
func neverIssued(err error) bool {
	return errors.Is(err, fence.ErrInvalidArgument) && strings.Contains(err.Error(), "was never issued")
}

// eventsOwnValues checks that no event of res, nor a txn's get, shares its
// value's bytes with s: changing them leaves s's snapshot as it was.
func eventsOwnValues(tb testing.TB, s *fsm.State, res fsm.Result) error {
	kvs := make([]fsm.KeyValue, 0, len(res.Effects.Events))
	for _, ev := range res.Effects.Events {
		kvs = append(kvs, ev.KV)
	}
	for _, op := range res.Txn().Ops {
		kvs = append(kvs, op.KV) // a get's
	}
	for _, kv := range kvs {
		if len(kv.Value) == 0 {
			continue
		}
		before := snapshotBytes(tb, s)
		kv.Value[0] ^= 0xff
		shared := !bytes.Equal(before, snapshotBytes(tb, s))
		kv.Value[0] ^= 0xff
		if shared {
			return fmt.Errorf("an answer for key %q shares its value with the state", kv.Key)
		}
	}
	return nil
}

// compare checks the state's store against the model, and that no key's
// highest token went down or vanished since the previous step.
func (k *kvModel) compare(s *fsm.State) error {
	// Invariant 6 first, from the snapshot alone (tombstones included).
	snap := s.Snapshot().GetKvs()
	seen := map[string]uint64{}
	for _, pk := range snap {
		key, h := pk.GetKey(), pk.GetHighestToken()
		if h < k.seen[key] {
			return fmt.Errorf("invariant 6: key %q's highest token went down from %d to %d", key, k.seen[key], h)
		}
		if h != k.accepted[key] {
			return fmt.Errorf("invariant 6: key %q's highest token is %d, but the highest accepted is %d", key, h, k.accepted[key])
		}
		seen[key] = h
	}
	for key, h := range k.seen {
		if _, ok := seen[key]; !ok && h > 0 {
			return fmt.Errorf("invariant 6: key %q, fenced with token %d, was forgotten", key, h)
		}
	}
	for key, h := range k.accepted {
		if _, ok := seen[key]; !ok && h > 0 {
			return fmt.Errorf("invariant 6: key %q accepted token %d, but the state keeps no highest token for it", key, h)
		}
	}
	k.seen = seen

	if len(snap) != len(k.keys) {
		return fmt.Errorf("snapshot keeps %d keys, model %d", len(snap), len(k.keys))
	}
	for _, pk := range snap {
		key := pk.GetKey()
		e := k.keys[key]
		if e == nil {
			return fmt.Errorf("snapshot keeps key %q, which the model does not", key)
		}
		got := fsm.KeyValue{Key: key, Value: pk.GetValue(), Token: pk.GetToken(), Lock: pk.GetLock(), HighestToken: pk.GetHighestToken(),
			CreateRevision: pk.GetCreateRevision(), ModRevision: pk.GetModRevision(), Version: pk.GetVersion(), Session: pk.GetSessionId()}
		if !reflect.DeepEqual(got, e.kv) || pk.GetDeleted() != e.deleted {
			return fmt.Errorf("snapshot has %s (deleted %v), model %s (deleted %v)", describeKV(got), pk.GetDeleted(), describeKV(e.kv), e.deleted)
		}
	}
	if s.KVRevision() != k.rev || s.NumKeys() != k.liveKeys() {
		return fmt.Errorf("KV revision %d with %d keys, model %d with %d", s.KVRevision(), s.NumKeys(), k.rev, k.liveKeys())
	}
	var names []string
	for name, e := range k.keys {
		if !e.deleted {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	list, more := s.List("", 0)
	if more || len(list) != len(names) {
		return fmt.Errorf("List lists %d keys (more %v), model %v", len(list), more, names)
	}
	for i, kv := range list {
		if want := k.keys[names[i]].kv; !reflect.DeepEqual(kv, want) {
			return fmt.Errorf("List has %s, model %s", describeKV(kv), describeKV(want))
		}
		if got, ok := s.Get(kv.Key); !ok || !reflect.DeepEqual(got, kv) {
			return fmt.Errorf("Get(%q) = %s, %v; List has %s", kv.Key, describeKV(got), ok, describeKV(kv))
		}
	}
	return nil
}

// kvKeys is the key universe of generated streams: small, so that writes
// collide.
var kvKeys = []string{"x", "y", "orders/17"}

// highestOf reads a key's highest token, tombstones included.
func highestOf(s *fsm.State, key string) uint64 {
	if kv := snapshotKV(s, key); kv != nil {
		return kv.GetHighestToken()
	}
	return 0
}

// kvOp decodes a KV command from op (0xa0..0xfa) and three bytes: a
// put (3 in 4) or delete of one of kvKeys, fenced by one of the locks with a
// token that is 0, a current holder's, the key's highest (equal), one below
// it (stale), the last issued, a small issued one, or one never issued (just
// above the last, or near 2^64);
// strict in 1 of 4, 1 of 2 with a holder's token; a CAS with the right, a wrong, or 0 expected revision
// in 4 of 8; a max_keys of 0 to 3; and now and then no fence at all.
// A put's high nibble, bits older inputs leave 0xa, binds it (see
// putBinding): 0xa and 0xf to no session, 0xb and 0xe to a live one, 0xc to
// the session holding the fencing lock, 0xd to one that is not live. A
// delete's high nibble of 0xe or 0xf makes it a txn instead (see txnOp).
func (c *commandSource) kvOp(s *fsm.State, op byte) *fsmpb.Command {
	if (op-0xa0)%4 == 3 && op>>4 >= 0xe {
		return c.txnOp(s)
	}
	k, t, o := c.byte(), c.byte(), c.byte()
	key, lock := kvKeys[int(k)%len(kvKeys)], lockName(k>>2)
	highest := highestOf(s, key)
	var token uint64
	switch t & 7 {
	case 0:
		token = 0
	case 1, 2:
		token = s.LastToken()
		if h, ok := holderOf(s, lock, t>>3); ok {
			token = h.Token
		}
	case 3:
		token = highest
	case 4:
		token = max(highest, 1) - 1
	case 5:
		token = s.LastToken()
	case 6:
		token = uint64(t>>4) % (s.LastToken() + 1)
	case 7: // t&0x0f is never 0x08 here, so bit 3 is free
		token = s.LastToken() + 1 + uint64(t>>6)
		if t&0x08 != 0 {
			token = math.MaxUint64 - uint64(t>>6)
		}
	}
	opts := []kvOpt{fenced(lock, token)}
	if o&3 == 0 || (o&3 == 1 && t&7 <= 2) {
		opts = append(opts, strict)
	}
	var mod uint64
	if kv, ok := s.Get(key); ok {
		mod = kv.ModRevision
	}
	switch (o >> 2) & 7 {
	case 1, 2:
		opts = append(opts, expectRev(mod))
	case 3:
		opts = append(opts, expectRev(0))
	case 4:
		opts = append(opts, expectRev(mod+1+uint64(t>>7)))
	}
	isDel := (op-0xa0)%4 == 3
	if t&0x0f == 0x08 { // no fence at all: an unfenced write
		if isDel {
			return &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: key}}}
		}
		return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte("nf"), MaxKeys: uint64(o >> 6),
			SessionId: putBinding(s, op, k, t, lock), User: putWriter(k)}}}
	}
	if isDel {
		return kvDel(key, opts...)
	}
	opts = append(opts, maxKeys([]uint64{0, 0, 0, 0, 1, 2, 3, 0}[o>>5]), boundTo(putBinding(s, op, k, t, lock)), byUser(putWriter(k)))
	return kvPut(key, []string{"", "v1", "v2", "v3"}[(op>>2)&3], opts...)
}

// putWriter picks the user a put is made by, for quotas, from k's top
// bits: no user for 0 and 1, u1 for 2, u2 for 3.
func putWriter(k byte) string { return []string{"", "", "u1", "u2"}[k>>6] }

// putBinding picks the session a put binds its key to from the op's high
// nibble: 0xa and 0xf none; 0xb a live session picked by k>>4, 0xe one
// picked by t>>5 (the newest for 0); 0xc the holder of lock (one picked by
// t>>3), or a live session as for 0xb if it has none; 0xd a session that is
// not live: one ended, or one never created (just above the last, or
// 2^64-1), picked by k>>4. With no session live, a live pick is one never
// created.
func putBinding(s *fsm.State, op, k, t byte, lock string) uint64 {
	live := s.Sessions()
	lastID := func() uint64 { return s.Snapshot().GetLastSessionId() }
	pick := func(b byte) uint64 {
		if len(live) == 0 {
			return lastID() + 1
		}
		return live[int(b)%len(live)].ID
	}
	switch op >> 4 {
	case 0xb:
		return pick(k >> 4)
	case 0xe:
		if len(live) > 0 {
			return live[len(live)-1-int(t>>5)%len(live)].ID
		}
		return lastID() + 1
	case 0xc:
		if h, ok := holderOf(s, lock, t>>3); ok {
			return h.Session
		}
		return pick(k >> 4)
	case 0xd:
		last := lastID()
		dead := []uint64{last + 1, math.MaxUint64}
		for id := uint64(1); id <= last; id++ {
			if _, ok := s.Session(id); !ok {
				dead = append(dead, id)
			}
		}
		return dead[int(k>>4)%len(dead)]
	}
	return 0
}

// kvOutcome names what a KV command did, so that TestRandomCommandStreams
// can show its streams reach every path; "" for other commands.
func kvOutcome(cmd *fsmpb.Command, res fsm.Result) string {
	_, _, f, _, isPut, ok := kvCommand(cmd)
	if !ok {
		return ""
	}
	if neverIssued(res.Err) {
		return "never issued"
	}
	for _, e := range []struct {
		err  error
		name string
	}{
		{fence.ErrStaleToken, "stale"}, {fence.ErrInvalidArgument, "invalid"}, {fence.ErrNotHolder, "not holder"},
		{fence.ErrRevisionMismatch, "revision mismatch"}, {fence.ErrLimit, "limit"}, {fence.ErrSessionNotFound, "session not found"},
	} {
		if errors.Is(res.Err, e.err) {
			return e.name
		}
	}
	switch {
	case res.Err != nil:
		return "other error"
	case len(res.Effects.Events) == 0 && f.GetToken() > 0:
		return "fenced no-op delete"
	case len(res.Effects.Events) == 0:
		return "no-op delete"
	case f.GetStrict():
		return "strict write"
	case f != nil && f.ExpectRevision != nil:
		return "CAS write"
	case f.GetToken() == 0:
		return "unfenced write"
	case !isPut:
		return "fenced delete"
	}
	return "fenced put"
}

// kvBefore is what bindOutcomes needs to know of the state before a
// command: the live sessions, the session each live key is bound to (0 for
// none), and the number of live keys.
type kvBefore struct {
	live    map[uint64]bool
	bound   map[string]uint64
	numKeys int
}

func kvBeforeOf(s *fsm.State) kvBefore {
	b := kvBefore{live: map[uint64]bool{}, bound: map[string]uint64{}, numKeys: s.NumKeys()}
	for _, si := range s.Sessions() {
		b.live[si.ID] = true
	}
	list, _ := s.List("", 0)
	for _, kv := range list {
		b.bound[kv.Key] = kv.Session
	}
	return b
}

// bindOutcomes names the paths of keys bound to sessions that a command
// reached, so that TestRandomCommandStreams can show its streams reach
// them; pre is the state before the command.
func bindOutcomes(cmd *fsmpb.Command, res fsm.Result, pre kvBefore) []string {
	var out []string
	add := func(o string) { out = append(out, "binding: "+o) }
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_KvPut:
		p := op.KvPut
		sid, was := p.GetSessionId(), pre.bound[p.GetKey()]
		_, isLive := pre.bound[p.GetKey()]
		switch {
		case errors.Is(res.Err, fence.ErrSessionNotFound):
			add("put bound to a session not live")
			if p.GetMaxKeys() > 0 && !isLive && uint64(pre.numKeys) >= p.GetMaxKeys() {
				add("session checked before max_keys")
			}
		case res.Err != nil && sid != 0 && !pre.live[sid]:
			add("fence checked before the session")
		case res.Err != nil:
		case sid != 0 && was == sid:
			add("bound again to its session")
		case sid != 0 && was != 0:
			add("rebound to another session")
		case sid != 0:
			add("bound put")
		case was != 0:
			add("unbound by a put")
		}
	case *fsmpb.Command_KvDelete:
		if res.Err == nil && len(res.Effects.Events) > 0 && pre.bound[op.KvDelete.GetKey()] != 0 {
			add("unbound by a delete")
		}
	case *fsmpb.Command_CloseSession, *fsmpb.Command_ExpireSessions:
		if len(res.Effects.Events) == 0 {
			break
		}
		if _, ok := op.(*fsmpb.Command_CloseSession); ok {
			add("keys deleted on close")
		} else {
			add("keys deleted on expiry")
		}
		perSession := map[uint64]int{}
		fenced := false
		for _, ev := range res.Effects.Events {
			perSession[pre.bound[ev.KV.Key]]++
			fenced = fenced || ev.KV.HighestToken > 0
		}
		if fenced {
			add("a fenced key left as a tombstone by its session")
		}
		if len(perSession) > 1 {
			add("keys of several sessions deleted in one command")
		}
		for _, n := range perSession {
			if n > 1 {
				add("several keys of one session deleted")
				break
			}
		}
		if len(res.Effects.Grants) > 0 {
			add("locks handed on as keys are deleted")
		}
	}
	return out
}

// boundKeyStream returns the input of a stream of about n commands that
// mostly bind keys to sessions and end those sessions (see
// commandSource.next and kvOp for the encoding): sessions created, locks
// taken, puts bound to a live session, to the holder of their fencing lock
// or to a session not live, or to none, fenced or not, some stale, strict,
// CAS or with max_keys; deletes; closes and expiries of the sessions keys
// are bound to (several at once at times) and of lock holders, whose
// waiters get the locks in the same command; and releases.
func boundKeyStream(r *rand.Rand, n int) []byte {
	var data []byte
	session := func() byte { return byte(8 * r.IntN(8)) } // a live session
	name := func() byte { return byte(r.IntN(3)) }
	for range n {
		switch x := r.IntN(100); {
		case x < 15: // a session, without a limit
			data = append(data, 0, byte(r.IntN(0x30)))
		case x < 33: // an exclusive or shared acquire of "a", "b" or "c", now and then with a lock-delay
			data = append(data, 4, session(), byte(3*r.IntN(2))+name(), []byte{0, 0, 0, 4}[r.IntN(4)])
		case x < 61: // a put: bound to a live session (0xb, 0xe), the lock's holder (0xc), one not live (0xd), or none (0xa)
			op := []byte{0xb, 0xc, 0xc, 0xe, 0xd, 0xa}[r.IntN(6)]<<4 | byte(1+r.IntN(2))<<2
			t := []byte{0, 1, 1, 1, 3, 4, 7}[r.IntN(7)]
			o := []byte{0x02, 0x02, 0x02, 0x00, 0x06, 0x82, 0xa2}[r.IntN(7)]
			data = append(data, op, byte(r.IntN(256)), t, o)
		case x < 67: // a delete, unfenced or with a holder's or the highest token
			data = append(data, 0xa3, byte(r.IntN(256)), []byte{0, 1, 3}[r.IntN(3)], 0x02)
		case x < 74: // the session a key is bound to closes
			data = append(data, 0x12, byte(r.IntN(256)))
		case x < 79: // the sessions two or three keys are bound to expire together
			n := 2 + r.IntN(2)
			data = append(data, 0x13, byte(n-1))
			for range n {
				data = append(data, byte(r.IntN(256)))
			}
		case x < 88: // a holder's session expires or closes
			data = append(data, 14, name(), byte(r.IntN(256)))
		case x < 90: // the holders and waiters of a lock expire together
			data = append(data, 15, name(), byte(r.IntN(2)))
		case x < 97: // a holder releases
			data = append(data, 11, name(), byte(r.IntN(256)))
		default: // a live session closes
			data = append(data, 2, session())
		}
	}
	return data
}
