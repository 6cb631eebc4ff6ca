package fsm

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
	// for an unfenced write.
	Token uint64
	Lock  string
	// HighestToken is the highest token ever accepted for the key.
	HighestToken   uint64
	CreateRevision uint64
	ModRevision    uint64
	// Version counts the writes since the key was created.
	Version uint64
}

// KVEvent is a change to the KV store, for watchers.
type KVEvent struct {
	// Deleted is true for a delete, false for a put.
	Deleted bool
	KV      KeyValue
}

type kvEntry struct {
	kv      KeyValue
	deleted bool
}

func (e *kvEntry) live() bool { return e != nil && !e.deleted }

// kvPut applies the fenced write rule to a put, then stores the value.
func (s *State) kvPut(c *fsmpb.KVPut) Result {
	e := s.kv[c.GetKey()]
	if err := s.checkKVFence(c.GetKey(), e, c.GetFence()); err != nil {
		return Result{Err: err}
	}
	if max := c.GetMaxKeys(); max > 0 && !e.live() && uint64(s.liveKeys) >= max {
		return Result{Err: fmt.Errorf("%w: the KV store already has %d keys, its limit", fence.ErrLimit, s.liveKeys)}
	}
	s.kvRevision++
	if !e.live() {
		if e == nil {
			e = &kvEntry{kv: KeyValue{Key: c.GetKey()}}
			s.kv[c.GetKey()] = e
		}
		e.deleted = false
		e.kv.CreateRevision = s.kvRevision
		e.kv.Version = 0
		s.liveKeys++
	}
	f := c.GetFence()
	e.kv.Value = append([]byte(nil), c.GetValue()...)
	e.kv.Token, e.kv.Lock = f.GetToken(), f.GetLock()
	e.kv.HighestToken = max(e.kv.HighestToken, f.GetToken())
	e.kv.ModRevision = s.kvRevision
	e.kv.Version++
	return Result{Revision: s.kvRevision, Events: []KVEvent{{KV: e.kv}}}
}

// kvDelete applies the fenced write rule to a delete. Deleting a missing
// key changes nothing and is not an error (Result.Events is empty).
func (s *State) kvDelete(c *fsmpb.KVDelete) Result {
	key := c.GetKey()
	e := s.kv[key]
	if err := s.checkKVFence(key, e, c.GetFence()); err != nil {
		return Result{Err: err}
	}
	if !e.live() {
		return Result{Revision: s.kvRevision}
	}
	s.kvRevision++
	f := c.GetFence()
	e.kv.HighestToken = max(e.kv.HighestToken, f.GetToken())
	e.kv.Value, e.kv.Token, e.kv.Lock = nil, f.GetToken(), f.GetLock()
	e.kv.ModRevision = s.kvRevision
	e.deleted = true
	s.liveKeys--
	ev := KVEvent{Deleted: true, KV: e.kv}
	if e.kv.HighestToken == 0 {
		delete(s.kv, key) // an unfenced key needs no tombstone
	}
	return Result{Revision: s.kvRevision, Events: []KVEvent{ev}}
}

// checkKVFence decides whether a write may apply to key: the fenced write
// rule, strict mode, and compare-and-swap by revision. It changes nothing.
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
