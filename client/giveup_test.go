package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/server"
)

// heldAnswers is a transport that delivers every request and its answer
// to the node, but keeps back from the client the answers of the
// procedure whose path ends in path, while hold is set, until the call's
// context ends: a put that the node applied and whose answer never came
// back in time.
type heldAnswers struct {
	next http.RoundTripper
	path string
	hold atomic.Bool
}

func (t *heldAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || !t.hold.Load() || !strings.HasSuffix(req.URL.Path, t.path) {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// answersHeld is the setup of a case whose call the node applies but
// does not answer in time: it starts a node, and returns a client of it
// whose answers to the unary calls of path are kept back (by heldAnswers)
// once hold is called, and a plain client of the node.
func answersHeld(path string) func(t *testing.T) (held, plain *Client, hold func()) {
	return func(t *testing.T) (*Client, *Client, func()) {
		t.Helper()
		srv := startServer(t, nil)
		tr := &heldAnswers{next: &http.Transport{}, path: path}
		c := mustNew(t, WithEndpoints(srv.Addr()), WithoutStream(), WithHTTPClient(&http.Client{Transport: inMemoryBodies{tr}}))
		return c, mustClient(t, srv, nil), func() { tr.hold.Store(true) }
	}
}

// failedWith reports whether a call that gave up failed with want, where
// a deadline that passed may also show as the service being unavailable.
func failedWith(err, want error) bool {
	return errors.Is(err, want) || want == context.DeadlineExceeded && errors.Is(err, fence.ErrUnavailable)
}

// withAuth turns auth on at srv with a root user, after adding user with a
// role of its own holding perms and quota, and returns a client of root's
// and one of user's.
func withAuth(t *testing.T, srv *server.Server, user string, quota Quota, perms ...*Permission) (root, as *Client) {
	t.Helper()
	ctx := context.Background()
	open := mustClient(t, srv, nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(open.UserAdd(ctx, "root"))
	must(open.UserGrantRole(ctx, "root", "root"))
	rootToken, _, err := open.TokenCreate(ctx, "root", 0, "")
	must(err)
	must(open.UserAdd(ctx, user))
	must(open.RoleAdd(ctx, user))
	for _, p := range perms {
		must(open.RoleGrant(ctx, user, p))
	}
	must(open.UserGrantRole(ctx, user, user))
	must(open.UserSetQuota(ctx, user, quota))
	userToken, _, err := open.TokenCreate(ctx, user, 0, "")
	must(err)
	client := func(token string) *Client { return mustNew(t, WithEndpoints(srv.Addr()), WithBearerToken(token)) }
	root, as = client(rootToken), client(userToken)
	must(root.AuthEnable(ctx))
	return root, as
}

// A Campaign whose Proclaim fails gives the election up: the lock and any
// record it may have written are gone, so the next campaigner is elected
// at once, and the session lives on (it was told nothing it did not
// undo). Each failure point is met on a real node: a value over the
// node's limit, no kv permission, the user's kv quota, and a deadline
// that passes while the put, applied, is not answered.
func TestCampaignGivesUpWhenProclaimFails(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T) (campaigner, rival *Client, value string, hold func())
		want  error
	}{
		{"value over the node's limit", func(t *testing.T) (*Client, *Client, string, func()) {
			srv := startServer(t, func(c *server.Config) { c.MaxValueBytes = 64 })
			c := mustClient(t, srv, nil)
			return c, c, strings.Repeat("v", 65), nil
		}, fence.ErrInvalidArgument},
		{"no kv permission", func(t *testing.T) (*Client, *Client, string, func()) {
			srv := startServer(t, nil)
			root, c := withAuth(t, srv, "locker", Quota{}, &Permission{Kind: PermLock, Access: Write, Prefix: "election/"})
			return c, root, "node-a", nil
		}, fence.ErrPermissionDenied},
		{"kv bytes quota", func(t *testing.T) (*Client, *Client, string, func()) {
			srv := startServer(t, nil)
			root, c := withAuth(t, srv, "small", Quota{MaxKVBytes: 16},
				&Permission{Kind: PermLock, Access: Write, Prefix: "election/"},
				&Permission{Kind: PermKV, Access: Write, Prefix: "election/"})
			return c, root, "a value past 16 bytes", nil
		}, fence.ErrLimit},
		{"deadline during an applied put", func(t *testing.T) (*Client, *Client, string, func()) {
			c, rival, hold := answersHeld("/Put")(t)
			return c, rival, "node-a", hold
		}, context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, rival, value, hold := tc.setup(t)
			s := mustSession(t, c, 10*time.Second)
			if hold != nil {
				hold()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := NewElection(s, "x").Campaign(ctx, value)
			if !failedWith(err, tc.want) {
				t.Fatalf("Campaign: %v, want %v", err, tc.want)
			}
			if st, err := rival.Leader(context.Background(), "x"); err != nil || st.Elected {
				t.Fatalf("after the failed campaign, Leader = %+v, %v; want nobody", st, err)
			}
			if kv, err := rival.KV().Get(context.Background(), "election/x"); err != nil || kv != nil {
				t.Fatalf("the failed campaign left the record %v (%v)", kv, err)
			}
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer rcancel()
			if _, err := NewElection(mustSession(t, rival, 10*time.Second), "x").Campaign(rctx, "node-b"); err != nil {
				t.Fatalf("the next campaigner, after a campaign whose Proclaim failed: %v", err)
			}
			if err := s.Err(); err != nil {
				t.Errorf("the session of the failed campaign ended: %v", err)
			}
		})
	}
}

// A queue hand-out that fails after it took the item's lock gives the
// item back: the lock, and the claim if the failed put may have made it,
// so that the next consumer can take the item at once, and the
// consumer's session lives on. Each failure point is met on a real node: the item's
// read not answered in time, and the claim's put refused (a key over the
// node's limit, no kv permission, the user's kv quota) or applied and not
// answered in time. (A claim left behind keeps every consumer off the item
// for as long as the session lives, a lock left held as well.)
func TestDequeueGivesTheItemBackWhenItsClaimFails(t *testing.T) {
	queueRead := &Permission{Kind: PermKV, Access: Read, Prefix: "queue/q/"}
	queueLocks := &Permission{Kind: PermLock, Access: Write, Prefix: "queue/q/"}
	cases := []struct {
		name  string
		setup func(t *testing.T) (consumer, rival *Client, hold func())
		want  error
	}{
		{"item read not answered", answersHeld("/Get"), context.DeadlineExceeded},
		{"claim key over the node's limit", func(t *testing.T) (*Client, *Client, func()) {
			// "queue/q/items/" and 20 digits is 34 bytes; its claim's key, 35.
			srv := startServer(t, func(c *server.Config) { c.MaxKeyBytes = 34 })
			c := mustClient(t, srv, nil)
			return c, c, nil
		}, fence.ErrInvalidArgument},
		{"no kv permission on claims", func(t *testing.T) (*Client, *Client, func()) {
			srv := startServer(t, nil)
			root, c := withAuth(t, srv, "reader", Quota{}, queueLocks, queueRead)
			return c, root, nil
		}, fence.ErrPermissionDenied},
		{"kv bytes quota", func(t *testing.T) (*Client, *Client, func()) {
			srv := startServer(t, nil)
			root, c := withAuth(t, srv, "small", Quota{MaxKVBytes: 16}, queueLocks, &Permission{Kind: PermKV, Access: Write, Prefix: "queue/q/"})
			return c, root, nil
		}, fence.ErrLimit},
		{"claim applied, not answered", answersHeld("/Put"), context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, rival, hold := tc.setup(t)
			if _, err := NewQueue(rival, "q").Enqueue(context.Background(), []byte("job")); err != nil {
				t.Fatal(err)
			}
			s := mustSession(t, c, 10*time.Second)
			if hold != nil {
				hold()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if d, err := NewQueue(c, "q").Dequeue(ctx, s); !failedWith(err, tc.want) {
				t.Fatalf("Dequeue: %v, %v; want %v", d, err, tc.want)
			}
			q := NewQueue(rival, "q")
			claims, err := rival.KV().List(context.Background(), q.prefix+"claims/")
			if err != nil || len(claims.KVs) != 0 {
				t.Fatalf("the failed hand-out left claims %v (%v)", claims, err)
			}
			if _, err := NewMutex(mustSession(t, rival, 10*time.Second), q.lockName(1)).TryLock(context.Background()); err != nil {
				t.Fatalf("the item's lock, after a hand-out that failed: %v", err)
			}
			if err := s.Err(); err != nil {
				t.Errorf("the session of the failed hand-out ended: %v", err)
			}
		})
	}
}

// A double barrier's Enter that fails takes the party's arrival back, so
// that it is neither counted towards count (the others would go in
// without it) nor waited for by the others' Leave, and the party's
// session lives on. Each failure point is met on a real node: the wait
// for the others ends, the open mark is refused (no kv permission), and
// the arrival's put is applied but not answered in time.
func TestDoubleBarrierEnterWithdrawsWhenItFails(t *testing.T) {
	cases := []struct {
		name  string
		count int
		setup func(t *testing.T) (party, other *Client, hold func())
		want  error
	}{
		{"others awaited past the deadline", 2, func(t *testing.T) (*Client, *Client, func()) {
			srv := startServer(t, nil)
			c := mustClient(t, srv, nil)
			return c, c, nil
		}, context.DeadlineExceeded},
		{"open mark refused", 1, func(t *testing.T) (*Client, *Client, func()) {
			srv := startServer(t, nil)
			root, c := withAuth(t, srv, "party", Quota{},
				&Permission{Kind: PermKV, Access: Read, Prefix: "dbarrier/x/"},
				&Permission{Kind: PermKV, Access: Write, Prefix: "dbarrier/x/members/"})
			return c, root, nil
		}, fence.ErrPermissionDenied},
		{"arrival applied, not answered", 1, answersHeld("/Put"), context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, other, hold := tc.setup(t)
			s := mustSession(t, c, 10*time.Second)
			if hold != nil {
				hold()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := NewDoubleBarrier(s, "x", tc.count).Enter(ctx)
			if !failedWith(err, tc.want) {
				t.Fatalf("Enter: %v, want %v", err, tc.want)
			}
			members, err := other.KV().List(context.Background(), "dbarrier/x/members/")
			if err != nil || len(members.KVs) != 0 {
				t.Fatalf("the failed Enter left arrivals %v (%v)", members, err)
			}
			if err := s.Err(); err != nil {
				t.Errorf("the session of the failed Enter ended: %v", err)
			}
		})
	}
}
