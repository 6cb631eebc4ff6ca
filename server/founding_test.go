package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"
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
	if wiped.node.founding.Load() {
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
