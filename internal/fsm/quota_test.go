package fsm_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func setQuota(user string, sessions, locks uint64) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_SetQuota{SetQuota: &fsmpb.AuthUser{Name: user, MaxSessions: sessions, MaxLocks: locks}}})
}

func userSession(user string) *fsmpb.Command {
	c := createSession(10*time.Second, "test", 0)
	c.GetCreateSession().User = user
	return c
}

func setEnabled(on bool) *fsmpb.Command {
	return authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_SetEnabled{SetEnabled: &fsmpb.SetAuthEnabled{Enabled: on}}})
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
	applyAll(t, s, authCmd(&fsmpb.Auth{Op: &fsmpb.Auth_RemoveUser{RemoveUser: &fsmpb.AuthUser{Name: "alice"}}}), addUser("alice"))
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
