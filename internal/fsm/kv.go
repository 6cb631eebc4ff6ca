package fsm

// The fenced KV store applies docs/design.md's fenced write rule itself: per key
// it keeps the highest fencing token it has accepted, refuses a write with
// a lower one (and an unfenced write once the key was ever fenced), and
// refuses a token the service never issued, so that no client can lock a
// key for good with a token like 2^64-1.
//
// A key that was ever fenced is never forgotten: deleting it, or deleting
// it while it is missing (a no-op delete, which still records its token),
// leaves a tombstone that keeps the highest token. Tombstones of fenced
// keys are kept forever; the state grows with the number of keys ever
// fenced, not the number of live keys, and max_keys does not bound it. This
// is a known limit. Unfenced keys leave no tombstone.
//
// A key may be bound to a session (an etcd lease, a ZooKeeper ephemeral
// node): it is deleted in the command that ends the session, as if by an
// unfenced delete, and a fenced one leaves its tombstone as any delete does.

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// KeyValue is one key of the fenced KV store, as readers see it.
type KeyValue struct {
	Key   string
	Value []byte
	// Token and Lock are those of the write that set the value; 0 and ""
	// for an unfenced write (the lock a request names without a token is
	// not stored).
	Token uint64
	Lock  string
	// HighestToken is the highest token ever accepted for the key,
	// including that of a delete of the key while it was missing.
	HighestToken   uint64
	CreateRevision uint64
	ModRevision    uint64
	// Version counts the writes since the key was created.
	Version uint64
	// Session is the session the key is bound to, 0 for none.
	Session uint64
}

// KVEvent is a change to the KV store, for watchers.
type KVEvent struct {
	// Deleted is true for a delete, false for a put.
	Deleted bool
	// KV is the key after the change, a copy that shares nothing with the
	// state (as Get and List return).
	KV KeyValue
}

type kvEntry struct {
	kv      KeyValue
	deleted bool
	// user is the user a live key's bytes are charged to, the one who
	// wrote it last with auth on; "" for none (see quota.go).
	user string
}

func (e *kvEntry) live() bool { return e != nil && !e.deleted }

// kvPut applies the fenced write rule to a put, then stores the value.
func (s *State) kvPut(c *fsmpb.KVPut) Result {
	key, f := c.GetKey(), c.GetFence()
	e := s.kv[key]
	if err := s.checkKVFence(key, e, f); err != nil {
		return Result{Err: err}
	}
	var owner *session
	if id := c.GetSessionId(); id != 0 {
		sess, err := s.session(id)
		if err != nil {
			return Result{Err: err}
		}
		owner = sess
	}
	if max := c.GetMaxKeys(); max > 0 && !e.live() && uint64(s.liveKeys) >= max {
		return Result{Err: fmt.Errorf("%w: the KV store already has %d keys, its limit", fence.ErrLimit, s.liveKeys)}
	}
	if err := s.checkKVQuota(c.GetUser(), e, key, c.GetValue()); err != nil {
		return Result{Err: err}
	}
	s.kvRevision++
	ev := s.putKey(key, e, c.GetValue(), f, owner, c.GetUser())
	return Result{Answer: KVAnswer{Revision: s.kvRevision, Changed: true}, Effects: Effects{Events: []KVEvent{ev}}}
}

// putKey stores value under key (whose entry is e, nil for none) at the
// store's revision, with the write f, bound to owner (nil for none) and
// charged to user, and returns the event. The write was checked.
func (s *State) putKey(key string, e *kvEntry, value []byte, f *fsmpb.KVFence, owner *session, user string) KVEvent {
	if e.live() {
		s.liveBytes -= len(e.kv.Value)
		s.chargeKey(e, -1)
	} else {
		s.liveBytes += len(key)
		if e == nil {
			e = &kvEntry{kv: KeyValue{Key: key}}
			s.kv[key] = e
		}
		e.deleted = false
		e.kv.CreateRevision = s.kvRevision
		e.kv.Version = 0
		s.liveKeys++
	}
	e.kv.Value = append([]byte(nil), value...)
	s.liveBytes += len(e.kv.Value)
	e.user = user
	s.chargeKey(e, 1)
	e.kv.Token, e.kv.Lock = writer(f)
	e.kv.HighestToken = max(e.kv.HighestToken, f.GetToken())
	e.kv.ModRevision = s.kvRevision
	e.kv.Version++
	s.unbind(e)
	if owner != nil {
		e.kv.Session = owner.id
		addName(&owner.keys, key)
	}
	return KVEvent{KV: copyKV(e.kv)}
}

// unbind ends a key's binding to its session, if any.
func (s *State) unbind(e *kvEntry) {
	if e.kv.Session != 0 {
		dropName(&s.sessions[e.kv.Session].keys, e.kv.Key)
		e.kv.Session = 0
	}
}

// kvDelete applies the fenced write rule to a delete. Deleting a missing
// key (absent, or a tombstone) is not an error and changes nothing anyone
// can see: no revision, no event (Effects.Events is empty). But a fenced one
// is an accepted write all the same, so it records its token: the key's
// highest token rises to it, in a tombstone made for the purpose if the key
// was never seen. Otherwise a writer with a lower token could come back
// after it.
func (s *State) kvDelete(c *fsmpb.KVDelete) Result {
	key, f := c.GetKey(), c.GetFence()
	e := s.kv[key]
	if err := s.checkKVFence(key, e, f); err != nil {
		return Result{Err: err}
	}
	if !e.live() {
		s.recordToken(key, e, f.GetToken())
		return Result{Answer: KVAnswer{Revision: s.kvRevision}}
	}
	ev := s.removeKey(e, f)
	return Result{Answer: KVAnswer{Revision: s.kvRevision, Changed: true}, Effects: Effects{Events: []KVEvent{ev}}}
}

// recordToken is a fenced delete of a missing key (e, nil for none): an
// accepted write all the same, which raises the key's highest token to
// its own, in a tombstone made for the purpose if need be. An unfenced
// one (token 0) changes nothing.
func (s *State) recordToken(key string, e *kvEntry, token uint64) {
	if token == 0 {
		return
	}
	if e == nil {
		e = &kvEntry{kv: KeyValue{Key: key}, deleted: true}
		s.kv[key] = e
	}
	e.kv.HighestToken = max(e.kv.HighestToken, token)
}

// removeKey deletes a live key with the write f (nil when its session
// ended), at a new revision, and returns the event.
func (s *State) removeKey(e *kvEntry, f *fsmpb.KVFence) KVEvent {
	s.kvRevision++
	return s.deleteKey(e, f)
}

// deleteKey deletes a live key with the write f at the store's revision,
// and returns the event.
func (s *State) deleteKey(e *kvEntry, f *fsmpb.KVFence) KVEvent {
	s.unbind(e)
	e.kv.HighestToken = max(e.kv.HighestToken, f.GetToken())
	s.liveBytes -= len(e.kv.Key) + len(e.kv.Value)
	s.chargeKey(e, -1)
	e.user = ""
	e.kv.Value = nil
	e.kv.Token, e.kv.Lock = writer(f)
	e.kv.ModRevision = s.kvRevision
	e.deleted = true
	s.liveKeys--
	ev := KVEvent{Deleted: true, KV: copyKV(e.kv)}
	if e.kv.HighestToken == 0 {
		delete(s.kv, e.kv.Key) // an unfenced key needs no tombstone
	}
	return ev
}

// writer returns the token and lock a write records: the lock only with a
// token, for an unfenced write has no lock.
func writer(f *fsmpb.KVFence) (token uint64, lock string) {
	if f.GetToken() == 0 {
		return 0, ""
	}
	return f.GetToken(), f.GetLock()
}

// checkKVFence decides whether a write may apply to key: the fenced write
// rule, a token the service issued, strict mode, and compare-and-swap by
// revision. It changes nothing.
func (s *State) checkKVFence(key string, e *kvEntry, f *fsmpb.KVFence) error {
	var highest uint64
	if e != nil {
		highest = e.kv.HighestToken
	}
	token := f.GetToken()
	switch {
	case token == 0 && highest > 0:
		return fmt.Errorf("%w: key %s is fenced (highest token %d); write it with a fencing token", fence.ErrInvalidArgument, key, highest)
	case token < highest:
		return &fence.StaleTokenError{Key: key, Token: token, Highest: highest}
	case token > s.lastToken:
		// Accepting it would raise the key's highest token beyond every
		// grant, and lock every real holder out of the key for good.
		return fmt.Errorf("%w: token %d was never issued (the last token is %d); write key %s with the token of a grant", fence.ErrInvalidArgument, token, s.lastToken, key)
	}
	if f.GetStrict() {
		if err := s.checkCurrentGrant(f.GetLock(), token); err != nil {
			return err
		}
	}
	if f != nil && f.ExpectRevision != nil { // f is nil for a command without a fence
		var rev uint64
		if e.live() {
			rev = e.kv.ModRevision
		}
		if rev != f.GetExpectRevision() {
			if rev == 0 {
				return fmt.Errorf("%w: key %s does not exist, expected revision %d", fence.ErrRevisionMismatch, key, f.GetExpectRevision())
			}
			return fmt.Errorf("%w: key %s is at revision %d, expected %d", fence.ErrRevisionMismatch, key, rev, f.GetExpectRevision())
		}
	}
	return nil
}

// checkCurrentGrant is the strict (sequencer) check: token must be a
// current grant of the lock.
func (s *State) checkCurrentGrant(lockName string, token uint64) error {
	if lockName == "" || token == 0 {
		return fmt.Errorf("%w: a strict write needs a lock name and a token", fence.ErrInvalidArgument)
	}
	l := s.locks[lockName]
	if l == nil || len(l.holders) == 0 {
		return fmt.Errorf("%w: token %d is not a current grant: lock %q is not held", fence.ErrNotHolder, token, lockName)
	}
	var current uint64
	for _, h := range l.holders {
		if h.token == token {
			return nil
		}
		current = max(current, h.token)
	}
	return fmt.Errorf("%w: token %d is not the current grant of lock %q (the current token is %d)", fence.ErrNotHolder, token, lockName, current)
}

// KVRevision returns the KV store's revision: the number of changes so far.
func (s *State) KVRevision() uint64 { return s.kvRevision }

// NumKeys returns the number of live keys.
func (s *State) NumKeys() int { return s.liveKeys }

// KVBytes returns the bytes of the live keys' names and values.
func (s *State) KVBytes() int { return s.liveBytes }

// Get returns a live key.
func (s *State) Get(key string) (KeyValue, bool) {
	e := s.kv[key]
	if !e.live() {
		return KeyValue{}, false
	}
	return copyKV(e.kv), true
}

// List returns up to limit live keys starting with prefix, in key order,
// and whether more were left out. limit 0 means no limit.
func (s *State) List(prefix string, limit int) ([]KeyValue, bool) {
	var keys []string
	for k, e := range s.kv {
		if !e.deleted && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	more := false
	if limit > 0 && len(keys) > limit {
		keys, more = keys[:limit], true
	}
	out := make([]KeyValue, len(keys))
	for i, k := range keys {
		out[i] = copyKV(s.kv[k].kv)
	}
	return out, more
}

func copyKV(kv KeyValue) KeyValue {
	kv.Value = append([]byte(nil), kv.Value...)
	return kv
}
