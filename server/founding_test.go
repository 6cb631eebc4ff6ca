package server

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A founder slower than its peers to find every peer up (here it cannot
// reach n2, which reaches it) is asked for its vote by a node that founded
// the group already. Holding no data, it refuses, but says it is still
// founding: neither side takes the normal course of a group's start for a
// lost data dir, so neither logs a warning or an error, and once the slow
// founders reach their peers they found the same group. It used to be an
// error on the founder ("peer refuses this node's raft connections") and
// a warning on each slow one, under load at many a group's start.
func TestASlowFounderIsNoAlarm(t *testing.T) {
	var logs nodeLogs
	c := newCluster(t, 3, logs.edit)
	for _, from := range []string{"n1", "n3"} {
		c.link(from, "n2").SetCut(true)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	n2 := c.nodes["n2"]
	waitFor(t, "n2 to found the group", func() bool { return n2.node.hasData() })
	time.Sleep(1500 * time.Millisecond) // n2 asks n1 and n3 for their votes, again and again
	if refused := logs.of("n2").find(slog.LevelInfo, "peer has not founded the group yet"); len(refused) == 0 {
		t.Errorf("n2 did not say that its peers have not founded the group yet:\n%s", recordsText(logs.of("n2").atLeast(slog.LevelDebug)))
	}
	for _, from := range []string{"n1", "n3"} {
		c.link(from, "n2").SetCut(false)
	}
	leader := c.leader()
	for _, id := range c.ids {
		// A follower learns the group's id when it applies the leader's
		// SetClusterID: wait for it rather than read it at once.
		waitFor(t, id+" to be of the leader's group", func() bool {
			return leader.clusterID() != "" && c.nodes[id].clusterID() == leader.clusterID()
		})
	}
	if recs := logs.atLeast(slog.LevelWarn); len(recs) > 0 {
		t.Errorf("a group whose founders start at their own pace logged:\n%s", recordsText(recs))
	}
}

// A wiped follower is no founder: once its census has found that a peer
// holds the group's data, the leader's connections to it are refused as
// for good, and the leader says so as an error.
func TestAWipedFollowerIsStillAnAlarm(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.AutoRejoin = false
		logs.edit(cfg)
	})
	leader := c.leader()
	victim, wiped := c.wipeFollower(leader)
	waitFor(t, "the wiped node to see it holds no data of the group", func() bool {
		return strings.Contains(noteOf(wiped), "answers with group "+leader.clusterID())
	})
	if wiped.node.founding() {
		t.Error("the wiped node still counts itself as founding")
	}
	waitFor(t, "the leader to log the wiped node's refusal as an error", func() bool {
		for _, rec := range logs.of(leader.cfg.NodeID).find(slog.LevelError, "peer refuses this node's raft connections") {
			if rec.Attrs["peer_id"] == victim && strings.Contains(rec.Attrs["error"], "data dir was lost") {
				return true
			}
		}
		return false
	})
}

// A wiped follower that cannot reach its peers while they reach it (a
// one-way cut, as TestASlowFounderIsNoAlarm makes for a slow founder)
// hears no peer holding data, and cannot tell itself from a slow founder:
// it refuses as founding for foundingGrace at most, then as for good, and
// the leader says its data dir was lost. (Found in review: it counted as
// founding for as long as the cut lasted.)
func TestAWipedFollowerCutOneWayIsAnAlarmAfterTheGrace(t *testing.T) {
	shortFoundingGrace(t)
	var logs nodeLogs
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.AutoRejoin = false
		logs.edit(cfg)
	})
	leader := c.leader()
	victim := c.followers(leader)[0].cfg.NodeID
	wiped := c.wipeCutOneWay(victim)
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		for _, rec := range logs.of(leader.cfg.NodeID).find(slog.LevelError, "peer refuses this node's raft connections") {
			if rec.Attrs["peer_id"] == victim && strings.Contains(rec.Attrs["error"], "data dir was lost") {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("the leader never said %s's data dir was lost; %s founding=%v, note %q; the leader logged:\n%s",
		victim, victim, wiped.node.founding(), noteOf(wiped), recordsText(logs.of(leader.cfg.NodeID).find(slog.LevelInfo, "peer has not founded the group yet")))
}

// A node's failed elections are info while peers refuse its connections
// as founding, for foundingGrace at most: with a wiped node cut one way
// (above) and the third node down, the survivor cannot elect a leader for
// good, and says so. (Found in review: every founding refusal prolonged
// the downgrade.)
func TestFailedElectionsAreWarningsAfterTheFoundingGrace(t *testing.T) {
	shortFoundingGrace(t)
	var logs nodeLogs
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.AutoRejoin = false
		logs.edit(cfg)
	})
	leader := c.leader()
	fs := c.followers(leader)
	victim, other := fs[0].cfg.NodeID, fs[1].cfg.NodeID
	c.wipeCutOneWay(victim)
	c.stop(other)
	time.Sleep(6 * time.Second)
	var warned, infos int
	for _, rec := range logs.of(leader.cfg.NodeID).atLeast(slog.LevelDebug) {
		if rec.Msg != "Election timeout reached, restarting election" {
			continue
		}
		if rec.Level >= slog.LevelWarn {
			warned++
		} else {
			infos++
		}
	}
	if warned == 0 {
		t.Errorf("%s failed %d elections over 6 s with %s down and %s wiped, all logged at info", leader.cfg.NodeID, infos, other, victim)
	}
}

// shortFoundingGrace makes foundingGrace 2 s for the test.
func shortFoundingGrace(t *testing.T) {
	saved := foundingGrace
	foundingGrace = 2 * time.Second
	t.Cleanup(func() { foundingGrace = saved })
}

// wipeCutOneWay cuts id's way to every other node (theirs to it stays),
// wipes its data dir and starts it again.
func (c *testCluster) wipeCutOneWay(id string) *Server {
	for _, to := range c.ids {
		if to != id {
			c.link(id, to).SetCut(true)
		}
	}
	c.stop(id)
	c.wipe(id)
	return c.start(id)
}

// A founder that is slow to found (here it cannot reach its peers, which
// reach it) while another founder is lost for good still founds the group
// with the one left: the two are a majority of three, and the group must
// not wait on a node that may never come back. The founder holding data
// says whom the group was founded with, each peer's data dir by its
// incarnation; the slow one finds its own among them, so it knows it never
// held the group's data, and founds from that record. It used to wait for
// the lost founder's answer for ever, and no leader could be elected.
func TestASlowFounderFoundsWithOnePeerWhenAnotherIsLost(t *testing.T) {
	c := newCluster(t, 3, nil)
	for _, to := range []string{"n1", "n3"} {
		c.link("n2", to).SetCut(true)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	first := c.leader()
	if first.cfg.NodeID == "n2" || c.nodes["n2"].node.hasData() {
		t.Fatal("n2 founded the group while it could reach no peer")
	}
	c.stop(first.cfg.NodeID)
	for _, to := range []string{"n1", "n3"} {
		c.link("n2", to).SetCut(false)
	}
	leader := c.leader()
	n2 := c.nodes["n2"]
	waitFor(t, "n2 to apply the group's id", func() bool {
		return n2.clusterID() != "" && n2.clusterID() == leader.clusterID()
	})
}

// A wiped founder is no slow founder, even while another is down: its
// data dir has a new incarnation, which the founders' record does not
// name, so it founds nothing (it may have acknowledged entries the group
// counts on), and no leader is elected from the one intact node's data.
func TestAWipedFounderDoesNotFoundWithOnePeer(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) { cfg.AutoRejoin = false })
	leader := c.leader()
	other, victim, wiped := c.wipeWithOneDown(leader)
	waitFor(t, "the wiped node to hear the leader hold data", func() bool {
		return wiped.node.hasData() || strings.Contains(noteOf(wiped), leader.cfg.NodeID+" hold data already")
	})
	time.Sleep(2 * time.Second)
	if wiped.node.hasData() {
		t.Fatalf("the wiped %s founded the group again with %s while %s was down", victim, leader.cfg.NodeID, other)
	}
}

// A founder that lost its raft files but kept its identity file is no
// slow founder either, even while another is down: its incarnation is in
// the founders' record, but it voted and acknowledged entries before its
// raft files went (its identity names the group it founded), so it founds
// nothing from one peer's record. Founding again would make it a voter
// with an empty log, whose vote could elect a peer that lacks entries the
// group committed with it. Kept beside the identity: nothing (the log and
// the term gone), or raft.db (the term kept, the raft-wal log gone), where
// raft refuses to bootstrap and the node must go on saying why it waits:
// its identity says it founded the group, and it holds no data.
func TestAFounderWhoseRaftFilesAreLostDoesNotFoundWithOnePeer(t *testing.T) {
	for name, keep := range map[string][]string{"all lost": {identityFile}, "wal lost": {identityFile, "raft.db", "log-store"}} {
		t.Run(name, func(t *testing.T) {
			c := startCluster(t, 3, func(cfg *Config) { cfg.AutoRejoin = false })
			leader := c.leader()
			fs := c.followers(leader)
			down, victim := fs[0].cfg.NodeID, fs[1].cfg.NodeID
			if f := leader.ident.founding(); f == nil || f.Incarnations[victim] != fs[1].ident.incarnation {
				t.Fatalf("the leader's founders' record %+v does not name %s's incarnation %s", f, victim, fs[1].ident.incarnation)
			}
			c.stop(down)
			lost := c.loseRaftFiles(victim, keep...)
			waitFor(t, "the node to say its raft files were lost", func() bool {
				return lost.node.hasData() || strings.Contains(noteOf(lost), "raft files were lost")
			})
			time.Sleep(2 * time.Second)
			if lost.node.hasData() {
				t.Fatalf("%s, its raft files lost, founded the group again with %s while %s was down", victim, leader.cfg.NodeID, down)
			}
			if !strings.Contains(noteOf(lost), "raft files were lost") {
				t.Fatalf("%s no longer says why it waits (%q): it took raft's refusal to bootstrap for a founding", victim, noteOf(lost))
			}
		})
	}
}

// The same with every peer up: the census of a node whose raft files were
// lost, its identity file kept, finds the group it would found with its
// peers to be its own (no incarnation changed), and it used to found it
// again with an empty log, and vote (or, with raft.db kept, take raft's
// refusal for a founding, and wait for ever). The identity now records
// that the node founded its group once raft wrote the first entry: such a
// node holding no data asks to be added again, and the leader adds it.
func TestAFounderWhoseRaftFilesAreLostIsAddedAgain(t *testing.T) {
	for name, keep := range map[string][]string{"all lost": {identityFile}, "wal lost": {identityFile, "raft.db", "log-store"}} {
		t.Run(name, func(t *testing.T) {
			var logs nodeLogs
			c := startCluster(t, 3, logs.edit)
			leader := c.leader()
			victim := c.followers(leader)[0].cfg.NodeID
			lost := c.loseRaftFiles(victim, keep...)
			waitFor(t, victim+" to be a voter again", func() bool {
				srv, ok := c.leader().member(raft.ServerID(victim))
				return ok && srv.Suffrage == raft.Voter && lost.node.hasData() && !lost.ident.rejoining.Load()
			})
			if n := len(logs.of(victim).find(slog.LevelInfo, "bootstrapped a new group")); n != 1 {
				t.Errorf("%s logged %d times that it bootstrapped the group; want once, before its raft files were lost", victim, n)
			}
			if len(logs.of(victim).find(slog.LevelInfo, "the group's leader adds this node again; it catches up from the group, then votes again")) == 0 {
				t.Errorf("%s holds data again, but was not added again by the leader", victim)
			}
		})
	}
}

// loseRaftFiles stops node id, removes what its data dir holds but the
// files named in keep, and starts it again.
func (c *testCluster) loseRaftFiles(id string, keep ...string) *Server {
	c.t.Helper()
	c.stop(id)
	removeAllBut(c.t, c.cfgs[id].DataDir, keep...)
	return c.start(id)
}

// removeAllBut removes what dir holds but the files named in keep.
func removeAllBut(tb testing.TB, dir string, keep ...string) {
	tb.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// A node alone whose raft files were lost, its identity file kept, used to
// found its group again under the same id, with an empty state: its tokens
// started over at 1, and a node since grown into a group became a second
// group of the same id. It now refuses to start, and says what to do.
func TestANodeAloneWhoseRaftFilesAreLostRefusesToStart(t *testing.T) {
	s := startTestServer(t, nil)
	cfg := s.cfg
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	removeAllBut(t, cfg.DataDir, identityFile)
	again, err := Start(cfg)
	if err == nil {
		again.Close()
		t.Fatal("a node alone whose raft files were lost started, with its group's id and an empty state")
	}
	if !strings.Contains(err.Error(), "raft files were lost") {
		t.Fatalf("the refusal does not say the raft files were lost: %v", err)
	}
	// Emptied and started again with its flags (no --peers, no --join),
	// the node would found a new group: the way back into a group it grew
	// into is --join.
	if !strings.Contains(err.Error(), "--join") || !strings.Contains(err.Error(), "fence members remove "+cfg.NodeID) {
		t.Errorf("the refusal does not say how to add the node to its group again (remove it, then start it with --join): %v", err)
	}
}

// A data dir written before nodes recorded that they hold raft data (an
// identity without held_data) records it at the node's first start with
// data, so the refusal above holds for it too once it is upgraded.
func TestADataDirOfAnOlderVersionRecordsThatItHoldsData(t *testing.T) {
	s := startTestServer(t, nil)
	cfg := s.cfg
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	asAnOlderVersionWroteIt(t, cfg.DataDir)
	upgraded := mustStart(t, cfg)
	if err := upgraded.Close(); err != nil {
		t.Fatal(err)
	}
	removeAllBut(t, cfg.DataDir, identityFile)
	if again, err := Start(cfg); err == nil {
		again.Close()
		t.Fatal("an upgraded node alone whose raft files were lost started, with its group's id and an empty state")
	}
}

// A founder can come to hold the group's data without founding it: one
// that wrote the group down (identity.found) and stopped before raft wrote
// the first entry comes back to a group its peers founded meanwhile; with
// a peer silent it may not found from the founders' record (its data dir
// names the group), so it asks to be added again, and the leader adds it
// and it catches up from the log. Its incarnation is the one the group's
// id was derived from, so should its raft files be lost later, its
// identity file kept, its census finds the group its own again: only the
// identity's record that it held data stops it from founding the group
// again with an empty log and voting. That record was written at founding,
// at a start with data and at a snapshot's install, not when the node
// caught up from the log: until its next start it had none.
func TestAFounderAddedByTheGroupRecordsThatItHoldsData(t *testing.T) {
	var logs nodeLogs
	c := newCluster(t, 3, logs.edit)
	// n2 reaches no peer (they reach it): n1 and n3 found the group.
	for _, to := range []string{"n1", "n3"} {
		c.link("n2", to).SetCut(true)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	leader := c.leader()
	if c.nodes["n2"].node.hasData() {
		t.Fatal("n2 founded the group while it could reach no peer")
	}
	other := "n1"
	if leader.cfg.NodeID == "n1" {
		other = "n3"
	}
	f := leader.ident.founding()
	if f == nil || f.Incarnations["n2"] != c.nodes["n2"].ident.incarnation {
		t.Fatalf("the founders' record %+v does not name n2's incarnation", f)
	}
	// n2 stops after writing the group down, before raft wrote a byte
	// (bootstrapGroup: identity.found, then BootstrapCluster).
	c.stop("n2")
	id, err := openIdentity(c.cfgs["n2"].DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.found(leader.ident.groupID(), *f); err != nil {
		t.Fatal(err)
	}
	c.link("n2", leader.cfg.NodeID).SetCut(false) // other stays silent to n2
	n2 := c.start("n2")
	waitFor(t, "n2 to be added again and a voter", func() bool {
		srv, ok := c.leader().member("n2")
		return ok && srv.Suffrage == raft.Voter && n2.node.hasData() && !n2.ident.rejoining.Load()
	})
	if !n2.ident.heldData.Load() {
		t.Errorf("n2, a voter holding the group's data, has not recorded that it holds data")
	}
	c.link("n2", other).SetCut(false)
	lost := c.loseRaftFiles("n2", identityFile)
	waitFor(t, "n2 to be a voter again", func() bool {
		srv, ok := c.leader().member("n2")
		return ok && srv.Suffrage == raft.Voter && lost.node.hasData() && !lost.ident.rejoining.Load()
	})
	if n := len(logs.of("n2").find(slog.LevelInfo, "bootstrapped a new group")); n != 0 {
		t.Errorf("n2, its raft files lost, founded the group again (with an empty log, as a voter) %d times", n)
	}
}

// asAnOlderVersionWroteIt takes held_data out of the identity in dir, as
// an older version wrote it, after checking it was there.
func asAnOlderVersionWroteIt(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, identityFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["held_data"] != true {
		t.Fatalf("a node that held its group's data did not record it: %s", data)
	}
	delete(rec, "held_data")
	old, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A data dir of an older version (no held_data) whose raft-wal log was
// lost, raft.db kept, is refused by raft's bootstrap (it keeps a term):
// the node said so, and asked nobody to add it again, for ever. It now
// asks, and the leader adds it again.
func TestAnOlderDataDirWhoseLogIsLostIsAddedAgain(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, logs.edit)
	leader := c.leader()
	victim := c.followers(leader)[0].cfg.NodeID
	c.stop(victim)
	asAnOlderVersionWroteIt(t, c.cfgs[victim].DataDir)
	removeAllBut(t, c.cfgs[victim].DataDir, identityFile, "raft.db", "log-store")
	lost := c.start(victim)
	waitFor(t, victim+" to be a voter again", func() bool {
		srv, ok := c.leader().member(raft.ServerID(victim))
		return ok && srv.Suffrage == raft.Voter && lost.node.hasData() && !lost.ident.rejoining.Load()
	})
	if len(logs.of(victim).find(slog.LevelInfo, "the group's leader adds this node again; it catches up from the group, then votes again")) == 0 {
		t.Errorf("%s holds data again, but was not added again by the leader", victim)
	}
}
