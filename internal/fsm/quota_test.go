package fsm_test

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func setQuota(user string, sessions, locks uint64) *fsmpb.Command {
	return setQuotaOf(user, fsm.Quota{MaxSessions: sessions, MaxLocks: locks})
}

func setQuotaOf(user string, q fsm.Quota) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_SetQuota{SetQuota: &fsmpb.AuthUser{Name: user, MaxSessions: q.MaxSessions, MaxLocks: q.MaxLocks,
		MaxWaits: q.MaxWaits, MaxKvBytes: q.MaxKVBytes, SessionRate: q.SessionRate, SessionBurst: q.SessionBurst}}})
}

func userSession(user string) *fsmpb.Command {
	c := createSession(10*time.Second, "test", 0)
	c.GetCreateSession().User = user
	return c
}

// TestQuotas: with auth on, a user's sessions and the locks they hold or
// wait for are bounded by the user's quotas, counted over every session
// the user created; a refusal is ErrLimit naming the user and the quota,
// and changes nothing. Ending a session or releasing a lock frees quota;
// with auth off, or for another user, no quota applies.
func TestQuotas(t *testing.T) {
	type step struct {
		cmd  *fsmpb.Command
		want string // "" ok; otherwise a part of the ErrLimit message
	}
	for _, tc := range []struct {
		name  string
		auth  bool
		steps []step
	}{
		{"sessions quota", true, []step{
			{userSession("alice"), ""}, // 1
			{userSession("alice"), ""}, // 2
			{userSession("alice"), "user alice: sessions quota 2 reached"},
			{userSession("bob"), ""},   // 3: bob has no quota
			{userSession(""), ""},      // 4: no user
			{closeSession(1), ""},      // alice has one left
			{userSession("alice"), ""}, // 5
			{userSession("alice"), "sessions quota 2"},
			{expireSessions(2), ""},
			{userSession("alice"), ""},
		}},
		{"locks quota over sessions", true, []step{
			{userSession("alice"), ""}, // 1
			{userSession("alice"), ""}, // 2
			{userSession("bob"), ""},   // 3
			{acquire(1, "a", excl), ""},
			{acquire(2, "b", excl), ""},
			{acquire(3, "a", excl), ""}, // bob waits: not alice's
			{acquire(1, "c", excl), "user alice: locks quota 2 reached"},
			{acquire(2, "a", excl), "locks quota 2"}, // a wait counts too
			{acquire(1, "a", excl), ""},              // held already: no new lock
			{release(1, "a", 1), ""},                 // a goes to bob
			{acquire(2, "c", excl), ""},
			{acquire(2, "d", excl), "locks quota 2"},
			{closeSession(2), ""},
			{acquire(1, "d", excl), ""},
		}},
		{"quota raised and removed", true, []step{
			{userSession("alice"), ""},
			{userSession("alice"), ""},
			{userSession("alice"), "sessions quota 2"},
			{setQuota("alice", 3, 2), ""},
			{userSession("alice"), ""},
			{userSession("alice"), "sessions quota 3"},
			{setQuota("alice", 0, 0), ""},
			{userSession("alice"), ""},
		}},
		{"waits quota", true, []step{
			{setQuotaOf("alice", fsm.Quota{MaxWaits: 1}), ""},
			{userSession("alice"), ""}, // 1
			{userSession("alice"), ""}, // 2
			{userSession("bob"), ""},   // 3
			{acquire(3, "a", excl), ""},
			{acquire(3, "b", excl), ""},
			{acquire(1, "a", excl), ""}, // alice waits for a
			{acquire(2, "b", excl), "user alice: waits quota 1 reached"},
			{acquire(2, "c", excl), ""}, // granted at once: not a wait
			{acquire(1, "a", excl), ""}, // waits already: no new wait
			{release(3, "a", 1), ""},    // a goes to alice: her wait is a hold
			{acquire(2, "b", excl), ""}, // one wait again
			{acquire(1, "d", excl), ""}, // granted
			{acquire(1, "b", excl), "waits quota 1"},
			{closeSession(2), ""}, // frees her wait
			{acquire(1, "b", excl), ""},
		}},
		{"kv bytes quota", true, []step{
			{setQuotaOf("alice", fsm.Quota{MaxKVBytes: 10}), ""},
			{userSession("alice"), ""},                 // 1
			{kvPut("k1", "abcd", byUser("alice")), ""}, // 6 bytes
			{kvPut("k2", "abcd", byUser("alice")), "user alice: kv bytes quota 10 reached"},
			{kvPut("k1", "abcdefgh", byUser("alice")), ""}, // her own key: 10
			{kvPut("k1", "abcdefghi", byUser("alice")), "kv bytes quota 10"},
			{kvPut("k1", "x", byUser("bob")), ""},          // bob's now
			{kvPut("k2", "abcdefgh", byUser("alice")), ""}, // 10
			{kvPut("k3", "", byUser("alice")), "kv bytes quota 10"},
			{kvDel("k2"), ""}, // frees 10
			{kvPut("k3", "abcdefgh", byUser("alice"), boundTo(1)), ""},
			{kvPut("k4", "", byUser("alice")), "kv bytes quota 10"},
			{closeSession(1), ""}, // deletes k3
			{kvPut("k4", "abcdefgh", byUser("alice")), ""},
			{kvPut("k5", "abcdefgh", byUser("")), ""}, // no user: charged to nobody
			{kvPut("k4", "abcdefgh", byUser("")), ""}, // overwritten by nobody: frees alice
			{kvPut("k6", "abcdefgh", byUser("alice")), ""},
		}},
		{"kv bytes quota, auth off", false, []step{
			{setQuotaOf("alice", fsm.Quota{MaxKVBytes: 10}), ""},
			{kvPut("k1", "abcdefgh", byUser("alice")), ""},
			{kvPut("k2", "abcdefgh", byUser("alice")), ""},
		}},
		{"auth off", false, []step{
			{userSession("alice"), ""},
			{userSession("alice"), ""},
			{userSession("alice"), ""},
			{acquire(1, "a", excl), ""},
			{acquire(1, "b", excl), ""},
			{acquire(1, "c", excl), ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fsm.NewState()
			applyAll(t, s, addUser("root"), grantRole("root", "root"), addUser("alice"), addUser("bob"), setQuota("alice", 2, 2))
			if tc.auth {
				applyAll(t, s, setEnabled(true))
			}
			for i, st := range tc.steps {
				before := snapshotBytes(t, s)
				res := s.Apply(st.cmd)
				switch {
				case st.want == "" && res.Err != nil:
					t.Fatalf("step %d %v: %v", i, st.cmd, res.Err)
				case st.want != "" && (!errors.Is(res.Err, fence.ErrLimit) || !strings.Contains(res.Err.Error(), st.want)):
					t.Fatalf("step %d %v: %v, want ErrLimit with %q", i, st.cmd, res.Err, st.want)
				case st.want != "" && !bytes.Equal(before, snapshotBytes(t, s)):
					t.Fatalf("step %d: a refused command changed the state", i)
				}
				if err := s.CheckInvariants(); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				mustRestore(t, s)
			}
		})
	}
}

// TestQuotaRefusesBadValues: a quota out of bounds (a negative number
// cast, a rate that is no number, a rate without a burst) is refused with
// ErrInvalidArgument naming the field, by set_quota and add_user, and
// changes nothing.
func TestQuotaRefusesBadValues(t *testing.T) {
	s := fsm.NewState()
	applyAll(t, s, addUser("alice"), setQuota("alice", 2, 3))
	for _, tc := range []struct {
		q    fsm.Quota
		want string
	}{
		{fsm.Quota{MaxWaits: math.MaxUint64 - 1}, "max_waits"},
		{fsm.Quota{MaxKVBytes: fsm.MaxQuotaKVBytes + 1}, "max_kv_bytes"},
		{fsm.Quota{SessionRate: -1, SessionBurst: 1}, "session_rate -1"},
		{fsm.Quota{SessionRate: math.NaN(), SessionBurst: 1}, "session_rate NaN"},
		{fsm.Quota{SessionRate: math.Inf(1), SessionBurst: 1}, "session_rate +Inf"},
		{fsm.Quota{SessionRate: 2e6, SessionBurst: 1}, "session_rate 2e+06"},
		{fsm.Quota{SessionRate: 1}, "needs a session_burst"},
		{fsm.Quota{SessionBurst: 5}, "needs a session_rate"},
		{fsm.Quota{SessionRate: 1, SessionBurst: math.MaxUint64}, "session_burst"},
	} {
		before := snapshotBytes(t, s)
		if err := fsm.CheckQuota(tc.q); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckQuota(%+v) = %v, want ErrInvalidArgument with %q", tc.q, err, tc.want)
		}
		res := s.Apply(setQuotaOf("alice", tc.q))
		if !errors.Is(res.Err, fence.ErrInvalidArgument) || !strings.Contains(res.Err.Error(), tc.want) {
			t.Errorf("set_quota %+v: %v, want ErrInvalidArgument with %q", tc.q, res.Err, tc.want)
		}
		add := authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_AddUser{AddUser: &fsmpb.AuthUser{Name: "bob", MaxSessions: tc.q.MaxSessions, MaxLocks: tc.q.MaxLocks,
			MaxWaits: tc.q.MaxWaits, MaxKvBytes: tc.q.MaxKVBytes, SessionRate: tc.q.SessionRate, SessionBurst: tc.q.SessionBurst}}})
		if res := s.Apply(add); !errors.Is(res.Err, fence.ErrInvalidArgument) {
			t.Errorf("add_user with %+v: %v, want ErrInvalidArgument", tc.q, res.Err)
		}
		if !bytes.Equal(before, snapshotBytes(t, s)) {
			t.Fatalf("a refused quota %+v changed the state", tc.q)
		}
	}
	good := fsm.Quota{MaxSessions: fsm.MaxQuotaCount, MaxKVBytes: fsm.MaxQuotaKVBytes, SessionRate: 0.5, SessionBurst: 1}
	applyAll(t, s, setQuotaOf("alice", good))
	if u, _ := mustRestore(t, s).User("alice"); u.Quota != good {
		t.Fatalf("alice's quota %+v after a restore, want %+v", u.Quota, good)
	}

	// max_sessions and max_locks took any value before they were bounded:
	// the edge bounds new calls, but the state machine applies, and
	// restores, what older versions committed, or a node replaying an old
	// log would refuse what the others applied.
	for _, tc := range []struct {
		q    fsm.Quota
		want string
	}{
		{fsm.Quota{MaxSessions: math.MaxUint64}, "max_sessions 18446744073709551615 is over the limit"},
		{fsm.Quota{MaxLocks: fsm.MaxQuotaCount + 1}, "max_locks"},
	} {
		if err := fsm.CheckQuota(tc.q); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckQuota(%+v) = %v, want ErrInvalidArgument with %q", tc.q, err, tc.want)
		}
		applyAll(t, s, setQuotaOf("alice", tc.q))
		if u, _ := mustRestore(t, s).User("alice"); u.Quota != tc.q {
			t.Errorf("alice's quota %+v after a restore, want %+v", u.Quota, tc.q)
		}
	}
}

// TestQuotaState: quotas are kept with the user, in snapshots, listed by
// User, set only for a user who exists, and go with the user.
func TestQuotaState(t *testing.T) {
	s := fsm.NewState()
	if res := s.Apply(setQuota("nobody", 1, 1)); !errors.Is(res.Err, fence.ErrInvalidArgument) {
		t.Fatalf("quota of a missing user: %v", res.Err)
	}
	applyAll(t, s, authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_AddUser{AddUser: &fsmpb.AuthUser{Name: "alice", MaxSessions: 5, MaxLocks: 7}}}))
	want := fsm.Quota{MaxSessions: 5, MaxLocks: 7}
	if u, _ := s.User("alice"); u.Quota != want {
		t.Fatalf("alice's quota %v, want %v", u.Quota, want)
	}
	if u, _ := mustRestore(t, s).User("alice"); u.Quota != want {
		t.Fatalf("restored: alice's quota %v, want %v", u.Quota, want)
	}
	applyAll(t, s, removeUser("alice"), addUser("alice"))
	if u, _ := s.User("alice"); u.Quota != (fsm.Quota{}) {
		t.Fatalf("a user added again kept the old quota %v", u.Quota)
	}
}

// TestQuotaAfterRestore: a restored state counts the sessions and locks
// each user had, from the users the sessions recorded.
func TestQuotaAfterRestore(t *testing.T) {
	s := fsm.NewState()
	applyAll(t, s, addUser("root"), grantRole("root", "root"), addUser("alice"), setQuota("alice", 1, 1), setEnabled(true),
		userSession("alice"), acquire(1, "a", excl))
	r := mustRestore(t, s)
	if res := r.Apply(userSession("alice")); !errors.Is(res.Err, fence.ErrLimit) {
		t.Fatalf("restored: a second session of alice: %v, want ErrLimit", res.Err)
	}
	applyAll(t, r, setQuota("alice", 2, 1), userSession("alice"))
	if res := r.Apply(acquire(2, "b", excl)); !errors.Is(res.Err, fence.ErrLimit) {
		t.Fatalf("restored: a second lock of alice: %v, want ErrLimit", res.Err)
	}
	if err := r.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestUsageAfterRestore: the usage counters are derived state, rebuilt
// from the sessions, locks and keys of a snapshot (which stores none), so
// that a restored state refuses exactly what the original does.
func TestUsageAfterRestore(t *testing.T) {
	s := fsm.NewState()
	applyAll(t, s, addUser("root"), grantRole("root", "root"), addUser("alice"), addUser("bob"),
		setQuotaOf("alice", fsm.Quota{MaxLocks: 3, MaxWaits: 1, MaxKVBytes: 10}), setEnabled(true),
		userSession("alice"), userSession("bob"), // 1, 2
		acquire(2, "a", excl), acquire(2, "b", excl), acquire(1, "a", excl), acquire(1, "c", excl),
		kvPut("k", "abcdefg", byUser("alice")), kvPut("j", "x", byUser("bob")))
	want := fsm.Usage{Sessions: 1, Locks: 2, Waits: 1, KVBytes: 8}
	if got := s.UserUsage("alice"); got != want {
		t.Fatalf("alice uses %+v, want %+v", got, want)
	}
	r := mustRestore(t, s)
	if got := r.UserUsage("alice"); got != want {
		t.Fatalf("restored: alice uses %+v, want %+v", got, want)
	}
	if got := r.UserUsage("bob"); got != (fsm.Usage{Sessions: 1, Locks: 2, KVBytes: 2}) {
		t.Fatalf("restored: bob uses %+v", got)
	}
	if res := r.Apply(acquire(1, "b", excl)); !errors.Is(res.Err, fence.ErrLimit) || !strings.Contains(res.Err.Error(), "waits quota 1") {
		t.Fatalf("restored: a second wait of alice: %v", res.Err)
	}
	if res := r.Apply(kvPut("k2", "ab", byUser("alice"))); !errors.Is(res.Err, fence.ErrLimit) || !strings.Contains(res.Err.Error(), "kv bytes quota 10") {
		t.Fatalf("restored: alice's put over her kv bytes: %v", res.Err)
	}
	applyAll(t, r, closeSession(2), closeSession(1), kvDel("k"), kvDel("j"))
	if got := r.UserUsage("alice"); got != (fsm.Usage{}) {
		t.Fatalf("alice uses %+v once her sessions and keys are gone", got)
	}
}
