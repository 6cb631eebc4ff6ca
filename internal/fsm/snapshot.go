package fsm

import (
	"fmt"
	"slices"
	"time"

	"github.com/fencelock/fence/internal/fsmpb"
)

// Snapshot returns a deep copy of the state as a protobuf message, with
// sessions in id order and locks in name order, so that equal states give
// equal bytes.
func (s *State) Snapshot() *fsmpb.Snapshot {
	snap := &fsmpb.Snapshot{LastToken: s.lastToken, LastSessionId: s.lastSessionID, LastDelayId: s.lastDelayID, LastAttempt: s.lastAttempt, ClusterId: s.clusterID, Protocol: s.protocol}
	for _, info := range s.Sessions() {
		sess := s.sessions[info.ID]
		snap.Sessions = append(snap.Sessions, &fsmpb.Session{Id: sess.id, TtlNs: int64(sess.ttl), Owner: sess.owner, User: sess.user, Cancelled: slices.Clone(sess.cancelled), SecretSha256: slices.Clone(sess.secretHash)})
	}
	for _, info := range s.Locks("") {
		l := s.locks[info.Name]
		// delay_ns, the longest pending delay, is what older versions read.
		pl := &fsmpb.Lock{Name: l.name, DelayNs: int64(l.longestDelay()), Permits: l.permits}
		for _, d := range l.delays {
			pl.Delays = append(pl.Delays, &fsmpb.PendingDelay{Id: d.ID, DelayNs: int64(d.Delay)})
		}
		for _, h := range l.holders {
			pl.Holders = append(pl.Holders, &fsmpb.Holder{SessionId: h.session, Token: h.token, Mode: uint32(h.mode), LockDelayNs: int64(h.lockDelay), RequestId: h.req.id, Attempt: h.req.attempt})
		}
		for _, w := range l.waiters {
			pl.Waiters = append(pl.Waiters, &fsmpb.Waiter{SessionId: w.session, Mode: uint32(w.mode), LockDelayNs: int64(w.lockDelay), RequestId: w.req.id, Attempt: w.req.attempt})
		}
		snap.Locks = append(snap.Locks, pl)
	}
	snap.KvRevision = s.kvRevision
	for _, k := range sortedKeys(s.kv) {
		e := s.kv[k]
		snap.Kvs = append(snap.Kvs, &fsmpb.KV{
			Key: k, Value: append([]byte(nil), e.kv.Value...), Token: e.kv.Token, Lock: e.kv.Lock,
			HighestToken: e.kv.HighestToken, CreateRevision: e.kv.CreateRevision,
			ModRevision: e.kv.ModRevision, Version: e.kv.Version, Deleted: e.deleted,
			SessionId: e.kv.Session, User: e.user,
		})
	}
	for _, id := range sortedKeys(s.nodes) {
		snap.Nodes = append(snap.Nodes, &fsmpb.RegisterNode{NodeId: id, ApiAddress: s.nodes[id]})
	}
	for _, r := range s.Rejoins() {
		snap.Rejoins = append(snap.Rejoins, &fsmpb.RejoinMember{MemberId: r[0], RaftAddress: r[1]})
	}
	for _, key := range s.appliedKeys {
		r := s.applied[key]
		snap.Applied = append(snap.Applied, &fsmpb.Applied{Key: key, SessionId: r.SessionID, Revision: r.Revision, Changed: r.Changed, Succeeded: r.Succeeded})
	}
	snap.Auth = s.auth.snapshot()
	return snap
}

// Restore replaces the state with a snapshot's. It rejects a snapshot that
// breaks the state's invariants rather than load it.
func Restore(snap *fsmpb.Snapshot) (*State, error) {
	s := NewState()
	s.lastToken = snap.GetLastToken()
	s.lastSessionID = snap.GetLastSessionId()
	s.lastDelayID = snap.GetLastDelayId()
	s.lastAttempt = snap.GetLastAttempt()
	s.clusterID = snap.GetClusterId()
	s.protocol = snap.GetProtocol()
	if s.protocol > Protocol {
		return nil, fmt.Errorf("fsm: the snapshot is of a group at protocol %d, newer than this node's %d: run a newer fence", s.protocol, Protocol)
	}
	// Sessions first: locks and keys name them.
	if err := s.restoreSessions(snap.GetSessions()); err != nil {
		return nil, err
	}
	if err := s.restoreLocks(snap.GetLocks()); err != nil {
		return nil, err
	}
	s.kvRevision = snap.GetKvRevision()
	if err := s.restoreKV(snap.GetKvs()); err != nil {
		return nil, err
	}
	for _, n := range snap.GetNodes() {
		s.nodes[n.GetNodeId()] = n.GetApiAddress()
	}
	for _, r := range snap.GetRejoins() {
		if r.GetMemberId() == "" || r.GetRaftAddress() == "" || r.GetDone() {
			return nil, fmt.Errorf("fsm: snapshot has a member added again with no id or address, or done: %v", r)
		}
		s.rejoins[r.GetMemberId()] = r.GetRaftAddress()
	}
	for _, a := range snap.GetApplied() {
		if _, dup := s.applied[a.GetKey()]; dup || a.GetKey() == "" {
			return nil, fmt.Errorf("fsm: snapshot has idempotency key %q twice or empty", a.GetKey())
		}
		s.remember(a.GetKey(), Repeat{SessionID: a.GetSessionId(), Revision: a.GetRevision(), Changed: a.GetChanged(), Succeeded: a.GetSucceeded()})
	}
	auth, err := restoreAuth(snap.GetAuth())
	if err != nil {
		return nil, err
	}
	s.auth = auth
	// The usage counters are derived, never read from the snapshot.
	s.usage = s.recountUsage()
	for user := range s.usage {
		s.tidyUsage(user)
	}
	if err := s.CheckInvariants(); err != nil {
		return nil, fmt.Errorf("fsm: snapshot is inconsistent: %w", err)
	}
	return s, nil
}

func (s *State) restoreSessions(sessions []*fsmpb.Session) error {
	for _, ps := range sessions {
		if _, dup := s.sessions[ps.GetId()]; dup {
			return fmt.Errorf("fsm: snapshot has session %d twice", ps.GetId())
		}
		if h := ps.GetSecretSha256(); len(h) != 0 && len(h) != SecretHashBytes {
			return fmt.Errorf("fsm: snapshot session %d has a secret hash of %d bytes, not %d", ps.GetId(), len(h), SecretHashBytes)
		}
		s.sessions[ps.GetId()] = &session{
			id:         ps.GetId(),
			ttl:        time.Duration(ps.GetTtlNs()),
			owner:      ps.GetOwner(),
			user:       ps.GetUser(),
			secretHash: nilIfEmpty(slices.Clone(ps.GetSecretSha256())),
		}
		for _, id := range ps.GetCancelled() {
			s.sessions[ps.GetId()].cancel(id)
		}
	}
	return nil
}

func (s *State) restoreLocks(locks []*fsmpb.Lock) error {
	for _, pl := range locks {
		if _, dup := s.locks[pl.GetName()]; dup {
			return fmt.Errorf("fsm: snapshot has lock %q twice", pl.GetName())
		}
		l := &lock{name: pl.GetName(), permits: pl.GetPermits()}
		for _, d := range pl.GetDelays() {
			l.delays = append(l.delays, Delay{Lock: l.name, Delay: time.Duration(d.GetDelayNs()), ID: d.GetId()})
		}
		if len(l.delays) == 0 && pl.GetDelayNs() > 0 {
			// A snapshot of an older version: one delay, without an id.
			s.lastDelayID++
			l.delays = []Delay{{Lock: l.name, Delay: time.Duration(pl.GetDelayNs()), ID: s.lastDelayID}}
		}
		for _, h := range pl.GetHolders() {
			sess, ok := s.sessions[h.GetSessionId()]
			if !ok {
				return fmt.Errorf("fsm: snapshot lock %q is held by unknown session %d", l.name, h.GetSessionId())
			}
			l.holders = append(l.holders, holder{session: sess.id, token: h.GetToken(), mode: Mode(h.GetMode()), lockDelay: time.Duration(h.GetLockDelayNs()),
				req: request{id: h.GetRequestId(), attempt: h.GetAttempt()}})
			addName(&sess.holds, l.name)
		}
		for _, w := range pl.GetWaiters() {
			sess, ok := s.sessions[w.GetSessionId()]
			if !ok {
				return fmt.Errorf("fsm: snapshot lock %q is awaited by unknown session %d", l.name, w.GetSessionId())
			}
			l.waiters = append(l.waiters, waiter{session: sess.id, mode: Mode(w.GetMode()), lockDelay: time.Duration(w.GetLockDelayNs()),
				req: request{id: w.GetRequestId(), attempt: w.GetAttempt()}})
			addName(&sess.waits, l.name)
		}
		s.locks[l.name] = l
	}
	return nil
}

func (s *State) restoreKV(kvs []*fsmpb.KV) error {
	for _, pk := range kvs {
		if _, dup := s.kv[pk.GetKey()]; dup {
			return fmt.Errorf("fsm: snapshot has key %q twice", pk.GetKey())
		}
		s.kv[pk.GetKey()] = &kvEntry{deleted: pk.GetDeleted(), kv: KeyValue{
			Key: pk.GetKey(), Value: pk.GetValue(), Token: pk.GetToken(), Lock: pk.GetLock(),
			HighestToken: pk.GetHighestToken(), CreateRevision: pk.GetCreateRevision(),
			ModRevision: pk.GetModRevision(), Version: pk.GetVersion(), Session: pk.GetSessionId(),
		}, user: pk.GetUser()}
		if !pk.GetDeleted() {
			s.liveKeys++
			s.liveBytes += len(pk.GetKey()) + len(pk.GetValue())
		}
		if id := pk.GetSessionId(); id != 0 {
			sess, ok := s.sessions[id]
			if !ok {
				return fmt.Errorf("fsm: snapshot key %q is bound to unknown session %d", pk.GetKey(), id)
			}
			addName(&sess.keys, pk.GetKey())
		}
	}
	return nil
}
