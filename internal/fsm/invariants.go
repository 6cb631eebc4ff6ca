package fsm

import "fmt"

// CheckInvariants verifies the state's structural invariants and returns the
// first one broken. Tests and the fuzzer call it after every command; Restore
// calls it on every snapshot.
//
//   - an exclusive holder is the lock's only holder; shared holders share only with shared ones;
//   - a semaphore (a lock with permits) has holders and waiters in semaphore
//     mode only, and no more holders than permits; a lock has none in it;
//   - no token is above the counter, and no two holders have the same token;
//   - every holder and waiter is a live session, which indexes the lock, and
//     no session both holds and waits for one lock or appears twice;
//   - a key bound to a session is live, and the session exists and indexes
//     it; a session indexes only live keys bound to it;
//   - no session id is above the session counter;
//   - no idle lock is kept;
//   - every KV entry is filed under its key, has a token no higher than its
//     highest and a highest no higher than the token counter (no write with
//     a token never issued is accepted), no lock without a token (an
//     unfenced write records none), revisions within the store's, and is a
//     tombstone only if fenced; a tombstone has no value; a live key was
//     written (create revision and version >= 1); an entry never written
//     (create revision 0) is the tombstone a fenced delete of a missing key
//     leaves: mod revision, version and token 0; the live-key count is right;
//   - the auth state's (see checkAuth).
func (s *State) CheckInvariants() error {
	if err := s.checkLocks(); err != nil {
		return err
	}
	if err := s.checkSessions(); err != nil {
		return err
	}
	if err := s.checkKV(); err != nil {
		return err
	}
	if err := s.auth.checkAuth(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return s.checkUsage()
}

// checkLocks checks every lock: its holders fit its kind, their tokens
// were issued and are held once, its members are indexed by their sessions.
func (s *State) checkLocks() error {
	tokens := map[uint64]string{}
	for name, l := range s.locks {
		if l.name != name {
			return fmt.Errorf("lock %q is filed under %q", l.name, name)
		}
		if l.idle() {
			return fmt.Errorf("lock %q is idle but kept", name)
		}
		if l.permits > 0 && uint64(len(l.holders)) > uint64(l.permits) {
			return fmt.Errorf("semaphore %q has %d holders for %d permits", name, len(l.holders), l.permits)
		}
		seen := map[uint64]bool{}
		for _, h := range l.holders {
			if h.mode == Exclusive && len(l.holders) > 1 {
				return fmt.Errorf("lock %q has an exclusive holder and %d others", name, len(l.holders)-1)
			}
			if err := l.checkMode("holder", h.mode); err != nil {
				return err
			}
			if h.token == 0 || h.token > s.lastToken {
				return fmt.Errorf("lock %q holder token %d is outside 1..%d", name, h.token, s.lastToken)
			}
			if other, dup := tokens[h.token]; dup {
				return fmt.Errorf("token %d is held on both %q and %q", h.token, other, name)
			}
			tokens[h.token] = name
			if err := s.checkMember(name, h.session, seen, true); err != nil {
				return err
			}
		}
		if err := s.checkDelays(l); err != nil {
			return err
		}
		for _, w := range l.waiters {
			if err := l.checkMode("waiter", w.mode); err != nil {
				return err
			}
			if err := s.checkMember(name, w.session, seen, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSessions checks that what each session indexes is so.
func (s *State) checkSessions() error {
	for id, sess := range s.sessions {
		if id == 0 || id > s.lastSessionID {
			return fmt.Errorf("session id %d is outside 1..%d", id, s.lastSessionID)
		}
		for name := range sess.holds {
			if l := s.locks[name]; l == nil || l.holderIndex(id) < 0 {
				return fmt.Errorf("session %d indexes lock %q it does not hold", id, name)
			}
		}
		for name := range sess.waits {
			if l := s.locks[name]; l == nil || l.waiterIndex(id) < 0 {
				return fmt.Errorf("session %d indexes lock %q it does not wait for", id, name)
			}
		}
		for key := range sess.keys {
			if e := s.kv[key]; !e.live() || e.kv.Session != id {
				return fmt.Errorf("session %d indexes key %q that is not bound to it", id, key)
			}
		}
	}
	return nil
}

// checkKV checks every key, and the live keys' count and size.
func (s *State) checkKV() error {
	live, liveBytes := 0, 0
	for key, e := range s.kv {
		if err := s.checkKey(key, e); err != nil {
			return err
		}
		if !e.deleted {
			live++
			liveBytes += len(key) + len(e.kv.Value)
		}
	}
	if live != s.liveKeys {
		return fmt.Errorf("%d live keys counted as %d", live, s.liveKeys)
	}
	if liveBytes != s.liveBytes {
		return fmt.Errorf("%d bytes of live keys counted as %d", liveBytes, s.liveBytes)
	}
	return nil
}

// checkKey checks one key: its binding, its tokens and revisions, and a
// tombstone's fence.
func (s *State) checkKey(key string, e *kvEntry) error {
	if e.kv.Key != key {
		return fmt.Errorf("key %q is filed under %q", e.kv.Key, key)
	}
	if id := e.kv.Session; id != 0 {
		sess, ok := s.sessions[id]
		if !ok || e.deleted {
			return fmt.Errorf("key %q (deleted %v) is bound to session %d, which exists: %v", key, e.deleted, id, ok)
		}
		if _, ok := sess.keys[key]; !ok {
			return fmt.Errorf("key %q is bound to session %d, which does not index it", key, id)
		}
	}
	if e.kv.Token > e.kv.HighestToken {
		return fmt.Errorf("key %q was written with token %d above its highest %d", key, e.kv.Token, e.kv.HighestToken)
	}
	if e.kv.HighestToken > s.lastToken {
		return fmt.Errorf("key %q has highest token %d, above the last token issued %d", key, e.kv.HighestToken, s.lastToken)
	}
	if e.kv.Token == 0 && e.kv.Lock != "" {
		return fmt.Errorf("key %q names lock %q without a token", key, e.kv.Lock)
	}
	if e.kv.ModRevision > s.kvRevision || e.kv.CreateRevision > e.kv.ModRevision {
		return fmt.Errorf("key %q has revisions create %d, mod %d beyond the store's %d", key, e.kv.CreateRevision, e.kv.ModRevision, s.kvRevision)
	}
	if !e.deleted && (e.kv.CreateRevision == 0 || e.kv.Version == 0) {
		return fmt.Errorf("live key %q has create revision %d and version %d, but was never written", key, e.kv.CreateRevision, e.kv.Version)
	}
	if e.deleted && e.kv.HighestToken == 0 {
		return fmt.Errorf("key %q is an unfenced tombstone", key)
	}
	if e.deleted && len(e.kv.Value) > 0 {
		return fmt.Errorf("tombstone %q has a value", key)
	}
	if e.kv.CreateRevision == 0 && (e.kv.ModRevision != 0 || e.kv.Version != 0 || e.kv.Token != 0) {
		return fmt.Errorf("key %q was never written (create revision 0) but has mod revision %d, version %d and token %d", key, e.kv.ModRevision, e.kv.Version, e.kv.Token)
	}
	if e.kv.CreateRevision != 0 && e.kv.Version == 0 {
		return fmt.Errorf("key %q was created at revision %d but has version 0", key, e.kv.CreateRevision)
	}
	return nil
}

// checkMode checks that a holder or waiter's mode fits the lock's kind.
func (l *lock) checkMode(who string, m Mode) error {
	switch {
	case l.permits > 0 && m != Semaphore:
		return fmt.Errorf("semaphore %q has a %s in %s mode", l.name, who, m)
	case l.permits == 0 && m != Exclusive && m != Shared:
		return fmt.Errorf("lock %q has a %s in %s mode", l.name, who, m)
	}
	return nil
}

func (s *State) checkMember(name string, id uint64, seen map[uint64]bool, holds bool) error {
	if seen[id] {
		return fmt.Errorf("session %d appears twice on lock %q", id, name)
	}
	seen[id] = true
	sess, ok := s.sessions[id]
	if !ok {
		return fmt.Errorf("lock %q lists unknown session %d", name, id)
	}
	index := sess.waits
	if holds {
		index = sess.holds
	}
	if _, ok := index[name]; !ok {
		return fmt.Errorf("session %d is on lock %q but does not index it", id, name)
	}
	return nil
}

// checkDelays checks a lock's pending delays: positive, named for the lock,
// with ids that rise and were given out.
func (s *State) checkDelays(l *lock) error {
	var last uint64
	for _, d := range l.delays {
		switch {
		case d.Delay <= 0:
			return fmt.Errorf("lock %q has a lock-delay of %v", l.name, d.Delay)
		case d.Lock != l.name:
			return fmt.Errorf("lock %q has a lock-delay of lock %q", l.name, d.Lock)
		case d.ID <= last || d.ID > s.lastDelayID:
			return fmt.Errorf("lock %q has lock-delay id %d after %d, outside 1..%d", l.name, d.ID, last, s.lastDelayID)
		}
		last = d.ID
	}
	return nil
}
