package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// REVIEW: a wiped follower that cannot reach its peers (while they reach
// it: a one-way cut, as TestASlowFounderIsNoAlarm makes for a slow
// founder) hears no peer holding data, so it counts as founding for as
// long as the cut lasts: the leader logs its refusal at info, as a slow
// founder's, and never says its data dir was lost.
func TestReviewAWipedFollowerCutOneWayIsStillAnAlarm(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.AutoRejoin = false
		logs.edit(cfg)
	})
	leader := c.leader()
	victim := c.followers(leader)[0].cfg.NodeID
	for _, to := range c.ids {
		if to != victim {
			c.link(victim, to).SetCut(true)
		}
	}
	c.stop(victim)
	c.wipe(victim)
	wiped := c.start(victim)
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
		victim, victim, wiped.node.founding.Load(), noteOf(wiped), recordsText(logs.of(leader.cfg.NodeID).find(slog.LevelInfo, "peer has not founded the group yet")))
}

// REVIEW: the raftLogSink's downgrade of "Election timeout reached,
// restarting election" is refreshed by every founding refusal, so it lasts
// as long as a peer refuses as founding, not 10 s: with a wiped node cut
// one way (above) and the third node down, the survivor cannot elect a
// leader for good, and its failed elections are all info.
func TestReviewFailedElectionsStayWarningsBeyondTenSeconds(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.AutoRejoin = false
		logs.edit(cfg)
	})
	leader := c.leader()
	fs := c.followers(leader)
	victim, other := fs[0].cfg.NodeID, fs[1].cfg.NodeID
	for _, to := range c.ids {
		if to != victim {
			c.link(victim, to).SetCut(true)
		}
	}
	c.stop(victim)
	c.wipe(victim)
	c.start(victim)
	c.stop(other)
	time.Sleep(14 * time.Second)
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
		t.Errorf("%s failed %d elections over 14 s with %s down and %s wiped, all logged at info", leader.cfg.NodeID, infos, other, victim)
	}
}
