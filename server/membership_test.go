package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
)

// deadAddress returns a loopback address where nothing listens.
func deadAddress(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// mustServe checks that the group still commits: a new session takes a lock.
func mustServe(t *testing.T, cl *client.Client, lock string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatalf("the group stopped serving: %v", err)
	}
	defer s.Close(ctx)
	if _, err := client.NewMutex(s, lock).Lock(ctx); err != nil {
		t.Fatalf("the group stopped serving: %v", err)
	}
}

// The outage of issue 12: RemoveMember n3, then AddMember of two nodes at
// addresses where nothing listens, left a 3-node group with no leader for
// good. The adds are refused, saying why, and the group keeps its leader.
func TestMembershipChangesToDeadNodesAreRefused(t *testing.T) {
	c := startCluster(t, 3, nil)
	cl := c.client()
	ctx := context.Background()
	leader := c.leader()
	victim := c.followers(leader)[1].cfg.NodeID
	if err := cl.RemoveMember(ctx, victim); err != nil {
		t.Fatalf("removing %s: %v", victim, err)
	}
	c.stop(victim)
	for _, id := range []string{"evil", "evil2"} {
		err := cl.AddMember(ctx, id, deadAddress(t), true)
		if !errors.Is(err, fence.ErrMembership) || !strings.Contains(err.Error(), "no fence node answers") {
			t.Fatalf("adding %s at a dead address: %v, want ErrMembership saying nothing answers", id, err)
		}
	}
	if n := len(leader.members()); n != 2 {
		t.Fatalf("members after the refused adds: %v", leader.members())
	}
	mustServe(t, cl, "after-refused-adds")
	if c.leader() != leader {
		t.Fatal("the leader changed")
	}
}

// A single node keeps leading when asked to add a member at a dead
// address, voter or not.
func TestSingleNodeAddMemberAtDeadAddressIsRefused(t *testing.T) {
	s := startTestServer(t, nil)
	cl, err := client.New(client.WithEndpoints(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, voter := range []bool{true, false} {
		if err := cl.AddMember(context.Background(), "n2", deadAddress(t), voter); !errors.Is(err, fence.ErrMembership) {
			t.Fatalf("AddMember (voter %v) at a dead address: %v, want ErrMembership", voter, err)
		}
	}
	if len(s.members()) != 1 || !s.node.isLeader() {
		t.Fatalf("after the refused adds: members %v, leader %v", s.members(), s.node.isLeader())
	}
	mustServe(t, cl, "single")
}

// Removing a voter is refused when the voters that would remain do not
// have a quorum of reachable ones: with n3 down, removing n2 would leave
// n1 and n3, of which one answers.
func TestRemoveMemberKeepsAReachableQuorum(t *testing.T) {
	c := startCluster(t, 3, nil)
	cl := c.client()
	leader := c.leader()
	fs := c.followers(leader)
	down, other := fs[0].cfg.NodeID, fs[1].cfg.NodeID
	c.stop(down)
	err := cl.RemoveMember(context.Background(), other)
	if !errors.Is(err, fence.ErrMembership) || !strings.Contains(err.Error(), "quorum") || !strings.Contains(err.Error(), down) {
		t.Fatalf("removing %s while %s is down: %v, want ErrMembership naming %s and the quorum", other, down, err, down)
	}
	if len(leader.members()) != 3 {
		t.Fatalf("members after the refused removal: %v", leader.members())
	}
	mustServe(t, cl, "after-refused-removal")
	// Removing the node that is down leaves two reachable voters of two.
	if err := cl.RemoveMember(context.Background(), down); err != nil {
		t.Fatalf("removing %s, which is down: %v", down, err)
	}
	mustServe(t, cl, "after-removal")
}

// A new member joins as a non-voter, is made a voter once caught up, and
// registers its API address with the leader over the raft port. A node
// that answers at the address under another id is refused, and
// RegisterNode is no longer on the client API.
func TestAddMemberJoinsAsNonVoterThenVotes(t *testing.T) {
	c := startCluster(t, 3, nil)
	cl := c.client()
	ctx := context.Background()
	mustServe(t, cl, "before")
	n4, cfg4 := c.startJoiner("n4")
	if err := cl.AddMember(ctx, "n5", cfg4.RaftListen, true); !errors.Is(err, fence.ErrMembership) || !strings.Contains(err.Error(), `"n4"`) {
		t.Fatalf("adding n5 at n4's address: %v, want ErrMembership naming n4", err)
	}
	if err := cl.AddMember(ctx, "n4", cfg4.RaftListen, true); err != nil {
		t.Fatalf("adding n4: %v", err)
	}
	leader := c.leader()
	if m, ok := leader.member("n4"); !ok || m.Suffrage != raft.Voter {
		t.Fatalf("n4 after AddMember: %+v", m)
	}
	if n4.node.raft.LastIndex() < leader.node.raft.LastIndex()-1 {
		t.Fatalf("n4 became a voter at log index %d, the leader is at %d", n4.node.raft.LastIndex(), leader.node.raft.LastIndex())
	}
	waitFor(t, "the leader to learn n4's API address", func() bool {
		st, err := cl.Status(ctx)
		if err != nil {
			return false
		}
		for _, m := range st.GetMembers() {
			if m.GetId() == "n4" {
				return m.GetApiAddress() == n4.Addr()
			}
		}
		return false
	})
	resp, err := http.Post("http://"+leader.Addr()+"/fence.v1.ClusterService/RegisterNode", "application/json", strings.NewReader(`{"id":"n4","apiAddress":"127.0.0.1:1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("RegisterNode on the client API: HTTP %d, want 404", resp.StatusCode)
	}
	mustServe(t, cl, "after")
}
