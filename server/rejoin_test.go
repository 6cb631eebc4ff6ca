package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// halfRejoined leaves member id of c as a leader lost halfway through
// adding it again leaves it: a non-voter in the group's configuration,
// while the node holds only the log from before that change (whose
// configuration names it a voter) and its identity records that it asked.
// The leader that demoted it is stopped and started again, so that no
// leader has a promotion of it under way. The node is left stopped.
func halfRejoined(t *testing.T, c *testCluster, id string) {
	t.Helper()
	leader := c.leader()
	victim := c.nodes[id]
	waitFor(t, id+" to catch up", func() bool { return victim.node.raft.AppliedIndex() >= leader.node.raft.LastIndex() })
	c.stop(id)
	if err := leader.node.raft.DemoteVoter(raft.ServerID(id), 0, time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	lid := leader.cfg.NodeID
	c.stop(lid)
	c.start(lid)
	markRejoining(t, c, id)
}

// markRejoining records in the identity of c's stopped node id that it
// asked to be added again, as a node does before it asks.
func markRejoining(t *testing.T, c *testCluster, id string) {
	t.Helper()
	ident, err := openIdentity(c.cfgs[id].DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := ident.setRejoining(true); err != nil {
		t.Fatal(err)
	}
}

// atRejoinStep runs do, once, as leader reaches step of adding a member
// again, on the leader's own goroutine (do may hold it there), and returns
// a channel closed as do begins.
func atRejoinStep(leader *Server, step rejoinStep, do func()) <-chan struct{} {
	reached := make(chan struct{})
	var once sync.Once
	var hook rejoinHook = func(at rejoinStep, _ raft.ServerID) {
		if at == step {
			once.Do(func() { close(reached); do() })
		}
	}
	leader.rejoinFailpoint.Store(&hook)
	return reached
}

// awaitStep waits until reached is closed (atRejoinStep), 20s at most.
func awaitStep(t *testing.T, reached <-chan struct{}, step rejoinStep) {
	t.Helper()
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatalf("the leader did not reach the step %q of adding the wiped member again", step)
	}
}

// wipeAndHoldRejoinAt wipes a follower of leader and returns once leader,
// adding it again, has reached step and is held there. It returns the
// follower's id and a func that lets the leader go on.
func wipeAndHoldRejoinAt(t *testing.T, c *testCluster, leader *Server, step rejoinStep) (victim string, goOn func()) {
	t.Helper()
	held := make(chan struct{})
	reached := atRejoinStep(leader, step, func() { <-held })
	victim, _ = c.wipeFollower(leader)
	awaitStep(t, reached, step)
	return victim, func() { close(held) }
}

// removeRejoining removes member id, which the group is adding again,
// through a client of c's other nodes, failing the test if it cannot.
func removeRejoining(t *testing.T, c *testCluster, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.client(c.endpoints(id)...).RemoveMember(ctx, id); err != nil {
		t.Fatalf("removing a member being added again: %v", err)
	}
}

// cutLinks cuts (or heals) every raft link from the nodes of c other than
// id to id, or, with out set, from id to the others.
func cutLinks(c *testCluster, id string, out, cut bool) {
	for _, other := range c.ids {
		if other == id {
			continue
		}
		from, to := other, id
		if out {
			from, to = id, other
		}
		c.link(from, to).SetCut(cut)
	}
}

// votesAgain waits until the group's leader counts member id as a voter
// and the node knows it (it no longer records that it asked).
func votesAgain(t *testing.T, c *testCluster, id string) {
	t.Helper()
	waitForWithin(t, 20*time.Second, id+" to be a voter again, and to know it", func() bool {
		srv, ok := c.leader().member(raft.ServerID(id))
		s := c.nodes[id]
		return ok && srv.Suffrage == raft.Voter && s.node.hasData() && !s.ident.rejoining.Load()
	})
}

// TestRejoinEndsOnlyWhenTheLeaderSaysSo is the failure of the check's
// wipe fault with the leader killed as it adds the member again: the
// wiped member, demoted, held part of the group's log, not yet its
// demotion, when the leader was killed. It found itself a voter in its
// own configuration, stopped asking, and stayed a non-voter once the
// demotion reached it: no later leader knew it owed a promotion. The
// node now asks until a leader says it counts it as a voter.
func TestRejoinEndsOnlyWhenTheLeaderSaysSo(t *testing.T) {
	c := startCluster(t, 3, nil)
	grantAndStore(t, c)
	id := c.followers(c.leader())[0].cfg.NodeID
	halfRejoined(t, c, id)
	// The demotion does not reach the node for a while: long enough for
	// it to look at its own configuration, in which it is a voter.
	cutLinks(c, id, false, true)
	c.start(id)
	time.Sleep(2 * rejoinPoll)
	cutLinks(c, id, false, false)
	votesAgain(t, c, id)
}

// TestLeaderFinishesARejoinItFinds: a leader that finds a non-voter member
// whose node says it lost its data and asked to be added again makes it a
// voter, even when the node's requests do not reach it (here: every link
// from the node is cut; in a group grown by hand, the leader may be none
// of the node's --peers).
func TestLeaderFinishesARejoinItFinds(t *testing.T) {
	c := startCluster(t, 3, nil)
	id := c.followers(c.leader())[0].cfg.NodeID
	halfRejoined(t, c, id)
	cutLinks(c, id, true, true)
	c.start(id)
	waitForWithin(t, 20*time.Second, "the leader to make "+id+" a voter again", func() bool {
		srv, ok := c.leader().member(raft.ServerID(id))
		return ok && srv.Suffrage == raft.Voter
	})
	if !c.nodes[id].ident.rejoining.Load() {
		t.Fatal("the node stopped asking before any leader told it it is a voter")
	}
	cutLinks(c, id, true, false)
	votesAgain(t, c, id)
}

// TestRejoinSurvivesItsLeaderAtEveryStep stops the leader that adds a
// wiped member again at each of its steps (the request taken, the member
// demoted, caught up, promoted), and starts it again on its data, as the
// check's wipe fault kills it: the member becomes a voter again under the
// next leader, without an operator, and knows it.
func TestRejoinSurvivesItsLeaderAtEveryStep(t *testing.T) {
	for _, step := range []rejoinStep{rejoinTaken, rejoinRecorded, rejoinRemoved, rejoinAdded, rejoinCaughtUp, rejoinPromoted} {
		t.Run(string(step), func(t *testing.T) {
			c := startCluster(t, 3, nil)
			grantAndStore(t, c)
			leader := c.leader()
			reached := atRejoinStep(leader, step, func() { <-leader.done }) // the leader stops here
			id, _ := c.wipeFollower(leader)
			awaitStep(t, reached, step)
			lid := leader.cfg.NodeID
			c.stop(lid)
			c.start(lid)
			votesAgain(t, c, id)
		})
	}
}

// cutBetween cuts (or heals) every link between nodes a and b, both ways.
func cutBetween(c *testCluster, a, b string, cut bool) {
	c.link(a, b).SetCut(cut)
	c.link(b, a).SetCut(cut)
}

// TestAWipedMemberGetsNoDataBeforeItsRemovalIsCommitted: the leader that
// adds a wiped member again used to demote it in place, and raft sends a
// member the log as soon as a configuration naming it is appended. With
// the demotion not committed (here: the other voter cut off as the leader
// takes the request), the node held part of the group's log, and so took
// raft connections that counted it a voter: had the leader been lost, a
// peer lacking an entry the node had acknowledged before it lost its data
// could have been elected with its vote. Now the leader commits the
// member's removal first; until it is committed, the node gets nothing.
func TestAWipedMemberGetsNoDataBeforeItsRemovalIsCommitted(t *testing.T) {
	c := startCluster(t, 3, nil)
	grantAndStore(t, c)
	leader := c.leader()
	lid := leader.cfg.NodeID
	victim := c.followers(leader)[0].cfg.NodeID
	var other string
	for _, f := range c.followers(leader) {
		if f.cfg.NodeID != victim {
			other = f.cfg.NodeID
		}
	}
	// Nothing the leader appends can commit once it takes the request.
	taken := atRejoinStep(leader, rejoinTaken, func() { cutBetween(c, lid, other, true) })
	c.stop(victim)
	c.wipe(victim)
	wiped := c.start(victim)
	awaitStep(t, taken, rejoinTaken)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if wiped.node.hasData() {
			t.Fatalf("the wiped member holds part of the group's log (to index %d) while nothing that takes away its vote is committed", wiped.node.raft.LastIndex())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cutBetween(c, lid, other, false)
	votesAgain(t, c, victim)
}

// TestAnOperatorsRemovalEndsARejoin: an operator who removes a member
// while the group adds it again has the last word: the leader, between
// the member's removal and its add, finds the record gone and adds
// nothing, and the node's requests are refused from then on.
func TestAnOperatorsRemovalEndsARejoin(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	victim, goOn := wipeAndHoldRejoinAt(t, c, leader, rejoinRemoved)
	if _, ok := leader.rejoinRecord(raft.ServerID(victim)); !ok {
		t.Fatal("the group removed a member to add it again, and keeps no record of it")
	}
	removeRejoining(t, c, victim)
	goOn()
	time.Sleep(3 * rejoinPoll) // the node asks, and the leader's hellos run
	if _, ok := leader.member(raft.ServerID(victim)); ok {
		t.Fatal("the group added again a member an operator removed")
	}
	if _, ok := leader.rejoinRecord(raft.ServerID(victim)); ok {
		t.Fatal("the record of the rejoin outlived the operator's removal")
	}
}
