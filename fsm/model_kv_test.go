// The KV half of the model checker. kvModel follows the fenced KV store
// through a command stream, from the commands alone (and the lock model's
// holders, for strict mode), and checks design.md invariant 6 at every step:
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
//     model after every command, KV or not.
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
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

type modelKey struct {
	kv      fsm.KeyValue
	deleted bool
}

type kvModel struct {
	rev  uint64
	keys map[string]*modelKey // live keys and fenced tombstones
	// accepted is, per key, the highest token of a write accepted (a
	// fenced no-op delete included); seen is the state's highest token per
	// key after the previous step.
	accepted map[string]uint64
	seen     map[string]uint64
}

func newKVModel() *kvModel {
	return &kvModel{keys: map[string]*modelKey{}, accepted: map[string]uint64{}, seen: map[string]uint64{}}
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
// issued before the command.
func (k *kvModel) expect(cmd *fsmpb.Command, holders map[string][]fsm.HolderInfo, lastToken uint64) (fsm.Result, func()) {
	key, value, f, maxKeys, isPut, _ := kvCommand(cmd)
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
	switch {
	case token == 0 && highest > 0:
		return fails(fence.ErrInvalidArgument), nothing
	case token < highest:
		return fsm.Result{Err: &fence.StaleTokenError{Key: key, Token: token, Highest: highest}}, nothing
	case token > lastToken:
		return fsm.Result{Err: fmt.Errorf("%w: token %d was never issued (the last token is %d); write key %s with the token of a grant",
			fence.ErrInvalidArgument, token, lastToken, key)}, nothing
	}
	if f.GetStrict() {
		if lock == "" || token == 0 {
			return fails(fence.ErrInvalidArgument), nothing
		}
		current := false
		for _, h := range holders[lock] {
			current = current || h.Token == token
		}
		if !current {
			return fails(fence.ErrNotHolder), nothing
		}
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
	if isPut && maxKeys > 0 && !live && uint64(k.liveKeys()) >= maxKeys {
		return fails(fence.ErrLimit), nothing
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
	if isPut {
		kv.Value = val(string(value))
		kv.Version++
	} else {
		kv.Value = nil
	}
	commit := func() {
		k.rev = rev
		k.keys[key] = &modelKey{kv: kv, deleted: !isPut}
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

// observe checks a KV command's answer against the model and commits it.
func (k *kvModel) observe(cmd *fsmpb.Command, res fsm.Result, holders map[string][]fsm.HolderInfo, lastToken uint64) error {
	key, _, f, _, _, _ := kvCommand(cmd)
	want, commit := k.expect(cmd, holders, lastToken)
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
		if neverIssued(want.Err) {
			if !errors.Is(res.Err, fence.ErrInvalidArgument) || res.Err.Error() != want.Err.Error() {
				return fmt.Errorf("%v failed with %q, want %q", cmd, res.Err, want.Err)
			}
			return nil
		}
		if !errors.Is(res.Err, want.Err) || errors.Is(res.Err, fence.ErrStaleToken) {
			return fmt.Errorf("%v failed with %v, want %v", cmd, res.Err, want.Err)
		}
		return nil
	}
	if res.Err != nil {
		return fmt.Errorf("%v failed with %v; the model accepts it: %s", cmd, res.Err, describe(want))
	}
	for _, ev := range res.Events {
		if ev.KV.Key != key || ev.KV.Token != f.GetToken() {
			return fmt.Errorf("%v reported a change of %s", cmd, describeKV(ev.KV))
		}
		if ev.KV.Token < k.accepted[key] {
			return fmt.Errorf("invariant 6: %v took effect with token %d after token %d was accepted", cmd, ev.KV.Token, k.accepted[key])
		}
	}
	if !reflect.DeepEqual(cmpForm(res), cmpForm(want)) {
		return fmt.Errorf("%v answered %s, the model %s", cmd, describe(res), describe(want))
	}
	commit()
	return nil
}

// neverIssued reports whether err refuses a token the service never issued.
func neverIssued(err error) bool {
	return errors.Is(err, fence.ErrInvalidArgument) && strings.Contains(err.Error(), "was never issued")
}

// eventsOwnValues checks that no event of res shares its value's bytes with
// s: changing them leaves s's snapshot as it was.
func eventsOwnValues(tb testing.TB, s *fsm.State, res fsm.Result) error {
	for _, ev := range res.Events {
		if len(ev.KV.Value) == 0 {
			continue
		}
		before := snapshotBytes(tb, s)
		ev.KV.Value[0] ^= 0xff
		shared := !bytes.Equal(before, snapshotBytes(tb, s))
		ev.KV.Value[0] ^= 0xff
		if shared {
			return fmt.Errorf("the event for key %q shares its value with the state", ev.KV.Key)
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
			CreateRevision: pk.GetCreateRevision(), ModRevision: pk.GetModRevision(), Version: pk.GetVersion()}
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

// kvOp decodes a KV command from op (0xa0..0xfe) and three bytes: a
// put (3 in 4) or delete of one of kvKeys, fenced by one of the locks with a
// token that is 0, a current holder's, the key's highest (equal), one below
// it (stale), the last issued, a small issued one, or one never issued (just
// above the last, or near 2^64);
// strict in 1 of 4, 1 of 2 with a holder's token; a CAS with the right, a wrong, or 0 expected revision
// in 4 of 8; a max_keys of 0 to 3; and now and then no fence at all.
func (c *commandSource) kvOp(s *fsm.State, op byte) *fsmpb.Command {
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
		return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte("nf"), MaxKeys: uint64(o >> 6)}}}
	}
	if isDel {
		return kvDel(key, opts...)
	}
	opts = append(opts, maxKeys([]uint64{0, 0, 0, 0, 1, 2, 3, 0}[o>>5]))
	return kvPut(key, []string{"", "v1", "v2", "v3"}[(op>>2)&3], opts...)
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
		{fence.ErrRevisionMismatch, "revision mismatch"}, {fence.ErrLimit, "limit"},
	} {
		if errors.Is(res.Err, e.err) {
			return e.name
		}
	}
	switch {
	case res.Err != nil:
		return "other error"
	case len(res.Events) == 0 && f.GetToken() > 0:
		return "fenced no-op delete"
	case len(res.Events) == 0:
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
