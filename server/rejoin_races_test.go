package server

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence/internal/fsm"
)

// TestAnOperatorsRemovalOfACaughtUpRejoinHolds: an operator removes a
// member being added again after the leader added it back as a non-voter
// and saw it catch up, but before the promotion. The removal dropped the
// record, yet the leader's addAgain went on to AddVoter, which adds a
// member that is no longer in the configuration straight back as a voter.
// Now the leader promotes only a member that is still a non-voter at its
// address: the operator's removal has the last word.
func TestAnOperatorsRemovalOfACaughtUpRejoinHolds(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	victim, goOn := wipeAndHoldRejoinAt(t, c, leader, rejoinCaughtUp)
	removeRejoining(t, c, victim)
	if _, ok := leader.member(raft.ServerID(victim)); ok {
		t.Fatal("the operator's removal did not remove the member")
	}
	goOn()
	deadline := time.Now().Add(3 * rejoinPoll)
	for time.Now().Before(deadline) {
		if srv, ok := leader.member(raft.ServerID(victim)); ok {
			t.Fatalf("the group added again, as a %v, a member an operator removed", srv.Suffrage)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAMemberWipedAgainWhileANonvoterIsPromoted: a member being added
// again is wiped a second time while it is a non-voter, and its leader is
// lost before it promotes it. The new incarnation, dialed by the leader
// as a non-voter, gets the group's log before it has asked anyone (its
// hellos to its peers are lost for a moment), so its identity never
// records that it is rejoining and it never asks. The replicated state
// still records the rejoin, but finishRejoins skipped a record whose
// member is in the configuration, and took up a non-voter only when its
// hello said it is rejoining: no leader promoted it, and the group kept a
// non-voter and a rejoin record for good. Now the record decides.
func TestAMemberWipedAgainWhileANonvoterIsPromoted(t *testing.T) {
	c := startCluster(t, 3, nil)
	grantAndStore(t, c)
	leader := c.leader()
	reached := atRejoinStep(leader, rejoinAdded, func() { <-leader.done }) // the leader is lost here
	victim, _ := c.wipeFollower(leader)
	awaitStep(t, reached, rejoinAdded)
	// Wiped again; its own hellos and asks are lost until it holds data.
	c.stop(victim)
	c.wipe(victim)
	cutLinks(c, victim, true, true)
	again := c.start(victim)
	waitForWithin(t, 20*time.Second, "the member wiped again to get the log as a non-voter", again.node.hasData)
	cutLinks(c, victim, true, false)
	lid := leader.cfg.NodeID
	c.stop(lid)
	c.start(lid)
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := c.leader()
		srv, ok := l.member(raft.ServerID(victim))
		if ok && srv.Suffrage == raft.Voter {
			return
		}
		if time.Now().After(deadline) {
			_, recorded := l.rejoinRecord(raft.ServerID(victim))
			t.Fatalf("%s is not made a voter again: member %v (%v), its node rejoining %v, holds data %v; the rejoin recorded %v",
				victim, ok, srv.Suffrage, again.ident.rejoining.Load(), again.node.hasData(), recorded)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fakeNode answers node-link hellos at a raft address as a node of
// another version would, and nothing else (its raft port takes no raft).
type fakeNode struct {
	ln     net.Listener
	mu     sync.Mutex
	hello  nodeHello
	silent bool
}

func startFakeNode(t *testing.T, addr string, h nodeHello) *fakeNode {
	t.Helper()
	var ln net.Listener
	var err error
	for range 40 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{ln: ln, hello: h}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var b [1]byte
				if _, err := c.Read(b[:]); err != nil || b[0] != nodeLinkMagic {
					return
				}
				f.mu.Lock()
				h, silent := f.hello, f.silent
				f.mu.Unlock()
				if !silent {
					json.NewEncoder(c).Encode(h)
				}
			}()
		}
	}()
	return f
}

func (f *fakeNode) set(edit func(h *nodeHello, silent *bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(&f.hello, &f.silent)
}

// TestFoundersProtocolIsNotAMembersProtocol: agreeProtocol counts a
// founder that does not answer with the protocol it spoke when the group
// was founded. But a founder may run an older version since: here n4
// spoke protocol 6 at founding, and the group ran protocol 5 (n5 spoke
// 5), so rolling n4 back to a version of protocol 5 was allowed, and the
// leader hears n4 answer 5. Once n5 is removed and n4's hellos are lost
// for a moment, the leader moved the group to protocol 6, which n4 does
// not speak: n4 would stop at the first entry it does not understand (the
// SetProtocol itself, or a RejoinMember). Now the founders' protocols
// count only while the group has not left its first protocol.
func TestFoundersProtocolIsNotAMembersProtocol(t *testing.T) {
	c := newCluster(t, 5, nil)
	fakes := map[string]*fakeNode{}
	for id, p := range map[string]uint32{"n4": fsm.Protocol6, "n5": fsm.Protocol5} {
		c.reserved[id].Close()
		delete(c.reserved, id)
		fakes[id] = startFakeNode(t, c.cfgs[id].RaftListen, nodeHello{ID: id, Incarnation: "FAKE-" + id, Protocol: p})
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.start(id)
	}
	leader := c.leader()
	group := leader.clusterID()
	waitFor(t, "the group to run protocol 5", func() bool { return leader.fsm.Protocol() == fsm.Protocol5 })
	if f := leader.ident.founderProtocol("n4"); f != fsm.Protocol6 {
		t.Fatalf("n4's protocol at founding is %d, want 6", f)
	}
	// n4 is rolled back to a version that speaks protocol 5, which the
	// group runs: allowed.
	fakes["n4"].set(func(h *nodeHello, _ *bool) {
		h.Protocol, h.Group, h.LastIndex, h.LastTerm = fsm.Protocol5, group, leader.node.raft.LastIndex(), leader.node.raft.CurrentTerm()
	})
	time.Sleep(time.Second) // the leader hears n4 speak protocol 5
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.client(c.endpoints()...).RemoveMember(ctx, "n5"); err != nil {
		t.Fatalf("removing n5: %v", err)
	}
	time.Sleep(time.Second)
	if p := leader.fsm.Protocol(); p != fsm.Protocol5 {
		t.Fatalf("the group moved to protocol %d while n4 answers that it speaks 5", p)
	}
	// n4's hellos are lost for a moment; it still runs protocol 5.
	fakes["n4"].set(func(_ *nodeHello, silent *bool) { *silent = true })
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if p := leader.fsm.Protocol(); p != fsm.Protocol5 {
			t.Fatalf("the group moved to protocol %d while member n4, last heard speaking 5, did not answer (counted with the protocol it spoke at founding)", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAWipedMemberAddedByHandRejoins: a member added by hand runs with
// --join and no --peers. Wiped, it holds no data and is a voter of the
// group, so it refuses the group's raft connections; but it asks nobody
// to add it again (only a node with --peers runs the census that asks),
// and no leader took it up, for its hello never said it is rejoining: the
// group kept a voter that votes for nothing and stores nothing, for good,
// with --auto-rejoin on. Now the hello of a --join node without data says
// it waits, and a leader that finds it a voter adds it again.
func TestAWipedMemberAddedByHandRejoins(t *testing.T) {
	c := startCluster(t, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range []string{"n2", "n3"} {
		_, cfg := c.startJoiner(id)
		if err := c.client(c.endpoints()...).AddMember(ctx, id, cfg.RaftListen, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"n2", "n3"} {
		if srv, _ := c.leader().member(raft.ServerID(id)); srv.Suffrage != raft.Voter {
			t.Fatalf("%s was not made a voter", id)
		}
	}
	grantAndStore(t, c)
	c.stop("n2")
	c.wipe("n2")
	wiped := c.start("n2")
	deadline := time.Now().Add(20 * time.Second)
	for !wiped.node.hasData() {
		if time.Now().After(deadline) {
			srv, _ := c.leader().member("n2")
			t.Fatalf("n2, wiped, is a %v member holding no data after 20s, and is not being added again (rejoining %v, status %q)",
				srv.Suffrage, wiped.ident.rejoining.Load(), wiped.problems())
		}
		time.Sleep(50 * time.Millisecond)
	}
	votesAgain(t, c, "n2")
}

// TestANewGroupRunsItsProtocolOnceReady: a new node's leader was ready
// before its group had agreed its protocol (the hellos agree it after),
// so a txn sent as soon as it was ready could be refused as needing
// protocol 5 (fence kv txn's test did so under load). The founders'
// protocol is now committed before the leader is ready, for a node alone
// and for a group whose members all founded it.
func TestANewGroupRunsItsProtocolOnceReady(t *testing.T) {
	for _, n := range []int{1, 3} {
		c := newCluster(t, n, nil)
		for _, id := range c.ids {
			c.start(id)
		}
		leader := c.leader()
		if p := leader.fsm.Protocol(); p != fsm.Protocol {
			t.Fatalf("a new group of %d: its ready leader runs protocol %d, want %d", n, p, fsm.Protocol)
		}
	}
}
