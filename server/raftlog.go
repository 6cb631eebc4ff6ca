package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raftLog returns an hclog logger for raft and its stores that hands
// their warnings and errors to logger (see raftLogSink); raft's info and
// debug chatter is dropped.
func raftLog(logger *slog.Logger) hclog.Logger {
	l, _ := newRaftLog(logger)
	return l
}

// newRaftLog is raftLog, and its sink, for the node to tell it the raft
// whose peers it names (raftLogSink.members).
func newRaftLog(logger *slog.Logger) (hclog.Logger, *raftLogSink) {
	l := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: io.Discard})
	sink := &raftLogSink{logger: logger}
	if logger != nil {
		l.RegisterSink(sink)
	}
	return l, sink
}

// raftLogSink maps raft's lines to records at the level their meaning
// deserves, with raft's arguments as attributes. Most keep raft's level.
// Those about one peer raft cannot reach (a peer down: raft logs each
// failed heartbeat, append and vote request as an error, several a
// second) become one warning, "peer unreachable", logged once a minute
// per peer with the count of the lines held back, and an info line when
// the peer answers heartbeats again (peerBack). A peer that refuses this
// node's raft connections by the group's identity rules (a wiped node, a
// node of another group) stays an error, once a minute per peer: it does
// not pass by itself; one that holds no data while it finds out whether
// it founds the group with this node is info, and so are this node's
// elections that fail meanwhile. Warnings of the normal course of things are info
// (routineWarning), and so is a leader's learning of a newer term while it
// hands its leadership over (a warning otherwise); the error of the node's
// own transport shutting down is debug.
type raftLogSink struct {
	logger *slog.Logger
	peers  logLimiter // the lines about one peer
	// members is the node's raft once it runs: it names the peer behind
	// an address, so that every line about one peer counts under its id.
	members atomic.Pointer[raft.Raft]
	// handingOff is set once the node hands its leadership over
	// (Server.Shutdown): the newer term a peer then answers with is the
	// one asked for.
	handingOff atomic.Bool
	// foundingFrom and foundingLast are when peers began, and last,
	// refused this node's raft connections as not founded yet (UnixNano;
	// a pause of founderPause begins a new spell): this node's elections
	// fail meanwhile for want of their votes, as a matter of course.
	foundingFrom, foundingLast atomic.Int64
}

// peerLines are raft's lines about a peer it failed to reach, and the
// argument that names the peer.
var peerLines = map[string]string{
	"failed to appendEntries to":              "peer",
	"failed to heartbeat to":                  "peer",
	"failed to pipeline appendEntries":        "peer",
	"failed to start pipeline replication to": "peer",
	"failed to send snapshot to":              "peer",
	"failed to make requestVote RPC":          "target",
	"failed to contact":                       "server-id",
}

func (s *raftLogSink) Accept(name string, level hclog.Level, msg string, args ...any) {
	if level < hclog.Warn {
		return
	}
	if key, ok := peerLines[msg]; ok {
		s.peerLine(name, msg, s.peerID(arg(args, key)), args)
		return
	}
	err, _ := arg(args, "error").(error)
	attrs := append([]any{"component", name}, args...)
	switch {
	case level == hclog.Warn && (routineWarning(msg, args) || msg == "Election timeout reached, restarting election" && s.peerFounding()):
		s.logger.Log(context.Background(), slog.LevelInfo, msg, attrs...)
	case level == hclog.Warn:
		s.logger.Log(context.Background(), slog.LevelWarn, msg, attrs...)
	case msg == "peer has newer term, stopping replication" && s.handingOff.Load():
		s.logger.Log(context.Background(), slog.LevelInfo, msg, attrs...)
	case msg == "peer has newer term, stopping replication":
		// A leader superseded without asking (a partition healed, a
		// member that campaigned on its own): it steps down, which is
		// not an error of its own.
		s.logger.Log(context.Background(), slog.LevelWarn, msg, attrs...)
	case errors.Is(err, raft.ErrTransportShutdown):
		s.logger.Log(context.Background(), slog.LevelDebug, msg, attrs...) // this node closing
	case msg == "failed to decode incoming command" && connectionFailed(err):
		// A peer went away in the middle of a command: it is down, or
		// restarting, and the lines about reaching it say so.
		s.peers.log(s.logger, slog.LevelWarn, "incoming", msg, attrs...)
	default:
		s.logger.Log(context.Background(), slog.LevelError, msg, attrs...)
	}
}

// founderPause is how long after a peer's last refusal as not founded
// yet a spell of them ends.
const founderPause = 10 * time.Second

// founderSeen notes a peer's refusal as not founded yet.
func (s *raftLogSink) founderSeen() {
	now := time.Now().UnixNano()
	if last := s.foundingLast.Swap(now); last == 0 || now-last > int64(founderPause) {
		s.foundingFrom.Store(now)
	}
}

// peerFounding reports whether peers refuse this node's raft connections
// as not founded yet: one did within founderPause, in a spell that began
// less than foundingGrace ago (a founder takes no longer, and a peer
// refuses no longer as founding).
func (s *raftLogSink) peerFounding() bool {
	now := time.Now().UnixNano()
	last, from := s.foundingLast.Load(), s.foundingFrom.Load()
	return last != 0 && now-last < int64(founderPause) && now-from < int64(foundingGrace)
}

// peerLine logs one of raft's lines about a peer it failed to reach.
func (s *raftLogSink) peerLine(name, msg, peer string, args []any) {
	attrs := append([]any{"component", name, "peer_id", peer, "raft", msg}, args...)
	err, _ := arg(args, "error").(error)
	var refused *raftRefusedError
	if errors.As(err, &refused) && refused.founding {
		s.founderSeen()
		s.peers.log(s.logger, slog.LevelInfo, "founding:"+peer, "peer has not founded the group yet", attrs...)
		return
	}
	if errors.As(err, &refused) {
		s.peers.log(s.logger, slog.LevelError, "refused:"+peer, "peer refuses this node's raft connections", attrs...)
		return
	}
	s.peers.log(s.logger, slog.LevelWarn, "unreachable:"+peer, "peer unreachable", attrs...)
}

// peerBack logs that raft reaches peer again, if it was logged as
// unreachable or refusing, with the lines held back since, and lets the
// next trouble with it be logged at once.
func (s *raftLogSink) peerBack(peer raft.ServerID) {
	since, down, wasDown := s.peers.forget("unreachable:" + string(peer))
	refusedSince, refused, wasRefused := s.peers.forget("refused:" + string(peer))
	s.peers.forget("founding:" + string(peer))
	if !wasDown && !wasRefused || s.logger == nil {
		return
	}
	if !wasDown || wasRefused && refusedSince.Before(since) {
		since = refusedSince
	}
	s.logger.Info("peer reachable again", "component", "raft", "peer_id", string(peer),
		"after", s.peers.now().Sub(since).Round(time.Millisecond), "suppressed", down+refused)
}

// observeRaft registers an observer of r's observations whose data is a
// T, and returns their channel and stop, which deregisters the observer.
// The observer never blocks raft: observations that do not fit in the
// channel's buffer of 16 are dropped.
func observeRaft[T any](r *raft.Raft) (observations <-chan raft.Observation, stop func()) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(T)
		return ok
	})
	r.RegisterObserver(obs)
	return ch, func() { r.DeregisterObserver(obs) }
}

// watchPeersBack tells the raft log sink of each peer that answers the
// leader's heartbeats again after failing them (peerBack), until the
// server closes.
func (s *Server) watchPeersBack() {
	defer s.wg.Done()
	ch, stop := observeRaft[raft.ResumedHeartbeatObservation](s.node.raft)
	defer stop()
	for {
		select {
		case <-s.done:
			return
		case o := <-ch:
			s.node.raftLog.peerBack(o.Data.(raft.ResumedHeartbeatObservation).PeerID)
		}
	}
}

// peerID names the peer that one of raft's arguments designates: by id,
// where raft gives only its address and the configuration names it.
func (s *raftLogSink) peerID(v any) string {
	switch p := v.(type) {
	case raft.Server:
		return string(p.ID)
	case raft.ServerID:
		return string(p)
	case raft.ServerAddress:
		if r := s.members.Load(); r != nil {
			for _, srv := range r.GetConfiguration().Configuration().Servers {
				if srv.Address == p {
					return string(srv.ID)
				}
			}
		}
		return string(p)
	}
	return fmt.Sprint(v)
}

// arg returns the value of raft's argument key, nil if there is none.
func arg(args []any, key string) any {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == key {
			return args[i+1]
		}
	}
	return nil
}

// connectionFailed reports whether err is a connection that failed under
// a read or a write: reset, closed, cut short. raft's decoder reports the
// failure as its cause (msgpack's errors have Cause, not Unwrap).
func connectionFailed(err error) bool {
	for err != nil {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
			errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
			return true
		}
		c, ok := err.(interface{ Cause() error })
		if !ok {
			return false
		}
		err = c.Cause()
	}
	return false
}

// routineWarning reports whether raft's warning is the normal course of
// a group's life, to be logged as info: the election that opens a node's
// start (no leader was known yet: not a leader gone silent), a follower
// behind the leader's log (a member that joined, or restarted: the leader
// sends it older entries, or a snapshot) and the leader's side of it, and
// a pre-vote or a vote refused because the voter still hears from a leader
// (a node that lost touch, or restarted slowly, kept from disrupting the
// group: raft asks with a vote when it asks without pre-vote), and one
// refused because the candidate's log is behind the voter's (a node slow
// to hear of the election that opened a group's start, or back from a
// pause: the voter keeps raft's rule, and etcd logs the same at info),
// and a node with no configuration yet not standing for election (one
// that waits to be bootstrapped with the founders, or added to a group:
// the node says which in its own log, and in /status).
func routineWarning(msg string, args []any) bool {
	switch msg {
	case "heartbeat timeout reached, starting election":
		return fmt.Sprint(arg(args, "last-leader-id")) == ""
	case "failed to get previous log":
		err, _ := arg(args, "error").(error)
		return errors.Is(err, raft.ErrLogNotFound)
	case "appendEntries rejected, sending older logs", "rejecting pre-vote request since we have a leader",
		"rejecting vote request since we have a leader",
		"rejecting pre-vote request since our last term is greater", "rejecting vote request since our last term is greater",
		"rejecting pre-vote request since our last index is greater", "rejecting vote request since our last index is greater",
		"no known peers, aborting election":
		return true
	}
	return false
}
