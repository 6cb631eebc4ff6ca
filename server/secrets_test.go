package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// The issue 12 attack: a client that knows nothing lists the locks, takes
// a holder's session id and token from the listing, and tries to act as
// that session. Every call fails with Unauthenticated (reason
// SESSION_SECRET), with no secret and with a guessed one, and nothing
// changes: the lock is held, the session lives, no key is bound.
func TestSessionCallsNeedTheSecret(t *testing.T) {
	s := startTestServer(t, nil)
	owner := newAPI(t, s)
	id := owner.session(time.Minute)
	token := owner.mustAcquire(id, "orders")

	// The attacker's client has no secrets of its own.
	attacker := newAPIAt(t, "http://"+s.Addr(), &secretBook{m: map[uint64]string{}})
	held := attacker.lock("orders").GetHolders()
	if len(held) != 1 || held[0].GetSessionId() != id || held[0].GetToken() != token {
		t.Fatalf("ListLocks shows %v", held)
	}
	ctx := context.Background()
	for _, secret := range []string{"", "guessed", owner.secrets.secret(id)[:20]} {
		calls := map[string]func() error{
			"KeepAlive": func() error {
				_, err := attacker.sessions.KeepAlive(ctx, connect.NewRequest(&fencev1.KeepAliveRequest{SessionId: id, SessionSecret: secret}))
				return err
			},
			"CloseSession": func() error {
				_, err := attacker.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: id, SessionSecret: secret}))
				return err
			},
			"Release": func() error {
				_, err := attacker.locks.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{SessionId: id, SessionSecret: secret, Lock: "orders", Token: token}))
				return err
			},
			"Acquire": func() error {
				_, err := attacker.locks.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{SessionId: id, SessionSecret: secret, Lock: "other", Try: true}))
				return err
			},
			"Acquire to resume": func() error {
				_, err := attacker.locks.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{SessionId: id, SessionSecret: secret, Lock: "orders", RequestId: 1, ResumeAttempt: 1, Poll: durationpb.New(time.Second)}))
				return err
			},
			"CancelAcquire": func() error {
				_, err := attacker.locks.CancelAcquire(ctx, connect.NewRequest(&fencev1.CancelAcquireRequest{SessionId: id, SessionSecret: secret, Lock: "orders", RequestId: 1}))
				return err
			},
			"Put bound to the session": func() error {
				_, err := attacker.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k", Value: []byte("v"), SessionId: id, SessionSecret: secret}))
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if codeOf(err) != connect.CodeUnauthenticated || !errors.Is(rpcerr.FromConnect(err), fence.ErrSessionSecret) {
				t.Errorf("%s with secret %q: %v, want Unauthenticated, ErrSessionSecret", name, secret, err)
			}
		}
	}
	if h := owner.lock("orders").GetHolders(); len(h) != 1 || h[0].GetToken() != token {
		t.Fatalf("after the attack, orders is held by %v", h)
	}
	if l := owner.lock("other"); len(l.GetHolders())+len(l.GetWaiters()) != 0 {
		t.Fatalf("after the attack, other is %v", l)
	}
	if got, err := owner.kv.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Key: "k"})); err != nil || got.Msg.GetFound() {
		t.Fatalf("after the attack, key k: %v, %v", got, err)
	}
	if err := owner.keepAlive(id); err != nil {
		t.Fatalf("the owner's keepalive after the attack: %v", err)
	}
	if err := owner.release(id, "orders", token); err != nil {
		t.Fatalf("the owner's release: %v", err)
	}
	// Closing a session that does not exist still succeeds.
	if _, err := attacker.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: 999})); err != nil {
		t.Fatalf("closing an unknown session: %v", err)
	}
}

// Each session gets a secret of its own, of at least 128 bits, and it is
// never shown again: not in listings, status, watch events, errors or the
// node's log.
func TestSessionSecretIsNotShown(t *testing.T) {
	var logs syncbuf.Buffer
	s := startTestServer(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	a := newAPI(t, s)
	ctx := context.Background()
	w := mustOpenWatch(t, ctx, a.kv, "", "the watch did not start")
	defer w.Close()
	id1, id2 := a.session(time.Minute), a.session(time.Minute)
	secret := a.secrets.secret(id1)
	if other := a.secrets.secret(id2); len(secret) < 22 || secret == other {
		t.Fatalf("secrets %q and %q: want distinct, of 128 bits or more", secret, other)
	}
	a.mustAcquire(id1, "orders")
	if _, err := a.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "bound", Value: []byte("v"), SessionId: id1})); err != nil {
		t.Fatal(err)
	}
	if !w.Receive() {
		t.Fatal(w.Err())
	}
	_, wrong := a.sessions.KeepAlive(ctx, connect.NewRequest(&fencev1.KeepAliveRequest{SessionId: id1, SessionSecret: secret + "x"}))
	status, err := fencev1connect.NewClusterServiceClient(http.DefaultClient, "http://"+s.Addr()).Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	list, err := a.locks.ListLocks(ctx, connect.NewRequest(&fencev1.ListLocksRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // everything logged
		t.Fatal(err)
	}
	shown := map[string]string{"the watch event": protojson.Format(w.Msg()), "Status": protojson.Format(status.Msg),
		"ListLocks": protojson.Format(list.Msg), "the log": logs.String(), "the error": wrong.Error()}
	for where, text := range shown {
		if strings.Contains(text, secret) {
			t.Errorf("%s shows the session secret:\n%s", where, text)
		}
	}
	if h := list.Msg.GetLocks()[0].GetHolders()[0]; h.GetLegacySession() {
		t.Errorf("a new session is listed as legacy: %v", h)
	}
}

// A data dir written before sessions had secrets (legacyFixture) opens
// with its sessions, locks and keys; those sessions are listed as legacy
// and are acted on by their id alone until they end, in the snapshot's
// state and in the log's, and after another restart. New sessions need
// their secrets.
func TestLegacyDataDirKeepsWorking(t *testing.T) {
	dir := t.TempDir()
	untar(t, legacyFixture, dir)
	edit := func(c *Config) { c.DataDir = dir }
	s, a := startWithAPI(t, edit)
	ctx := context.Background()
	for _, want := range []struct {
		lock    string
		session uint64
		owner   string
	}{{"orders", 1, "snap-holder"}, {"jobs", 2, "log-holder"}} {
		h := a.lock(want.lock).GetHolders()
		if len(h) != 1 || h[0].GetSessionId() != want.session || h[0].GetOwner() != want.owner || !h[0].GetLegacySession() {
			t.Fatalf("lock %s after the upgrade: %v, want held by legacy session %d", want.lock, h, want.session)
		}
	}
	if got, err := a.kv.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Key: "bound"})); err != nil || got.Msg.GetKv().GetSessionId() != 1 {
		t.Fatalf("key bound after the upgrade: %v, %v", got, err)
	}
	for _, id := range []uint64{1, 2} {
		if err := a.keepAlive(id); err != nil {
			t.Fatalf("keepalive of legacy session %d by id alone: %v", id, err)
		}
	}
	fresh := a.session(time.Minute)
	if _, err := a.sessions.KeepAlive(ctx, connect.NewRequest(&fencev1.KeepAliveRequest{SessionId: fresh, SessionSecret: "x"})); !errors.Is(rpcerr.FromConnect(err), fence.ErrSessionSecret) {
		t.Fatalf("a new session's keepalive without its secret: %v", err)
	}
	// A snapshot now records the legacy sessions as they are.
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startTestServer(t, edit)
	a2 := newAPIAt(t, "http://"+s2.Addr(), a.secrets)
	if err := a2.keepAlive(fresh); err != nil {
		t.Fatalf("the new session's keepalive with its secret after a restart: %v", err)
	}
	token := a2.lock("jobs").GetHolders()[0].GetToken()
	if err := a2.release(2, "jobs", token); err != nil {
		t.Fatalf("release by legacy session 2, by id alone, after a restart: %v", err)
	}
	if _, err := a2.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: 1})); err != nil {
		t.Fatalf("close of legacy session 1 by id alone: %v", err)
	}
	if l := a2.lock("orders"); len(l.GetHolders()) != 0 {
		t.Fatalf("orders after its legacy session closed: %v", l)
	}
}
