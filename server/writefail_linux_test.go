package server

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A leader whose log write fails (here its disk filled between two looks
// at its free space: the poll that would hand leadership over first is
// off) is stepped down by raft, which tells the others nothing: they would
// elect a leader only once their heartbeat timeout passed. The node knows
// why it stepped down, and asks the voter with the longest log to stand
// for election at once, as a leadership transfer does. (docs/design.md,
// Disk full.)
func TestALeaderWhoseLogWriteFailsHandsOver(t *testing.T) {
	const heartbeat = 3 * time.Second
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.DataDir = filepath.Join(smallDisk(t, "64m"), "data")
		cfg.WALSegmentMB = 1
		cfg.MinFreeDisk = 0
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = heartbeat, heartbeat
	})
	leader := c.leader()
	fill(t, filepath.Dir(leader.cfg.DataDir))
	wantHandOver(t, c, leader, heartbeat)
}

// raft obeys a TimeoutNow in any state and term, and its candidate skips
// the pre-vote and is granted votes though its voters have a leader: one
// sent late, once the group elected a leader by itself, deposes it (a
// second failover). A voter that does not answer its hello used to hold
// the TimeoutNow up for a second, well past the heartbeat timeout; the
// voters are now asked at once, and nothing is sent past half the
// heartbeat timeout, nor once a newer term or a leader is known. (Found in
// review, as the two tests after this one.)
func TestALateStandDownDoesNotDeposeTheNewLeader(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.DataDir = filepath.Join(smallDisk(t, "64m"), "data")
		cfg.WALSegmentMB = 1
		cfg.MinFreeDisk = 0
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 200*time.Millisecond, 200*time.Millisecond
	})
	leader := c.leader()
	fs := c.followers(leader)
	slow := fs[0] // the first voter the leader asks for a hello after its failed write
	fill(t, filepath.Dir(leader.cfg.DataDir))
	// The leader's hello to slow goes unanswered (and its raft link too:
	// the other follower makes the majority).
	frozen := c.link(leader.cfg.NodeID, slow.cfg.NodeID)
	frozen.SetFrozen(true)
	t.Cleanup(func() { frozen.SetFrozen(false) })
	at := putUntilStepsDown(t, c, leader)

	// The first node other than the old leader that is ready to lead.
	var next *Server
	var term uint64
	waitForWithin(t, 10*time.Second, "another node to lead", func() bool {
		for _, s := range c.followers(leader) {
			if s.leaderReady.Load() {
				next, term = s, s.node.raft.CurrentTerm()
				return true
			}
		}
		return false
	})
	t.Logf("%s led in term %d, %v after the old leader's write failed", next.cfg.NodeID, term, time.Since(at))
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if !next.leaderReady.Load() || next.node.raft.CurrentTerm() != term {
			t.Fatalf("%s, leading in term %d, was deposed %v after the old leader's write failed (now term %d, state %v): the old leader's late TimeoutNow",
				next.cfg.NodeID, term, time.Since(at), next.node.raft.CurrentTerm(), next.node.raft.State())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// The same, reduced: standDown on a node that is not the leader, with a
// healthy leader known, leaves it be.
func TestStandDownLeavesAKnownLeaderBe(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	term := leader.node.raft.CurrentTerm()
	f := c.followers(leader)[0]
	f.standDown(errors.New("a write failed long ago"), f.node.raft.CurrentTerm(), time.Now().Add(time.Second))
	time.Sleep(time.Second)
	if !leader.leaderReady.Load() || leader.node.raft.CurrentTerm() != term {
		t.Fatalf("the leader of term %d was deposed by a follower's standDown (now term %d, state %v)",
			term, leader.node.raft.CurrentTerm(), leader.node.raft.State())
	}
}

// Two voters whose log writes fail with an error other than ENOSPC (an
// immutable or read-only directory, EIO, EDQUOT; and raft-wal reports a
// segment it could not rotate as "segment is sealed", whatever the cause)
// were never "low" in their hellos, and with logs of the same length each
// handed over to the other at once, hundreds of times a second, while the
// healthy voters, granting each their votes, seldom timed out to stand
// themselves. A hello now says that the node's last append failed, a
// successor is one whose did not, and a node stands down once in
// diskHandOffPause at most. Here n1 and n2 fail, and n3, n4 and n5 are a
// healthy majority.
func TestTwoVotersWhoseWritesFailDoNotHandOverToEachOther(t *testing.T) {
	if _, err := exec.LookPath("chattr"); err != nil {
		t.Skip("needs chattr")
	}
	c := startCluster(t, 5, func(cfg *Config) {
		cfg.DataDir = filepath.Join(smallDisk(t, "256m"), "data")
		cfg.WALSegmentMB = 1
		if testing.Verbose() {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", cfg.NodeID)
		}
	})
	leader := c.leader()
	if id := leader.cfg.NodeID; id != "n1" && id != "n2" {
		if err := leader.node.raft.LeadershipTransferToServer("n1", raft.ServerAddress(c.cfgs["n1"].RaftListen)).Error(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "n1 or n2 to lead", func() bool {
			return c.nodes["n1"].leaderReady.Load() || c.nodes["n2"].leaderReady.Load()
		})
		leader = c.leader()
	}
	other := map[string]string{"n1": "n2", "n2": "n1"}[leader.cfg.NodeID]
	for _, id := range []string{leader.cfg.NodeID, other} {
		dir := filepath.Join(c.nodes[id].cfg.DataDir, "wal")
		if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
			t.Skipf("chattr +i %s: %v %s", dir, err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", dir).Run() })
	}
	start := c.nodes["n3"].node.raft.CurrentTerm()
	at := putUntilStepsDown(t, c, leader)
	healthy := func() *Server {
		for _, id := range []string{"n3", "n4", "n5"} {
			if c.nodes[id].leaderReady.Load() {
				return c.nodes[id]
			}
		}
		return nil
	}
	var led *Server
	for end := at.Add(3 * time.Second); time.Now().Before(end) && led == nil; time.Sleep(2 * time.Millisecond) {
		led = healthy()
	}
	terms := c.nodes["n3"].node.raft.CurrentTerm() - start
	if led == nil {
		t.Fatalf("no healthy voter led within 3 s (the heartbeat timeout is %v) after %s's and %s's log writes began to fail; %d terms went by",
			c.cfgs["n3"].HeartbeatTimeout, leader.cfg.NodeID, other, terms)
	}
	t.Logf("%s led %v after the failed write, %d terms later", led.cfg.NodeID, time.Since(at), terms)
	if terms > 20 {
		t.Errorf("%d terms went by before a healthy voter led: the failing voters handed over to each other", terms)
	}
}

// A node replicates without raft's pipeline: the pipeline deadlocks once
// a follower refuses an append (its log write failed, or its log is
// behind), and then neither replicates to that follower again nor lets
// raft shut down. The hang showed in the tests above, whose followers'
// writes fail, as a Close that never returned.
func TestReplicationIsNotPipelined(t *testing.T) {
	s := startTestServer(t, nil)
	_, err := s.node.transport.AppendEntriesPipeline("n2", "127.0.0.1:1")
	if !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("the transport offers raft a pipeline (%v)", err)
	}
}
