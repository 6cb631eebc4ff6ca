package server

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

// A 3-node group over TLS with client certificates and auth on
// (docs/design.md, Auth: Followers). A call identified by its certificate alone
// is not forwarded by a follower (the leader would see the follower's
// certificate): the follower checks it under its own state and answers
// it, its own state for stale reads, Unavailable naming the leader for
// writes and linearizable reads. A call with a bearer token is forwarded,
// and the leader checks it again: its refusals are audited on the leader,
// not on the follower.
func TestAuthClusterTLSCertificateCallsStayOnTheFollower(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	var mu sync.Mutex
	logs := map[string]*syncbuf.Buffer{}
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.TLS = peerTLS(t, ca, cfg.NodeID)
		mu.Lock()
		defer mu.Unlock()
		if logs[cfg.NodeID] == nil {
			logs[cfg.NodeID] = &syncbuf.Buffer{}
		}
		cfg.Logger = slog.New(slog.NewTextHandler(logs[cfg.NodeID], nil))
	})
	leader := c.leader()
	follower := c.followers(leader)[0]
	ctx := context.Background()
	waitFor(t, "the follower to know the leader's API address", func() bool { return follower.leaderAPI() == leader.Addr() })

	// Set up on the leader, identified by certificate "root" while auth is off.
	goClient := func(s *Server, cn, token string) *client.Client {
		return mustClient(t, s, token, client.WithTLS(clientTLS(t, ca, cn)))
	}
	setup := goClient(leader, "root", "")
	rootToken := setupRoot(t, setup)
	appToken := addUser(t, setup, "app", perm(client.PermKV, client.Write, ""), perm(client.PermLock, client.Write, ""))
	readerToken := addUser(t, setup, "reader", perm(client.PermKV, client.Read, ""))
	mustAuthEnable(t, goClient(leader, "root", rootToken))
	if _, err := goClient(leader, "root", rootToken).KV().Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the follower to apply the enable and the key", func() bool {
		var ok bool
		follower.fsm.Read(func(st *fsm.State) { _, ok = st.Get("k") })
		return ok && follower.AuthEnabled()
	})

	// Raw Connect clients at the follower, as curl would call it: no
	// Fence-Follow-Leader header, so the follower forwards what it may.
	type rawClient struct {
		kv       fencev1connect.KVServiceClient
		sessions fencev1connect.SessionServiceClient
	}
	raw := func(cn, token string) rawClient {
		tr := &http.Transport{TLSClientConfig: clientTLS(t, ca, cn)}
		t.Cleanup(tr.CloseIdleConnections)
		var rt http.RoundTripper = tr
		if token != "" {
			rt = headerTransport{"Authorization": "Bearer " + token}.via(tr)
		}
		hc := &http.Client{Transport: rt}
		url := "https://" + follower.Addr()
		return rawClient{kv: fencev1connect.NewKVServiceClient(hc, url), sessions: fencev1connect.NewSessionServiceClient(hc, url)}
	}
	put := func(rc rawClient, key string) error {
		_, err := rc.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: key, Value: []byte("x")}))
		return err
	}
	get := func(rc rawClient, stale bool) (*fencev1.GetResponse, error) {
		resp, err := rc.kv.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Key: "k", Stale: stale}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	namesLeader := func(err error) bool {
		return connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "the leader is "+leader.cfg.NodeID)
	}

	// Certificate only: answered by the follower.
	app := raw("app", "")
	if err := put(app, "by-cert"); !namesLeader(err) {
		t.Errorf("a certificate-only put at the follower: %v, want Unavailable naming leader %s", err, leader.cfg.NodeID)
	}
	if _, err := app.sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{})); !namesLeader(err) {
		t.Errorf("a certificate-only CreateSession at the follower: %v", err)
	}
	if resp, err := get(app, true); err != nil || !resp.GetFound() {
		t.Errorf("a certificate-only stale read at the follower: %v, %v", resp, err)
	}
	if _, err := get(app, false); !namesLeader(err) {
		t.Errorf("a certificate-only linearizable read at the follower: %v", err)
	}
	reader := raw("reader", "")
	if err := put(reader, "by-reader"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("a certificate-only put of a reader at the follower: %v, want PermissionDenied from the follower's check", err)
	}
	if _, err := get(raw("stranger", ""), true); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a certificate naming no user at the follower: %v", err)
	}
	var found bool
	leader.fsm.Read(func(st *fsm.State) { _, found = st.Get("by-cert") })
	if found {
		t.Error("a certificate-only put at the follower was applied")
	}
	if fl, ll := logs[follower.cfg.NodeID].String(), logs[leader.cfg.NodeID].String(); !strings.Contains(fl, `user=reader`) || strings.Contains(ll, `user=reader`) {
		t.Errorf("the reader's refusal must be audited on the follower alone:\nfollower: %s\nleader: %s", fl, ll)
	}

	// A bearer token: forwarded (over the follower's own certificate, which
	// identifies nobody there), checked again and applied by the leader.
	if err := put(raw("app", appToken), "by-token"); err != nil {
		t.Fatalf("a bearer put at the follower: %v", err)
	}
	leader.fsm.Read(func(st *fsm.State) { _, found = st.Get("by-token") })
	if !found {
		t.Error("a bearer put at the follower did not reach the leader's state")
	}
	if err := put(raw("app", readerToken), "by-reader-token"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("a reader's bearer put at the follower: %v, want PermissionDenied", err)
	}
	if ll := logs[leader.cfg.NodeID].String(); !strings.Contains(ll, `user=reader`) || !strings.Contains(ll, "KVService/Put") {
		t.Errorf("the leader did not check the forwarded bearer call:\n%s", ll)
	}
}

// via is the transport that sets h's headers on each request and sends
// it over next.
func (h headerTransport) via(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return next.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Quotas in a 3-node group: calls through a follower (forwarded with their
// bearer token) are held to the same quotas as at the leader, and the
// quotas and the usage they count survive a leader change and a restart
// of every node from its snapshot; every node counts the same usage.
func TestQuotaCluster(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	ctx := context.Background()
	open := mustClient(t, leader, "")
	rootToken := setupRoot(t, open)
	appToken := addUser(t, open, "app", perm(client.PermLock, client.Write, ""), perm(client.PermKV, client.Write, ""))
	rateToken := addUser(t, open, "rate", perm(client.PermLock, client.Write, ""))
	root := mustClient(t, leader, rootToken)
	for user, q := range map[string]client.Quota{
		"app":  {MaxSessions: 2, MaxLocks: 1, MaxKVBytes: 16},
		"rate": {SessionRate: 0.001, SessionBurst: 1},
	} {
		if err := root.UserSetQuota(ctx, user, q); err != nil {
			t.Fatal(err)
		}
	}
	mustAuthEnable(t, root)
	refused := func(err error, quota string) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), quota) {
			t.Fatalf("got %v, want resource_exhausted naming %q", err, quota)
		}
	}
	// Through a follower, forwarded to the leader.
	follower := c.followers(leader)[0]
	waitFor(t, "the follower to apply the enable", follower.AuthEnabled)
	waitFor(t, "the follower to know the leader's API address", func() bool { return follower.leaderAPI() == leader.Addr() })
	app := apiWithToken(t, follower, appToken)
	s1 := app.session(time.Hour)
	app.session(time.Hour)
	_, err := app.sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{}))
	refused(err, "user app: sessions quota 2 reached")
	app.mustAcquire(s1, "a")
	_, err = app.acquire(ctx, &fencev1.AcquireRequest{SessionId: s1, Lock: "b"})
	refused(err, "user app: locks quota 1 reached")
	if _, err := app.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k1", Value: []byte("0123456789")})); err != nil {
		t.Fatal(err)
	}
	_, err = app.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k2", Value: []byte("abcd")}))
	refused(err, "user app: kv bytes quota 16 reached")
	// The session rate is the leader's bucket, whichever node the call reached.
	rateAt := func(s *Server) error {
		_, err := apiWithToken(t, s, rateToken).sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{}))
		return err
	}
	if err := rateAt(follower); err != nil {
		t.Fatal(err)
	}
	refused(rateAt(follower), "user rate: session rate quota 0.001/s (burst 1, quota)")
	refused(rateAt(leader), "user rate: session rate quota")

	want := fsm.Usage{Sessions: 2, Locks: 1, KVBytes: 12}
	usageEverywhere := func(what string) {
		t.Helper()
		waitFor(t, what, func() bool {
			for _, s := range c.nodes {
				var u fsm.Usage
				s.fsm.Read(func(st *fsm.State) { u = st.UserUsage("app") })
				if u != want {
					return false
				}
			}
			return true
		})
	}
	check := func(when string) {
		t.Helper()
		usageEverywhere("every node to count app's usage " + when)
		leader := c.leader()
		for _, s := range append(c.followers(leader), leader) {
			if s != leader {
				waitFor(t, s.cfg.NodeID+" to know the leader's API address", func() bool { return s.leaderAPI() == leader.Addr() })
			}
			app := apiWithToken(t, s, appToken)
			_, err := app.sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{}))
			refused(err, "sessions quota 2")
			_, err = app.kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "k2", Value: []byte("abcd")}))
			refused(err, "kv bytes quota 16")
		}
	}
	check("at first")

	// A leader change: the new leader holds the same quotas and counts.
	c.stop(leader.cfg.NodeID)
	check("after a leader change")
	c.start(leader.cfg.NodeID)

	// Snapshots on every node, then every node restarted from its own.
	c.leader()
	usageEverywhere("the restarted node to catch up")
	c.restartFromSnapshots()
	c.leader()
	waitFor(t, "every node to apply its log", func() bool {
		for _, s := range c.nodes {
			if !s.AuthEnabled() {
				return false
			}
		}
		return true
	})
	check("after every node restored its snapshot")
}
