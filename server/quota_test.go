package server

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
)

// rootAliceAndBob sets up on s, while auth is off, user root and users
// alice and bob, each with a role of its own holding perms, and returns a
// client of each.
func rootAliceAndBob(tb testing.TB, s *Server, perms ...*client.Permission) (root, alice, bob *client.Client) {
	tb.Helper()
	root, _ = mustRootClient(tb, s)
	alice = mustClient(tb, s, addUser(tb, root, "alice", perms...))
	bob = mustClient(tb, s, addUser(tb, root, "bob", perms...))
	return root, alice, bob
}

// A real server with auth on enforces a user's quotas on the sessions
// created with the user's token and on the locks they take, counted over
// all of them: a call beyond one fails with resource_exhausted naming the
// quota; closing a session frees it; another user is not counted; with
// auth off no quota applies.
func TestQuotaRealServer(t *testing.T) {
	s := startTestServer(t, nil)
	ctx := context.Background()
	rc, alice, bob := rootAliceAndBob(t, s, perm(client.PermLock, client.Write, ""))
	if err := rc.UserSetQuota(ctx, "alice", client.Quota{MaxSessions: 2, MaxLocks: 1}); err != nil {
		t.Fatal(err)
	}
	if err := rc.UserSetQuota(ctx, "nobody", client.Quota{MaxSessions: 2, MaxLocks: 1}); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("quota of a missing user: %v", err)
	}
	mustAuthEnable(t, rc)
	newSession := func(c *client.Client) (*client.Session, error) {
		sess, err := c.NewSession(ctx, client.WithTTL(30*time.Second))
		if err == nil {
			t.Cleanup(func() { sess.Close(context.Background()) })
		}
		return sess, err
	}
	refused := func(err error, quota string) {
		t.Helper()
		// The client maps resource_exhausted to fence.ErrLimit.
		if !errors.Is(err, fence.ErrLimit) || !strings.Contains(err.Error(), quota) {
			t.Fatalf("got %v, want resource_exhausted (fence.ErrLimit) naming %q", err, quota)
		}
	}
	s1, err := newSession(alice)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := newSession(alice)
	if err != nil {
		t.Fatal(err)
	}
	_, err = newSession(alice)
	refused(err, "user alice: sessions quota 2 reached")
	if _, err := newSession(bob); err != nil {
		t.Fatalf("bob has no quota: %v", err)
	}
	if _, err := client.NewMutex(s1, "a").TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = client.NewMutex(s2, "b").TryLock(ctx)
	refused(err, "user alice: locks quota 1 reached")

	users, err := rc.Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		if u.GetName() == "alice" && (u.GetMaxSessions() != 2 || u.GetMaxLocks() != 1 || u.GetSessions() != 2 || u.GetLocks() != 1) {
			t.Fatalf("alice listed as %v", u)
		}
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := newSession(alice); err != nil {
		t.Fatalf("a closed session frees its quota: %v", err)
	}
	if err := rc.AuthDisable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := newSession(alice); err != nil {
		t.Fatalf("auth off: %v", err)
	}
	if _, err := client.NewMutex(s1, "c").TryLock(ctx); err != nil {
		t.Fatalf("auth off: %v", err)
	}
}

// A real server with auth on enforces the waits and KV bytes quotas: a
// second wait of a user whose quota is one wait, and a put that would take
// the bytes charged to the user over the quota, fail with
// resource_exhausted naming user and quota and change nothing; the usage
// is listed. A quota out of bounds is refused and changes nothing.
func TestQuotaWaitsAndKVBytesRealServer(t *testing.T) {
	s := startTestServer(t, nil)
	ctx := context.Background()
	rc, alice, bob := rootAliceAndBob(t, s, perm(client.PermLock, client.Write, ""), perm(client.PermKV, client.Write, ""))
	quota := client.Quota{MaxWaits: 1, MaxKVBytes: 16}
	if err := rc.UserSetQuota(ctx, "alice", quota); err != nil {
		t.Fatal(err)
	}
	mustAuthEnable(t, rc)
	refused := func(err error, quota string) {
		t.Helper()
		if !errors.Is(err, fence.ErrLimit) || !strings.Contains(err.Error(), quota) {
			t.Fatalf("got %v, want resource_exhausted (fence.ErrLimit) naming %q", err, quota)
		}
	}
	listed := func(name string) *client.User {
		t.Helper()
		users, err := rc.Users(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range users {
			if u.GetName() == name {
				return u
			}
		}
		t.Fatalf("no user %s listed", name)
		return nil
	}

	// KV bytes: 12 of 16, then 6 more refused; the key stays absent.
	if _, err := alice.KV().Put(ctx, "k1", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	_, err := alice.KV().Put(ctx, "k2", []byte("abcd"))
	refused(err, "user alice: kv bytes quota 16 reached")
	if kv, err := rc.KV().Get(ctx, "k2"); err != nil || kv != nil {
		t.Fatalf("a refused put left %v, %v", kv, err)
	}
	if u := listed("alice"); u.GetKvBytes() != 12 || u.GetMaxKvBytes() != 16 {
		t.Fatalf("alice listed as %v", u)
	}
	// bob overwrites alice's key: the bytes are his now.
	if _, err := bob.KV().Put(ctx, "k1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.KV().Put(ctx, "k2", []byte("abcd")); err != nil {
		t.Fatalf("alice's bytes were freed by bob's overwrite: %v", err)
	}

	// Waits: bob holds w1 and w2; alice may wait for one of them.
	bs := mustNewSession(t, bob, client.WithTTL(30*time.Second))
	defer bs.Close(ctx)
	for _, name := range []string{"w1", "w2"} {
		if _, err := client.NewMutex(bs, name).TryLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	as := mustNewSession(t, alice, client.WithTTL(30*time.Second))
	defer as.Close(ctx)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go client.NewMutex(as, "w1").Lock(waitCtx)
	waitFor(t, "alice to wait for w1", func() bool { return listed("alice").GetWaits() == 1 })
	_, err = client.NewMutex(as, "w2").Lock(ctx)
	refused(err, "user alice: waits quota 1 reached")
	if u := listed("alice"); u.GetWaits() != 1 || u.GetLocks() != 1 || u.GetMaxWaits() != 1 {
		t.Fatalf("alice listed as %v", u)
	}

	// Out of bounds: refused, nothing changed.
	for _, bad := range []client.Quota{{MaxSessions: math.MaxUint64}, {SessionRate: -1, SessionBurst: 1}, {SessionRate: 3}} {
		if err := rc.UserSetQuota(ctx, "alice", bad); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Fatalf("quota %+v: %v, want invalid_argument", bad, err)
		}
	}
	if got := client.QuotaOf(listed("alice")); got != quota {
		t.Fatalf("alice's quota is %+v after refused changes, want %+v", got, quota)
	}
}

// Creating sessions is bounded by a token bucket per identity, on the
// leader's clock: the server's default per client address with auth off
// and per user with auth on, or the user's own rate from its quota. A
// refusal is resource_exhausted naming the identity and the quota, and
// creates nothing; the bucket refills as the clock moves.
func TestSessionRateLimit(t *testing.T) {
	clk := clock.NewFake()
	s := startTestServer(t, func(c *Config) { c.Clock, c.SessionRate, c.SessionBurst = clk, 1, 2 })
	ctx := context.Background()
	create := func(c *client.Client) error {
		sess, err := c.NewSession(ctx, client.WithTTL(time.Hour))
		if err == nil {
			t.Cleanup(func() { sess.Close(context.Background()) })
		}
		return err
	}
	refused := func(err error, quota string) {
		t.Helper()
		if !errors.Is(err, fence.ErrLimit) || !strings.Contains(err.Error(), quota) {
			t.Fatalf("got %v, want resource_exhausted (fence.ErrLimit) naming %q", err, quota)
		}
	}
	sessions := func() int {
		var n int
		s.fsm.Read(func(st *fsm.State) { n = st.NumSessions() })
		return n
	}

	// Auth off: per client address, the server's default.
	open := mustClient(t, s, "")
	for range 2 {
		if err := create(open); err != nil {
			t.Fatal(err)
		}
	}
	refused(create(open), "client 127.0.0.1: session rate quota 1/s (burst 2")
	if n := sessions(); n != 2 {
		t.Fatalf("%d sessions after a refusal, want 2", n)
	}
	clk.Advance(time.Second)
	if err := create(open); err != nil {
		t.Fatalf("after a second: %v", err)
	}
	refused(create(open), "session rate quota")

	// Auth on: per user; alice at her own rate, bob at the default.
	clk.Advance(time.Hour)
	rc, alice, bob := rootAliceAndBob(t, s, perm(client.PermLock, client.Write, ""))
	if err := rc.UserSetQuota(ctx, "alice", client.Quota{SessionRate: 0.5, SessionBurst: 1}); err != nil {
		t.Fatal(err)
	}
	mustAuthEnable(t, rc)
	if err := create(alice); err != nil {
		t.Fatal(err)
	}
	refused(create(alice), "user alice: session rate quota 0.5/s (burst 1, quota)")
	for range 2 {
		if err := create(bob); err != nil {
			t.Fatalf("bob has buckets of his own: %v", err)
		}
	}
	refused(create(bob), "user bob: session rate quota 1/s (burst 2")
	clk.Advance(time.Second)
	refused(create(alice), "user alice")
	clk.Advance(time.Second)
	if err := create(alice); err != nil {
		t.Fatalf("after two seconds at 0.5/s: %v", err)
	}
}
