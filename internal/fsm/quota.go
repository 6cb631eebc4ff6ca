package fsm

import (
	"fmt"

	"github.com/fencelock/fence"
)

// Quotas per user (docs/design.md, Auth): while auth is enabled, a user's
// live sessions (those created with the user's credential, recorded in
// each session) and the locks those sessions hold or wait for are bounded
// by the user's quotas, kept with the user in the replicated auth state.
// The counts come from the state alone, so every replica refuses the same
// commands. With auth off, or for a session created with auth off, no
// quota applies.

// Quota bounds what one user's sessions may use; 0: no bound.
type Quota struct {
	MaxSessions uint64
	MaxLocks    uint64
}

func (q Quota) String() string {
	f := func(n uint64) string {
		if n == 0 {
			return "none"
		}
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("sessions %s, locks %s", f(q.MaxSessions), f(q.MaxLocks))
}

func (s *State) indexUser(sess *session) {
	if sess.user == "" {
		return
	}
	ids := s.byUser[sess.user]
	if ids == nil {
		ids = map[uint64]struct{}{}
		s.byUser[sess.user] = ids
	}
	ids[sess.id] = struct{}{}
}

func (s *State) unindexUser(sess *session) {
	if ids := s.byUser[sess.user]; ids != nil {
		delete(ids, sess.id)
		if len(ids) == 0 {
			delete(s.byUser, sess.user)
		}
	}
}

// quotaOf returns user's quota, when auth is enforced and the user has one.
func (s *State) quotaOf(user string) (Quota, bool) {
	if !s.auth.enabled || user == "" {
		return Quota{}, false
	}
	q, ok := s.auth.quotas[user]
	return q, ok
}

// checkSessionQuota refuses a session that would be one more than user's
// sessions quota allows.
func (s *State) checkSessionQuota(user string) error {
	q, ok := s.quotaOf(user)
	if n := uint64(len(s.byUser[user])); ok && q.MaxSessions > 0 && n >= q.MaxSessions {
		return fmt.Errorf("%w: user %s: sessions quota %d reached; close unused sessions or raise the quota (fence user set-quota)", fence.ErrLimit, user, q.MaxSessions)
	}
	return nil
}

// checkLockQuota refuses an acquire that would make the locks sess's user
// holds or waits for, over all the user's sessions, one more than the
// user's locks quota allows. sess is neither holder nor waiter of the lock.
func (s *State) checkLockQuota(sess *session) error {
	q, ok := s.quotaOf(sess.user)
	if !ok || q.MaxLocks == 0 {
		return nil
	}
	var n uint64
	for id := range s.byUser[sess.user] {
		other := s.sessions[id]
		n += uint64(len(other.holds) + len(other.waits))
	}
	if n >= q.MaxLocks {
		return fmt.Errorf("%w: user %s: locks quota %d reached; release locks or raise the quota (fence user set-quota)", fence.ErrLimit, sess.user, q.MaxLocks)
	}
	return nil
}

// UserUsage returns how many live sessions user created and how many
// locks they hold or wait for.
func (s *State) UserUsage(user string) (sessions, locks int) {
	for id := range s.byUser[user] {
		sess := s.sessions[id]
		locks += len(sess.holds) + len(sess.waits)
	}
	return len(s.byUser[user]), locks
}

// checkByUser verifies that byUser indexes exactly the sessions with a
// user.
func (s *State) checkByUser() error {
	for user, ids := range s.byUser {
		if len(ids) == 0 {
			return fmt.Errorf("user %q has an empty session index", user)
		}
		for id := range ids {
			sess, ok := s.sessions[id]
			if !ok || sess.user != user {
				return fmt.Errorf("session %d is indexed under user %q but is not theirs", id, user)
			}
		}
	}
	for id, sess := range s.sessions {
		if _, ok := s.byUser[sess.user][id]; sess.user != "" && !ok {
			return fmt.Errorf("session %d of user %q is not indexed", id, sess.user)
		}
	}
	return nil
}
