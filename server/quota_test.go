package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// A real server with auth on enforces a user's quotas on the sessions
// created with the user's token and on the locks they take, counted over
// all of them: a call beyond one fails with resource_exhausted naming the
// quota; closing a session frees it; another user is not counted; with
// auth off no quota applies.
func TestQuotaRealServer(t *testing.T) {
	s := startTestServer(t, nil)
	ctx := context.Background()
	root := setupRoot(t, mustClient(t, s, ""))
	rc := mustClient(t, s, root)
	lockAll := perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_WRITE, "")
	alice := mustClient(t, s, addUser(t, rc, "alice", lockAll))
	bob := mustClient(t, s, addUser(t, rc, "bob", lockAll))
	if err := rc.UserSetQuota(ctx, "alice", 2, 1); err != nil {
		t.Fatal(err)
	}
	if err := rc.UserSetQuota(ctx, "nobody", 2, 1); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("quota of a missing user: %v", err)
	}
	if err := rc.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
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
