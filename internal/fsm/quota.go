package fsm

import (
	"fmt"
	"math"
	"strconv"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Quotas per user (docs/design.md, Auth): while auth is enabled, a user's
// live sessions (those created with the user's credential, recorded in
// each session), the locks those sessions hold or wait for, of those the
// ones they wait for, and the bytes of the live KV keys charged to the
// user are bounded by the user's quotas, kept with the user in the
// replicated auth state. With auth off, or for a session or a write made
// with auth off, no quota applies.
//
// A KV key's bytes (its name and its value) are charged to the user who
// wrote it last: an overwrite moves the whole charge to its writer, a
// delete (or the end of the session the key is bound to) frees it. The key
// records its user; the sums are derived.
//
// The usage of each user is kept in running counters, updated by every
// command that creates or ends a session, queues, grants, releases or
// drops a wait, or writes or deletes a key, so that a check costs O(1).
// They are derived state: never stored, rebuilt from the sessions, locks
// and keys on Restore, and checked against a recount by CheckInvariants.
// They are sums, so the order in which they are built does not matter.
//
// The session rate and burst are kept here with the other quotas, but
// enforced by the leader at the edge, on its clock: the state machine
// reads no clock.

// Quota bounds what one user's sessions may use; 0: no bound.
type Quota struct {
	MaxSessions uint64
	// MaxLocks bounds the locks held or waited for: a wait counts, so that
	// a waiter granted later never takes the user over the quota.
	MaxLocks uint64
	// MaxWaits bounds, of those, the locks waited for.
	MaxWaits uint64
	// MaxKVBytes bounds the bytes (names and values) of the live KV keys
	// charged to the user.
	MaxKVBytes uint64
	// SessionRate (sessions per second) and SessionBurst are a token
	// bucket on creating sessions, enforced at the edge; 0: the server's
	// default.
	SessionRate  float64
	SessionBurst uint64
}

// Bounds of a quota's values. A larger one is refused as a mistake (a
// negative number cast to uint64, a unit mixed up), not taken as "no
// limit": 0 says that.
const (
	MaxQuotaCount   uint64  = 1 << 40 // sessions, locks, waits, burst
	MaxQuotaKVBytes uint64  = 1 << 50
	MaxSessionRate  float64 = 1e6 // per second
)

func (q Quota) String() string {
	f := func(n uint64) string {
		if n == 0 {
			return "none"
		}
		return fmt.Sprint(n)
	}
	rate := "default"
	if q.SessionRate > 0 {
		rate = fmt.Sprintf("%s/s burst %d", strconv.FormatFloat(q.SessionRate, 'g', -1, 64), q.SessionBurst)
	}
	return fmt.Sprintf("sessions %s, locks %s, waits %s, kv bytes %s, session rate %s",
		f(q.MaxSessions), f(q.MaxLocks), f(q.MaxWaits), f(q.MaxKVBytes), rate)
}

// CheckQuota checks a quota as given by a caller: every count within
// MaxQuotaCount, bytes within MaxQuotaKVBytes, a rate that is a number
// from 0 to MaxSessionRate, and a burst exactly when there is a rate. Its
// errors name the fields as the API does (max_locks).
func CheckQuota(q Quota) error { return CheckQuotaNamed(q, apiField) }

// CheckQuotaNamed is CheckQuota with each field named by name(field),
// where field is the API's name (max_locks): a command line names its
// flags (--max-locks).
func CheckQuotaNamed(q Quota, name func(field string) string) error {
	for _, c := range []struct {
		name  string
		value uint64
	}{{"max_sessions", q.MaxSessions}, {"max_locks", q.MaxLocks}} {
		if c.value > MaxQuotaCount {
			return fmt.Errorf("%w: %s %d is over the limit of %d (0 means no limit)", fence.ErrInvalidArgument, name(c.name), c.value, MaxQuotaCount)
		}
	}
	return checkQuotaApplied(q, name)
}

// apiField names a quota's field as the API does.
func apiField(field string) string { return field }

// checkQuotaApplied is the state machine's check of a quota: CheckQuota's
// but for the bounds of max_sessions and max_locks, which versions before
// the bounds accepted at any value. The state machine applies what they
// committed, in old logs and snapshots, as they did (a value over the
// bound means no limit that matters); only new calls are bounded, at the
// edge.
func checkQuotaApplied(q Quota, name func(field string) string) error {
	for _, c := range []struct {
		name  string
		value uint64
		limit uint64
	}{
		{"max_waits", q.MaxWaits, MaxQuotaCount},
		{"max_kv_bytes", q.MaxKVBytes, MaxQuotaKVBytes},
		{"session_burst", q.SessionBurst, MaxQuotaCount},
	} {
		if c.value > c.limit {
			return fmt.Errorf("%w: %s %d is over the limit of %d (0 means no limit)", fence.ErrInvalidArgument, name(c.name), c.value, c.limit)
		}
	}
	rate, burst := name("session_rate"), name("session_burst")
	switch r := q.SessionRate; {
	case math.IsNaN(r) || r < 0 || r > MaxSessionRate:
		return fmt.Errorf("%w: %s %v is not a number of sessions per second from 0 to %g", fence.ErrInvalidArgument, rate, r, MaxSessionRate)
	case r > 0 && q.SessionBurst == 0:
		return fmt.Errorf("%w: %s %v needs a %s of at least 1", fence.ErrInvalidArgument, rate, r, burst)
	case r == 0 && q.SessionBurst > 0:
		return fmt.Errorf("%w: %s %d needs a %s", fence.ErrInvalidArgument, burst, q.SessionBurst, rate)
	}
	return nil
}

func quotaOf(u *fsmpb.AuthUser) Quota {
	return Quota{MaxSessions: u.GetMaxSessions(), MaxLocks: u.GetMaxLocks(), MaxWaits: u.GetMaxWaits(),
		MaxKVBytes: u.GetMaxKvBytes(), SessionRate: u.GetSessionRate(), SessionBurst: u.GetSessionBurst()}
}

// Usage is what a user's sessions and writes use now.
type Usage struct {
	// Sessions are the live sessions the user created with auth on.
	Sessions uint64
	// Locks are the locks those sessions hold or wait for, Waits the ones
	// they wait for.
	Locks, Waits uint64
	// KVBytes are the bytes of the live KV keys charged to the user.
	KVBytes uint64
}

// UserUsage returns what user uses now.
func (s *State) UserUsage(user string) Usage {
	if u := s.usage[user]; u != nil {
		return *u
	}
	return Usage{}
}

// useOf returns user's counters, made on first use; nil for no user.
func (s *State) useOf(user string) *Usage {
	if user == "" {
		return nil
	}
	u := s.usage[user]
	if u == nil {
		u = &Usage{}
		s.usage[user] = u
	}
	return u
}

// tidyUsage drops user's counters once they are all zero, so that the
// map holds only users who use something.
func (s *State) tidyUsage(user string) {
	if u := s.usage[user]; u != nil && *u == (Usage{}) {
		delete(s.usage, user)
	}
}

// countSession counts a session of user (delta 1) or stops counting it
// with every lock it holds or waits for (delta -1).
func (s *State) countSession(sess *session, delta int) {
	u := s.useOf(sess.user)
	if u == nil {
		return
	}
	if delta > 0 {
		u.Sessions++
		return
	}
	u.Sessions--
	u.Locks -= uint64(len(sess.holds) + len(sess.waits))
	u.Waits -= uint64(len(sess.waits))
	s.tidyUsage(sess.user)
}

// addHold, dropHold, addWait and dropWait index a lock in its session and
// count it for the session's user.
func (s *State) addHold(sess *session, name string) {
	addName(&sess.holds, name)
	if u := s.useOf(sess.user); u != nil {
		u.Locks++
	}
}

func (s *State) dropHold(sess *session, name string) {
	dropName(&sess.holds, name)
	if u := s.useOf(sess.user); u != nil {
		u.Locks--
		s.tidyUsage(sess.user)
	}
}

func (s *State) addWait(sess *session, name string) {
	addName(&sess.waits, name)
	if u := s.useOf(sess.user); u != nil {
		u.Locks++
		u.Waits++
	}
}

func (s *State) dropWait(sess *session, name string) {
	dropName(&sess.waits, name)
	if u := s.useOf(sess.user); u != nil {
		u.Locks--
		u.Waits--
		s.tidyUsage(sess.user)
	}
}

// kvCharge is what a live key costs its user.
func kvCharge(e *kvEntry) uint64 { return uint64(len(e.kv.Key) + len(e.kv.Value)) }

// chargeKey charges a live key's bytes to its user (delta 1) or frees them (-1).
func (s *State) chargeKey(e *kvEntry, delta int) {
	u := s.useOf(e.user)
	if u == nil {
		return
	}
	if delta > 0 {
		u.KVBytes += kvCharge(e)
		return
	}
	u.KVBytes -= kvCharge(e)
	s.tidyUsage(e.user)
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
	if ok && q.MaxSessions > 0 && s.UserUsage(user).Sessions >= q.MaxSessions {
		return fmt.Errorf("%w: user %s: sessions quota %d reached; close unused sessions or raise the quota (fence user set-quota)", fence.ErrLimit, user, q.MaxSessions)
	}
	return nil
}

// checkLockQuota refuses an acquire that would make the locks sess's user
// holds or waits for, over all the user's sessions, one more than the
// user's locks quota allows, or, for an acquire that would wait (queued),
// the waits one more than the waits quota allows. sess is neither holder
// nor waiter of the lock.
func (s *State) checkLockQuota(sess *session, queued bool) error {
	q, ok := s.quotaOf(sess.user)
	if !ok {
		return nil
	}
	use := s.UserUsage(sess.user)
	if q.MaxLocks > 0 && use.Locks >= q.MaxLocks {
		return fmt.Errorf("%w: user %s: locks quota %d reached; release locks or raise the quota (fence user set-quota)", fence.ErrLimit, sess.user, q.MaxLocks)
	}
	if queued && q.MaxWaits > 0 && use.Waits >= q.MaxWaits {
		return fmt.Errorf("%w: user %s: waits quota %d reached; the lock is taken, and the user's sessions already wait for %d locks (fence user set-quota)", fence.ErrLimit, sess.user, q.MaxWaits, use.Waits)
	}
	return nil
}

// checkKVQuota refuses a put by user that would take the bytes charged to
// the user over the kv bytes quota: the key's bytes after the put, less
// what the key costs the user now if the user wrote it last.
func (s *State) checkKVQuota(user string, e *kvEntry, key string, value []byte) error {
	q, ok := s.quotaOf(user)
	if !ok || q.MaxKVBytes == 0 {
		return nil
	}
	used := s.UserUsage(user).KVBytes
	if e.live() && e.user == user {
		used -= kvCharge(e)
	}
	if size := uint64(len(key) + len(value)); used+size > q.MaxKVBytes {
		return fmt.Errorf("%w: user %s: kv bytes quota %d reached; key %s of %d bytes would make %d; delete keys or raise the quota (fence user set-quota)",
			fence.ErrLimit, user, q.MaxKVBytes, key, size, used+size)
	}
	return nil
}

// recountUsage returns every user's usage counted from the sessions and
// keys, for Restore and CheckInvariants.
func (s *State) recountUsage() map[string]*Usage {
	out := map[string]*Usage{}
	use := func(user string) *Usage {
		u := out[user]
		if u == nil {
			u = &Usage{}
			out[user] = u
		}
		return u
	}
	for _, sess := range s.sessions {
		if sess.user == "" {
			continue
		}
		u := use(sess.user)
		u.Sessions++
		u.Locks += uint64(len(sess.holds) + len(sess.waits))
		u.Waits += uint64(len(sess.waits))
	}
	for _, e := range s.kv {
		if e.live() && e.user != "" {
			use(e.user).KVBytes += kvCharge(e)
		}
	}
	return out
}

// checkUsage verifies that the running counters are the recount (a user
// not counted uses nothing), and that no tombstone is charged to anyone.
func (s *State) checkUsage() error {
	want := s.recountUsage()
	for user, u := range s.usage {
		if w := want[user]; (w == nil && *u != Usage{}) || (w != nil && *w != *u) {
			return fmt.Errorf("user %q's usage is counted as %+v, but is %+v", user, *u, s.recountUsage()[user])
		}
	}
	for user, w := range want {
		if _, ok := s.usage[user]; !ok && *w != (Usage{}) {
			return fmt.Errorf("user %q's usage %+v is not counted", user, *w)
		}
	}
	for key, e := range s.kv {
		if !e.live() && e.user != "" {
			return fmt.Errorf("tombstone %q is charged to user %q", key, e.user)
		}
	}
	return nil
}
