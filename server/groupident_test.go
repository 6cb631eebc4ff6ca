package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
)

// grantAndStore takes the lock "orders" a few times and stores a key,
// through the group's leader, and returns the last token granted.
func grantAndStore(t *testing.T, c *testCluster) uint64 {
	t.Helper()
	ctx := context.Background()
	cl := c.client(c.endpoints()...)
	s := mustNewSession(t, cl)
	defer s.Close(ctx)
	m := client.NewMutex(s, "orders")
	var last uint64
	for range 3 {
		g := mustLock(t, m)
		last = g.Token()
		mustUnlock(t, m)
	}
	if _, err := cl.KV().Put(ctx, "orders/17", []byte("paid")); err != nil {
		t.Fatal(err)
	}
	return last
}

// wipe gives node id an empty data dir for its next start.
func (c *testCluster) wipe(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := c.cfgs[id]
	cfg.DataDir = c.t.TempDir()
	c.cfgs[id] = cfg
}

// wipeWithOneDown stops a follower of leader (down), and wipes another
// (victim) and starts it again.
func (c *testCluster) wipeWithOneDown(leader *Server) (down, victim string, wiped *Server) {
	fs := c.followers(leader)
	down, victim = fs[0].cfg.NodeID, fs[1].cfg.NodeID
	c.stop(down)
	c.stop(victim)
	c.wipe(victim)
	return down, victim, c.start(victim)
}

// wipeFollower stops a follower of leader, empties its data dir and
// starts it again with its flags, as a pod restarted on an empty volume.
func (c *testCluster) wipeFollower(leader *Server) (string, *Server) {
	id := c.followers(leader)[0].cfg.NodeID
	c.stop(id)
	c.wipe(id)
	return id, c.start(id)
}

// TestWipedMajorityDoesNotFoundASecondGroup is the wipe of two of three
// data dirs: the two nodes, restarted first with the group's --peers, used
// to bootstrap a new group that handed out token 1 again and dropped the
// committed key, and the intact node followed it. Now they wait for every
// peer, see that the intact one holds the group's data, and found nothing;
// nobody leads (two of three lost what they acknowledged), and the intact
// node keeps its state.
func TestWipedMajorityDoesNotFoundASecondGroup(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	group := leader.clusterID()
	last := grantAndStore(t, c)
	end := leader.node.raft.LastIndex()
	for _, id := range c.ids {
		// From its snapshot, n1 has its state before anyone leads.
		waitFor(t, id+" to apply the group's entries", func() bool { return c.nodes[id].node.raft.AppliedIndex() >= end })
		if err := c.nodes[id].node.raft.Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
		c.stop(id)
	}
	c.wipe("n2")
	c.wipe("n3")
	n2, n3 := c.start("n2"), c.start("n3")
	waitFor(t, "n2 and n3 to wait for n1", func() bool {
		return strings.Contains(noteOf(n2), "no answer yet from n1") && strings.Contains(noteOf(n3), "no answer yet from n1")
	})
	n1 := c.start("n1")
	waitFor(t, "n2 and n3 to see n1's group", func() bool {
		return strings.Contains(noteOf(n2), "answers with group "+group) && strings.Contains(noteOf(n3), "answers with group "+group)
	})
	// Ten election timeouts: time enough for a group to be founded, and
	// for n1 to be elected with a vote it should not have.
	deadline := time.Now().Add(10 * c.cfgs["n1"].ElectionTimeout)
	for time.Now().Before(deadline) {
		for _, s := range []*Server{n1, n2, n3} {
			if s.node.isLeader() {
				t.Fatalf("%s leads, with two of three data dirs lost", s.cfg.NodeID)
			}
		}
		if n2.node.hasData() || n3.node.hasData() {
			t.Fatal("a wiped node took data from somewhere")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := lastToken(n1); got < last {
		t.Fatalf("n1's last token went back from %d to %d", last, got)
	}
	var kept bool
	n1.fsm.Read(func(st *fsm.State) { _, kept = st.Get("orders/17") })
	if !kept || n1.clusterID() != group {
		t.Fatalf("n1 lost its state: key kept %v, group %q (want %q)", kept, n1.clusterID(), group)
	}
	for _, s := range []*Server{n2, n3} {
		if p := strings.Join(s.problems(), "; "); !strings.Contains(p, "remove it from the group") && !strings.Contains(p, "Remove it from the group") {
			t.Errorf("%s's status does not say what to do: %q", s.cfg.NodeID, p)
		}
	}
}

// TestWipedFollowerRejoinsWhenAddedAgain wipes one follower of a running
// group whose nodes do not add members again by themselves: it neither
// founds a group nor votes as the member it was, and the group goes on
// without it; removed and added again by hand, it catches up with the
// group's state and id, and tokens go on from where they were.
func TestWipedFollowerRejoinsWhenAddedAgain(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) { cfg.AutoRejoin = false })
	leader := c.leader()
	group := leader.clusterID()
	last := grantAndStore(t, c)
	victim, wiped := c.wipeFollower(leader)
	waitFor(t, "the wiped node to see it holds no data of the group", func() bool {
		return strings.Contains(noteOf(wiped), "answers with group "+group)
	})
	if wiped.node.hasData() {
		t.Fatal("the wiped node bootstrapped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := c.client(c.endpoints(victim)...)
	// Add alone does nothing for a voter, and says so.
	if err := cl.AddMember(ctx, victim, c.cfgs[victim].RaftListen, true); !errors.Is(err, fence.ErrMembership) || !strings.Contains(err.Error(), "holds no data") {
		t.Fatalf("adding the wiped voter without removing it: %v, want a refusal saying it holds no data", err)
	}
	if err := cl.RemoveMember(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if err := cl.AddMember(ctx, victim, c.cfgs[victim].RaftListen, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-added node to catch up", func() bool {
		return wiped.clusterID() == group && lastToken(wiped) >= last && noteOf(wiped) == ""
	})
	if got := wiped.ident.groupID(); got != group {
		t.Fatalf("the re-added node's data dir belongs to %q, want %q", got, group)
	}
	after := grantAndStore(t, c)
	if after <= last {
		t.Fatalf("token %d after the rejoin, not above %d", after, last)
	}
}

// TestWipedFollowerRejoinsByItself wipes one follower of a running group:
// restarted with the group's --peers (as a pod on an empty volume), it asks
// the leader to add it again, catches up, and votes again.
func TestWipedFollowerRejoinsByItself(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	group := leader.clusterID()
	last := grantAndStore(t, c)
	victim, wiped := c.wipeFollower(leader)
	waitFor(t, "the wiped node to be added again and catch up", func() bool {
		srv, known := leader.member(raft.ServerID(victim))
		return known && srv.Suffrage == raft.Voter && wiped.clusterID() == group && lastToken(wiped) >= last && noteOf(wiped) == ""
	})
	// The old voter is gone and the new one counts: with the third node
	// stopped, the group still commits.
	for _, f := range c.followers(leader) {
		if f.cfg.NodeID != victim {
			c.stop(f.cfg.NodeID)
		}
	}
	if after := grantAndStore(t, c); after <= last {
		t.Fatalf("token %d after the rejoin, not above %d", after, last)
	}
}

// TestForeignNodeIsNotAdded adds, to group Y, a node id at the raft
// address of group X's only node: the add used to make it a voter (its log
// was longer than Y's) and X's node followed Y's leader. Now the add is
// refused, naming both groups; and even a configuration change made behind
// the check's back (raft's own AddVoter) reaches nothing, for X's node
// refuses Y's raft connections, and stays X's leader with X's state.
func TestForeignNodeIsNotAdded(t *testing.T) {
	x, y := newClusterOf(t, []string{"n2"}, nil), startCluster(t, 1, nil)
	x.start("n2")
	xl, yl := x.leader(), y.leader()
	xToken := grantAndStore(t, x)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := y.client(y.endpoints()...).AddMember(ctx, "n2", xl.RaftAddr(), true)
	if !errors.Is(err, fence.ErrMembership) || !strings.Contains(err.Error(), xl.clusterID()) || !strings.Contains(err.Error(), yl.clusterID()) {
		t.Fatalf("adding group X's node to group Y: %v; want ErrMembership naming both groups", err)
	}
	if _, known := yl.member("n2"); known {
		t.Fatal("the refused node is in Y's configuration")
	}
	// raft's own AddVoter, without the check: Y's leader then dials X's
	// node as its n2, and is refused (Y, unable to reach its new quorum,
	// loses its leader: the check is what keeps Y whole).
	yl.node.raft.AddVoter("n2", raft.ServerAddress(xl.RaftAddr()), 0, time.Second)
	waitFor(t, "Y's leader to step down for want of n2", func() bool { return !yl.node.isLeader() })
	for range 20 {
		if !xl.node.isLeader() || xl.clusterID() == yl.clusterID() || lastToken(xl) < xToken {
			t.Fatalf("X's node followed Y: leader %v, group %q, last token %d", xl.node.isLeader(), xl.clusterID(), lastToken(xl))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRaftConnectionsOfAnotherGroupAreRefused checks the introduction
// itself: a node refuses a dialer of another group, a dialer that takes it
// for another node, and, holding no data, one that counts it as a voter;
// it takes a non-voter's, joining that group.
func TestRaftConnectionsOfAnotherGroupAreRefused(t *testing.T) {
	c := startCluster(t, 1, nil)
	l := c.leader()
	group := l.clusterID()
	cases := []struct {
		intro raftIntro
		want  string
	}{
		{raftIntro{From: "y1", Group: "OTHER", To: "n1", Role: roleVoter}, "belongs to group " + group},
		{raftIntro{From: "n9", Group: group, To: "n2", Role: roleVoter}, `this node is "n1", not "n2"`},
	}
	for _, tc := range cases {
		if err := l.node.admit(tc.intro); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("admit(%+v) = %v, want an error with %q", tc.intro, err, tc.want)
		}
	}
	if err := l.node.admit(raftIntro{From: "n9", Group: group, To: "n1", Role: roleVoter}); err != nil {
		t.Errorf("a member of the same group was refused: %v", err)
	}

	fresh := newCluster(t, 1, nil)
	cfg := fresh.cfgs["n1"]
	cfg.Peers, cfg.Join = nil, true
	fresh.cfgs["n1"] = cfg
	f := fresh.start("n1")
	if err := f.node.admit(raftIntro{From: "x", Group: group, To: "n1", Role: roleVoter}); err == nil || !strings.Contains(err.Error(), "holds no data") {
		t.Errorf("a node with no data took a voter's part: %v", err)
	}
	if err := f.node.admitUnintroduced(); err == nil {
		t.Error("a node with no data took a raft connection that did not introduce itself")
	}
	if err := f.node.admit(raftIntro{From: "x", Group: group, To: "n1", Role: roleNonvoter}); err != nil {
		t.Errorf("a node with no data refused to join as a non-voter: %v", err)
	}
	if got := f.ident.groupID(); got != group {
		t.Errorf("after joining, the data dir belongs to %q, want %q", got, group)
	}
	if err := f.node.admit(raftIntro{From: "y", Group: "OTHER", To: "n1", Role: roleNonvoter}); err == nil {
		t.Error("a node that joined one group took another's")
	}
}

// noteOf is why s has not bootstrapped, "" when nothing holds it back.
func noteOf(s *Server) string {
	if p := s.bootstrapNote.Load(); p != nil {
		return *p
	}
	return ""
}

// TestRejoinResumesAfterItsLeaderIsGone: a wiped member whose leader took
// the first step of adding it again (it was made a non-voter, caught up)
// and then went away used to stay a non-voter for good: it held data, so it
// asked no more, and no later leader knew. It now keeps asking, across its
// own restarts (its identity records it), until it is a voter, and any
// leader takes the request up where it stands.
func TestRejoinResumesAfterItsLeaderIsGone(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	victim := c.followers(leader)[0]
	id := victim.cfg.NodeID
	waitFor(t, id+" to catch up", func() bool { return victim.node.raft.AppliedIndex() >= leader.node.raft.LastIndex() })
	// The state a leader lost halfway leaves: the member a non-voter with
	// the group's data, and the node's record that it asked.
	if err := leader.node.raft.DemoteVoter(raft.ServerID(id), 0, time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	c.stop(id)
	markRejoining(t, c, id)
	restarted := c.start(id)
	waitFor(t, id+" to be a voter again", func() bool {
		srv, ok := c.leader().member(raft.ServerID(id))
		return ok && srv.Suffrage == raft.Voter && !restarted.ident.rejoining.Load()
	})
}

// TestWipedMemberRejoinsWhileAPeerIsDown: with one peer down, a wiped
// member of five used to wait for it before asking to be added again,
// although the others had a quorum without it. And the peer, down since
// just after the group was founded, used to hold the group at protocol 1
// for good (a member that does not answer may run an older version), so
// that nothing newer, rejoins included, was ever allowed: the founders
// now record the protocol each of them spoke when they founded it.
func TestWipedMemberRejoinsWhileAPeerIsDown(t *testing.T) {
	c := startCluster(t, 5, nil)
	leader := c.leader()
	_, victim, wiped := c.wipeWithOneDown(leader)
	waitFor(t, victim+" to be a voter again with one peer down", func() bool {
		srv, ok := c.leader().member(raft.ServerID(victim))
		return ok && srv.Suffrage == raft.Voter && wiped.node.hasData() && !wiped.ident.rejoining.Load()
	})
}
