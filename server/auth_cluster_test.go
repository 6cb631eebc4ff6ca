package server

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
)

// A 3-node group with auth: a follower enforces the leader's rules, both
// on calls it answers itself (the Go client's, which follow the leader)
// and on calls it forwards (curl's), which the leader checks again; a
// token revoked on the leader is refused at the next call through a
// follower that has not heard of the revocation; the auth state survives
// snapshots and a restart of every node.
func TestAuthCluster(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	follower := c.followers(leader)[0]
	ctx := context.Background()
	open := mustClient(t, leader, "")
	rootToken := setupRoot(t, open)
	readerToken := addUser(t, open, "reader", perm(client.PermLock, client.Read, ""))
	appToken := addUser(t, open, "app", perm(client.PermLock, client.Write, ""))
	mustAuthEnable(t, mustClient(t, leader, rootToken))
	waitFor(t, "the follower to apply the enable", follower.AuthEnabled)

	// The Go client, at the follower: checked there.
	for _, s := range []*Server{leader, follower} {
		if _, err := mustClient(t, s, readerToken).NewSession(ctx); !errors.Is(err, fence.ErrPermissionDenied) {
			t.Errorf("reader creates a session at %s: %v", s.cfg.NodeID, err)
		}
		if _, err := mustClient(t, s, "").Status(ctx); !errors.Is(err, fence.ErrAuthFailed) {
			t.Errorf("status without a credential at %s: %v", s.cfg.NodeID, err)
		}
		if _, err := mustClient(t, s, readerToken).Locks(ctx, ""); err != nil {
			t.Errorf("reader lists locks at %s: %v", s.cfg.NodeID, err)
		}
	}
	// curl at the follower: forwarded, checked by the leader.
	createSession := func(s *Server, token string) error {
		h := headerTransport{}
		if token != "" {
			h["Authorization"] = "Bearer " + token
		}
		sessions := fencev1connect.NewSessionServiceClient(&http.Client{Transport: h}, "http://"+s.Addr())
		_, err := sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{}))
		return err
	}
	if err := createSession(follower, readerToken); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("reader's forwarded CreateSession: %v", err)
	}
	if err := createSession(follower, ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("CreateSession without a credential at the follower: %v", err)
	}
	if err := createSession(follower, appToken); err != nil {
		t.Errorf("app's forwarded CreateSession: %v", err)
	}

	// Revoked on the leader while the follower is cut off from it: the
	// follower's state still holds the token, and nothing passes.
	root := mustClient(t, leader, rootToken)
	tokens, err := root.Tokens(ctx, "app")
	if err != nil || len(tokens) != 1 {
		t.Fatalf("app's tokens: %v %v", tokens, err)
	}
	c.isolate(follower.cfg.NodeID, true)
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	if err := createSession(follower, appToken); err == nil {
		t.Error("a token revoked on the leader created a session through a follower cut off from it")
	}
	c.isolate(follower.cfg.NodeID, false)
	if err := createSession(follower, appToken); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a revoked token's forwarded CreateSession: %v", err)
	}
	both := mustClient(t, follower, appToken, client.WithEndpoints(follower.Addr(), leader.Addr()))
	if _, err := both.NewSession(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Errorf("a revoked token's session through the Go client: %v", err)
	}

	// Snapshots, then every node restarted: auth still on, same rules.
	c.restartFromSnapshots()
	leader = c.leader()
	waitFor(t, "every node to apply its log", func() bool {
		for _, s := range c.nodes {
			if !s.AuthEnabled() {
				return false
			}
		}
		return true
	})
	if _, err := mustClient(t, leader, rootToken).Status(ctx); err != nil {
		t.Fatalf("root after the restart: %v", err)
	}
	if _, err := mustClient(t, leader, readerToken).NewSession(ctx); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Fatalf("reader after the restart: %v", err)
	}
	if _, err := mustClient(t, leader, appToken).Status(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("the revoked token after the restart: %v", err)
	}
}
