package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// causeError is an error with a Cause and no Unwrap, as msgpack's are.
type causeError struct{ cause error }

func (e causeError) Error() string { return "msgpack decode error: " + e.cause.Error() }
func (e causeError) Cause() error  { return e.cause }

// raft's lines reach the log at the level their meaning deserves: the
// many about a peer it cannot reach as one warning, a peer refusing this
// node as one error per peer, routine warnings as info, the node's own
// transport shutting down as debug; other errors stay errors.
func TestRaftLogSinkLevels(t *testing.T) {
	rec := &logRecorder{}
	hlog, sink := newRaftLog(rec.logger())
	n2 := raft.Server{ID: "n2", Address: "127.0.0.1:7002", Suffrage: raft.Voter}
	n3 := raft.Server{ID: "n3", Address: "127.0.0.1:7003", Suffrage: raft.Voter}
	down := errors.New("dial tcp 127.0.0.1:7002: connect: connection refused")
	for range 10 {
		hlog.Error("failed to appendEntries to", "peer", n2, "error", down)
		hlog.Error("failed to make requestVote RPC", "target", n2, "error", down, "term", 3)
		hlog.Warn("failed to contact", "server-id", n2.ID, "time", time.Second)
	}
	refusal := &raftRefusedError{id: "n3", addr: n3.Address, reason: "this node holds no data"}
	for range 10 {
		hlog.Error("failed to appendEntries to", "peer", n3, "error", refusal)
	}
	hlog.Error("failed to decode incoming command", "error", raft.ErrTransportShutdown)
	hlog.Error("failed to decode incoming command", "error", causeError{syscall.ECONNRESET})
	hlog.Error("failed to decode incoming command", "error", causeError{syscall.ECONNRESET})
	hlog.Error("failed to decode incoming command", "error", errors.New("unknown rpc type 9"))
	hlog.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	hlog.Warn("failed to get previous log", "previous-index", 8, "last-index", 0, "error", raft.ErrLogNotFound)
	hlog.Warn("appendEntries rejected, sending older logs", "peer", n2, "next", 1)
	hlog.Warn("rejecting pre-vote request since we have a leader", "from", n3.Address, "leader", n2.Address, "leader-id", n2.ID)
	hlog.Warn("rejecting vote request since we have a leader", "from", n3.Address, "leader", n2.Address, "leader-id", n2.ID)
	for _, kind := range []string{"pre-vote", "vote"} {
		hlog.Warn("rejecting "+kind+" request since our last term is greater", "candidate", n3.Address, "last-term", 2, "last-candidate-term", 1)
		hlog.Warn("rejecting "+kind+" request since our last index is greater", "candidate", n3.Address, "last-index", 5, "last-candidate-index", 3)
	}
	hlog.Warn("no known peers, aborting election")
	hlog.Warn("heartbeat timeout reached, starting election", "last-leader-addr", n2.Address, "last-leader-id", n2.ID)

	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelWarn, "peer unreachable"},
		{slog.LevelError, "peer refuses this node's raft connections"},
		{slog.LevelDebug, "failed to decode incoming command"},
		{slog.LevelWarn, "failed to decode incoming command"},
		{slog.LevelError, "failed to decode incoming command"},
		{slog.LevelInfo, "heartbeat timeout reached, starting election"},
		{slog.LevelInfo, "failed to get previous log"},
		{slog.LevelInfo, "appendEntries rejected, sending older logs"},
		{slog.LevelInfo, "rejecting pre-vote request since we have a leader"},
		{slog.LevelInfo, "rejecting vote request since we have a leader"},
		{slog.LevelInfo, "rejecting pre-vote request since our last term is greater"},
		{slog.LevelInfo, "rejecting pre-vote request since our last index is greater"},
		{slog.LevelInfo, "rejecting vote request since our last term is greater"},
		{slog.LevelInfo, "rejecting vote request since our last index is greater"},
		{slog.LevelInfo, "no known peers, aborting election"},
		{slog.LevelWarn, "heartbeat timeout reached, starting election"},
	}
	got := rec.atLeast(slog.LevelDebug)
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d:\n%s", len(got), len(want), recordsText(got))
	}
	for i, w := range want {
		if got[i].Level != w.level || got[i].Msg != w.msg {
			t.Errorf("record %d is %v, want %s %q", i, got[i], w.level, w.msg)
		}
	}
	if got[0].Attrs["peer_id"] != "n2" || !strings.Contains(got[0].Attrs["error"], "connection refused") {
		t.Errorf("the warning %v does not name n2 and its error", got[0])
	}
	if got[1].Attrs["peer_id"] != "n3" || !strings.Contains(got[1].Attrs["error"], "holds no data") {
		t.Errorf("the error %v does not name n3 and why it refuses", got[1])
	}

	sink.peerBack("n2")
	back := rec.find(slog.LevelInfo, "peer reachable again")
	if len(back) != 1 || back[0].Attrs["peer_id"] != "n2" || back[0].Attrs["suppressed"] != "29" {
		t.Fatalf("after n2 answered again: %v; want one info naming n2 with suppressed=29", back)
	}
	hlog.Error("failed to heartbeat to", "peer", n2.Address, "error", down)
	if n := len(rec.find(slog.LevelWarn, "peer unreachable")); n != 2 {
		t.Fatalf("%d warnings of n2 unreachable after it came back and went again, want 2", n)
	}
}

// A follower stopped for a few seconds costs the leader's log one warning
// and, when it is back, one info line that counts the lines held back;
// raft used to log each failed heartbeat and append as an error, several a
// second, for as long as the peer was down. No node logs an error.
func TestAStoppedPeerIsOneWarning(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, logs.edit)
	leader := c.leader()
	peer := c.followers(leader)[0].cfg.NodeID
	c.stop(peer)
	time.Sleep(4 * time.Second)
	c.start(peer)
	leaderLog := logs.of(leader.cfg.NodeID)
	waitFor(t, "the leader to log that the peer is back", func() bool {
		return len(leaderLog.find(slog.LevelInfo, "peer reachable again")) > 0
	})
	back := leaderLog.find(slog.LevelInfo, "peer reachable again")[0]
	if back.Attrs["peer_id"] != peer || back.Attrs["suppressed"] == "" || back.Attrs["suppressed"] == "0" {
		t.Errorf("%v; want it to name %s and count the lines held back", back, peer)
	}
	warnings := logs.atLeast(slog.LevelWarn)
	for _, rec := range warnings {
		if rec.Level >= slog.LevelError || rec.Attrs["peer_id"] != peer {
			t.Errorf("%v; want only warnings about %s", rec, peer)
		}
	}
	if len(warnings) > 2 {
		t.Errorf("%d warnings for a peer stopped 4s, want at most 2:\n%s", len(warnings), recordsText(warnings))
	}
}

// A leader's Shutdown (SIGTERM) hands leadership over and says so as
// info; it logs no warning or error of its own, and the others warn once
// at most that it is gone.
func TestShutdownHandOffLogsInfo(t *testing.T) {
	var logs nodeLogs
	c := startCluster(t, 3, logs.edit)
	old := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := old.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the new leader tries to reach the old one
	id := old.cfg.NodeID
	if len(logs.of(id).find(slog.LevelInfo, "leadership handed over")) != 1 {
		t.Errorf("the old leader did not log the hand-off as info:\n%s", recordsText(logs.of(id).atLeast(slog.LevelDebug)))
	}
	for _, rec := range logs.atLeast(slog.LevelWarn) {
		if rec.Attrs["node"] == id || rec.Level >= slog.LevelError || rec.Msg != "peer unreachable" || rec.Attrs["peer_id"] != id {
			t.Errorf("%v; want no warning or error but one of %s unreachable", rec, id)
		}
	}
}

// A single node's start and stop, a group's start, and a node started
// with Join and added to the group log nothing above info: a member that
// joins with an empty log is caught up as a matter of course.
func TestNormalStartsLogNoWarnings(t *testing.T) {
	single := &logRecorder{}
	s := startTestServer(t, func(cfg *Config) { cfg.Logger = single.logger() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if recs := single.atLeast(slog.LevelWarn); len(recs) > 0 {
		t.Errorf("a single node's start and stop logged:\n%s", recordsText(recs))
	}

	var logs nodeLogs
	c := startCluster(t, 3, logs.edit)
	n4, cfg4 := c.startJoiner("n4")
	if err := c.client(c.endpoints("n4")...).AddMember(ctx, "n4", cfg4.RaftListen, true); err != nil {
		t.Fatal(err)
	}
	leader := c.leader()
	waitFor(t, "n4 to catch up", func() bool {
		return lastToken(n4) == lastToken(leader) && n4.node.raft.AppliedIndex() >= leader.node.raft.CommitIndex()
	})
	if recs := logs.atLeast(slog.LevelWarn); len(recs) > 0 {
		t.Errorf("a group's start and a join logged:\n%s", recordsText(recs))
	}
}

// A peer that refuses this node's raft connections by the group's
// identity rules (here a node of another group, added behind the check's
// back) is an error in the dialer's log, naming the peer and why, once
// for all the connections raft tries in the next minute.
func TestARefusingPeerIsOneErrorPerPeer(t *testing.T) {
	var logs nodeLogs
	x, y := newClusterOf(t, []string{"n2"}, nil), startCluster(t, 1, logs.edit)
	x.start("n2")
	xl, yl := x.leader(), y.leader()
	yl.node.raft.AddVoter("n2", raft.ServerAddress(xl.RaftAddr()), 0, time.Second)
	ylog := logs.of(yl.cfg.NodeID)
	waitFor(t, "Y's leader to log the refusal", func() bool {
		return len(ylog.find(slog.LevelError, "peer refuses this node's raft connections")) > 0
	})
	time.Sleep(2 * time.Second) // raft keeps dialing n2
	refusals := ylog.find(slog.LevelError, "peer refuses this node's raft connections")
	if len(refusals) != 1 || refusals[0].Attrs["peer_id"] != "n2" || !strings.Contains(refusals[0].Attrs["error"], "refused this node's raft connection") {
		t.Fatalf("Y's leader logged %d refusals, want 1 naming n2 and the refusal:\n%s", len(refusals), recordsText(refusals))
	}
	for _, rec := range ylog.atLeast(slog.LevelError) {
		if rec.Msg != "peer refuses this node's raft connections" {
			t.Errorf("another error: %v", rec)
		}
	}
}
