package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
)

// apiWithToken is newAPI for a caller that sends token ("": none).
func apiWithToken(tb testing.TB, s *Server, token string) *api {
	h := headerTransport{}
	if token != "" {
		h["Authorization"] = "Bearer " + token
	}
	hc := &http.Client{Transport: h}
	book := &secretBook{m: map[uint64]string{}}
	opt := connect.WithInterceptors(book)
	url := "http://" + s.Addr()
	return &api{
		tb:       tb,
		sessions: fencev1connect.NewSessionServiceClient(hc, url, opt),
		locks:    fencev1connect.NewLockServiceClient(hc, url, opt),
		kv:       fencev1connect.NewKVServiceClient(hc, url, opt),
		secrets:  book,
	}
}

// A blocked Acquire is checked again whenever the auth state changes, as
// an open watch is: once its caller may no longer take the lock (its
// token revoked, its role's permission revoked, its user removed, or auth
// enabled under a caller without a credential) it ends with the check's
// error and leaves the queue, so that the lock is never handed to it. A
// change that leaves the caller its permission leaves the wait alone.
func TestBlockedAcquireEndsWhenAuthChanges(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, root *client.Client)
		want   connect.Code
	}{
		{"token revoked", func(t *testing.T, root *client.Client) {
			tokens, err := root.Tokens(ctx, "app")
			if err != nil || len(tokens) != 1 {
				t.Fatalf("app's tokens: %v, %v", tokens, err)
			}
			if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
				t.Fatal(err)
			}
		}, connect.CodeUnauthenticated},
		{"permission revoked", func(t *testing.T, root *client.Client) {
			if err := root.RoleRevoke(ctx, "app", perm(client.PermLock, client.Write, "")); err != nil {
				t.Fatal(err)
			}
		}, connect.CodePermissionDenied},
		{"user removed", func(t *testing.T, root *client.Client) {
			if err := root.UserRemove(ctx, "app"); err != nil {
				t.Fatal(err)
			}
		}, connect.CodeUnauthenticated},
		{"auth enabled", nil, connect.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startTestServer(t, nil)
			root, rootToken := mustRootClient(t, s)
			appToken := addUser(t, root, "app", perm(client.PermLock, client.Write, ""))
			holder, waiter := apiWithToken(t, s, rootToken), apiWithToken(t, s, appToken)
			if tc.change == nil {
				waiter = apiWithToken(t, s, "") // no credential: fine while auth is off
			} else if err := root.AuthEnable(ctx); err != nil {
				t.Fatal(err)
			}
			hs, ws := holder.session(time.Hour), waiter.session(time.Hour)
			tokens := map[string]uint64{"l": holder.mustAcquire(hs, "l"), "m": holder.mustAcquire(hs, "m")}
			// A call that waits, and one that polls (answered waiting
			// after an hour), both blocked in the server.
			blocked := []*pending{
				waiter.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: ws, Lock: "l", RequestId: 1}),
				waiter.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: ws, Lock: "m", RequestId: 2, Poll: durationpb.New(time.Hour)}),
			}
			waitFor(t, "the acquires to queue", func() bool {
				return len(holder.lock("l").GetWaiters()) == 1 && len(holder.lock("m").GetWaiters()) == 1
			})
			// An auth change that leaves the caller its permission leaves
			// the waits alone.
			if err := root.RoleAdd(ctx, "other"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			for _, p := range blocked {
				if p.returned() {
					_, err := p.result(t)
					t.Fatalf("an unrelated auth change ended a wait: %v", err)
				}
			}
			if tc.change == nil {
				mustAuthEnable(t, root)
			} else {
				tc.change(t, root)
			}
			for i, p := range blocked {
				if _, err := p.result(t); connect.CodeOf(err) != tc.want {
					t.Fatalf("blocked acquire %d ended with %v, want %v", i, err, tc.want)
				}
			}
			for _, name := range []string{"l", "m"} {
				holder.mustHaveNoWaiters(name, "a refused acquire left its wait for "+name+" queued")
				if err := holder.release(hs, name, tokens[name]); err != nil {
					t.Fatal(err)
				}
				if l := holder.lock(name); len(l.GetHolders()) != 0 {
					t.Fatalf("lock %s went to %v, whose caller was refused", name, l.GetHolders())
				}
			}
			// A new acquire is refused before it starts.
			_, err := waiter.acquire(ctx, &fencev1.AcquireRequest{SessionId: ws, Lock: "l", RequestId: 3})
			if connect.CodeOf(err) != tc.want {
				t.Fatalf("a new acquire after the change: %v, want %v", err, tc.want)
			}
		})
	}
}

// A bearer token's expiry is decided at the edge, on the node's clock
// (a fake one here): before it, calls with the token pass; once the clock
// passes it, the next call fails Unauthenticated naming the expiry, an
// open watch ends, and a blocked Acquire ends and leaves the queue.
func TestBearerTokenExpiresOnTheNodesClock(t *testing.T) {
	s, clk := startOnFakeClock(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	root, rootToken := mustRootClient(t, s)
	if err := root.RoleAdd(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*client.Permission{perm(client.PermLock, client.Write, ""), perm(client.PermKV, client.Write, "")} {
		if err := root.RoleGrant(ctx, "app", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := root.UserAdd(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := root.UserGrantRole(ctx, "app", "app"); err != nil {
		t.Fatal(err)
	}
	appToken, info, err := root.TokenCreate(ctx, "app", time.Minute, "expires")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetExpires().AsTime(); !got.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("the token expires at %v, want a minute after the node's clock %v", got, clk.Now())
	}
	mustAuthEnable(t, root)
	holder, app := apiWithToken(t, s, rootToken), apiWithToken(t, s, appToken)
	hs, as := holder.session(time.Hour), app.session(time.Hour)
	holder.mustAcquire(hs, "l")
	p := app.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: as, Lock: "l", RequestId: 1})
	waitFor(t, "the acquire to queue", func() bool { return len(holder.lock("l").GetWaiters()) == 1 })
	watch := mustOpenWatch(t, ctx, app.kv, "", "the watch did not start")

	clk.Advance(59 * time.Second)
	if _, err := app.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k"})); err != nil {
		t.Fatalf("a second before expiry: %v", err)
	}
	if p.returned() {
		_, err := p.result(t)
		t.Fatalf("the acquire ended before the token expired: %v", err)
	}
	clk.Advance(time.Second)
	if _, err := p.result(t); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the blocked acquire of an expired token ended with %v", err)
	}
	holder.mustHaveNoWaiters("l", "the expired token's acquire left its wait queued")
	for watch.Receive() {
	}
	if connect.CodeOf(watch.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the expired token's watch ended with %v", watch.Err())
	}
	_, err = app.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k"}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated || !contains(err, "expired at") {
		t.Fatalf("a put with the expired token: %v", err)
	}
	if _, err := holder.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k"})); err != nil {
		t.Fatalf("root's token does not expire: %v", err)
	}
}

func contains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

// A polling Acquire keeps its place in the queue when its call ends (the
// client polls again), but not when the call ended because its caller may
// no longer take the lock: on the session stream, the stream's end (its
// credential failed) and the operation's own watch race, and the wait
// must leave the queue whichever comes first. Here the call's context has
// ended, and its token was revoked, before the wait begins, so both
// branches are ready at once; each of the runs must give up the wait.
func TestPollingWaitOfARevokedCallerLeavesTheQueue(t *testing.T) {
	ctx := context.Background()
	s := startTestServer(t, nil)
	root, rootToken, appToken := enableAuthWithUser(t, s, "app", perm(client.PermLock, client.Write, ""))
	holder := apiWithToken(t, s, rootToken)
	holder.mustAcquire(holder.session(time.Hour), "m")
	app := apiWithToken(t, s, appToken)
	var sessions []uint64
	for range 16 {
		sessions = append(sessions, app.session(time.Hour))
	}
	tokens, err := root.Tokens(ctx, "app")
	if err != nil || len(tokens) != 1 {
		t.Fatalf("app's tokens: %v, %v", tokens, err)
	}

	// Each call as the interceptor lets it in, while the token is good.
	header := http.Header{"Authorization": {"Bearer " + appToken}}
	calls := make([]context.Context, len(sessions))
	cancels := make([]context.CancelFunc, len(sessions))
	reqs := make([]*fencev1.AcquireRequest, len(sessions))
	for i, id := range sessions {
		reqs[i] = &fencev1.AcquireRequest{SessionId: id, SessionSecret: app.secrets.secret(id), Lock: "m",
			RequestId: uint64(100 + i), Poll: durationpb.New(time.Minute)}
		callCtx, cancel := context.WithCancel(ctx)
		c, err := s.checkCall(callCtx, fencev1connect.LockServiceAcquireProcedure, "", header, reqs[i])
		if err != nil {
			t.Fatal(err)
		}
		calls[i], cancels[i] = c, cancel
	}
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	for i := range sessions {
		cancels[i]()
		if _, err := s.acquire(calls[i], reqs[i]); err == nil {
			t.Fatalf("acquire %d of a revoked caller whose call ended: granted", i)
		}
	}
	if w := holder.lock("m").GetWaiters(); len(w) != 0 {
		t.Errorf("the revoked caller's waits stayed queued: %d of %d: %v", len(w), len(sessions), w)
	}
}

// A call is charged to the user its check at the start found, even if its
// credential is revoked before the call's command is proposed: checking
// again then found no user, and the key's bytes were charged to nobody.
func TestCallChargedToTheUserItsCheckFound(t *testing.T) {
	ctx := context.Background()
	s := startTestServer(t, nil)
	root, _, appToken := enableAuthWithUser(t, s, "app", perm(client.PermKV, client.Write, ""))
	tokens, err := root.Tokens(ctx, "app")
	if err != nil || len(tokens) != 1 {
		t.Fatalf("app's tokens: %v, %v", tokens, err)
	}
	put := &fencev1.PutRequest{Key: "k", Value: []byte("value")}
	call, err := s.checkCall(ctx, fencev1connect.KVServicePutProcedure, "", http.Header{"Authorization": {"Bearer " + appToken}}, put)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.put(call, put, ""); err != nil {
		t.Fatal(err)
	}
	var used uint64
	s.fsm.Read(func(st *fsm.State) { used = st.UserUsage("app").KVBytes })
	if want := uint64(len("k") + len("value")); used != want {
		t.Errorf("app is charged %d KV bytes, want %d", used, want)
	}
}
