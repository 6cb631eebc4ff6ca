package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
)

// A member whose data dir was lost comes back with no data and a new
// incarnation. It may not take part as the member it was (admit.go), nor
// found a group of its own (bootstrap.go); with AutoRejoin on the group's
// leader, it asks to be added again, and the leader does what an operator
// would, in steps that any later leader can take up: it demotes the member
// to a non-voter in one configuration change (the member never leaves the
// configuration), the node then catches up from the group, and the leader
// makes it a voter again. The node keeps asking, across its restarts and
// leader changes, until a leader says it is a voter (its identity records
// that it asked, and its hello says so), and each request takes up the
// step where it stands; a leader that finds such a member takes it up by
// itself too.

// rejoinPoll is how often a node that asked to be added again asks again.
const rejoinPoll = time.Second

// serveRejoins makes this node answer rejoin requests.
func (s *Server) serveRejoins() {
	h := s.rejoin
	s.node.rejoins.Store(&h)
}

// rejoin answers a member asking to be added again. The leader takes the
// request only from the node at the member's address (same incarnation):
// a voter that holds no data is demoted, once the group keeps a reachable
// quorum without it; a non-voter is made a voter again once it has caught
// up; and a voter that holds data is told that it is one, which is the
// only word by which the node stops asking (its own configuration may lag
// the group's: it may not hold its demotion yet). The steps go on after
// the answer.
func (s *Server) rejoin(req rejoinRequest) rejoinAnswer {
	refuse := func(format string, args ...any) rejoinAnswer {
		return rejoinAnswer{Refused: fmt.Sprintf(format, args...)}
	}
	if !s.leaderReady.Load() {
		if s.node.isLeader() {
			return refuse("%s was just elected and is not ready to change the group yet", s.cfg.NodeID)
		}
		_, leader := s.node.leader()
		return refuse("%s is not the leader (the leader is %q)", s.cfg.NodeID, leader)
	}
	id := raft.ServerID(req.ID)
	srv, known := s.member(id)
	if !known {
		return refuse("%s is not a member of group %s: add it with fence members add", req.ID, s.ident.groupID())
	}
	if !s.rejoining.begin(req.ID) {
		return rejoinAnswer{Accepted: true} // under way
	}
	taken := false
	defer func() {
		if !taken {
			s.rejoining.end(req.ID)
		}
	}()
	h, err := s.helloFrom(id, srv.Address)
	switch {
	case err != nil:
		return refuse("the member's address %s does not answer: %v", srv.Address, err)
	case h.Incarnation != req.Incarnation:
		return refuse("the node at the member's address %s is not the one asking: another node may use id %s", srv.Address, req.ID)
	case srv.Suffrage == raft.Voter && h.LastIndex > 0:
		return rejoinAnswer{Accepted: true, Voter: true}
	case !s.cfg.AutoRejoin:
		return refuse("the group does not add members again by itself (--auto-rejoin=false): ask an operator to run fence members remove %s, then fence members add", req.ID)
	}
	demote := srv.Suffrage == raft.Voter
	if demote {
		var rest []raft.Server
		for _, v := range s.voters() {
			if v.ID != id {
				rest = append(rest, v)
			}
		}
		if err := s.checkQuorum(rest, ""); err != nil {
			return refuse("%v", err)
		}
	}
	taken = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.rejoining.end(req.ID)
		if err := s.addAgain(srv, demote); err != nil {
			s.logger.Warn("adding a member again: not done yet; it asks again", "member", req.ID, "err", err)
		}
	}()
	return rejoinAnswer{Accepted: true}
}

// finishRejoins takes up, on the leader, the rejoin of each member whose
// hello (hellos[i] of members[i], nil: no answer) says that it lost its
// data and asked to be added again, and that is no voter with data yet: a
// leader that began it may be gone halfway, and the node's own requests
// may not reach this leader (a member added by hand is none of its
// --peers). So no operator is needed to finish what a lost leader began.
func (s *Server) finishRejoins(members []raft.Server, hellos []*nodeHello) {
	for i, srv := range members {
		h := hellos[i]
		if h == nil || !h.Rejoining || string(srv.ID) == s.cfg.NodeID || (srv.Suffrage == raft.Voter && h.LastIndex > 0) {
			continue
		}
		if answer := s.rejoin(rejoinRequest{ID: h.ID, Incarnation: h.Incarnation}); answer.Refused != "" {
			s.logger.Debug("a member asked to be added again, and is not being added", "member", h.ID, "why", answer.Refused)
		}
	}
}

// rejoinStep names a step of adding a member again: a test can stop the
// leader at each (see rejoinFailpoint).
type rejoinStep string

const (
	rejoinTaken    rejoinStep = "taken"     // the leader took the request
	rejoinDemoted  rejoinStep = "demoted"   // the member is a non-voter
	rejoinCaughtUp rejoinStep = "caught up" // its log matches the leader's
	rejoinPromoted rejoinStep = "promoted"  // it is a voter again
)

// rejoinHook is called as a leader reaches a step of adding member again.
type rejoinHook func(step rejoinStep, member raft.ServerID)

// reachRejoinStep calls the failpoint set by a test, if any, at step, and
// reports whether the leader goes on: not once it is shutting down.
func (s *Server) reachRejoinStep(step rejoinStep, member raft.ServerID) error {
	if f := s.rejoinFailpoint.Load(); f != nil {
		(*f)(step, member)
	}
	select {
	case <-s.done:
		return fmt.Errorf("%w: the node is shutting down (after the step %q)", fence.ErrUnavailable, step)
	default:
		return nil
	}
}

// addAgain demotes member srv to a non-voter if demote is set, then makes
// it a voter once it has caught up.
func (s *Server) addAgain(srv raft.Server, demote bool) error {
	if err := s.reachRejoinStep(rejoinTaken, srv.ID); err != nil {
		return err
	}
	if demote {
		if err := s.node.await(s.node.raft.DemoteVoter(srv.ID, 0, s.cfg.ApplyTimeout)); err != nil {
			return s.membershipError(err)
		}
		s.logger.Info("member whose data dir was lost is a non-voter until it has caught up", "member", srv.ID, "raft", srv.Address)
	}
	if err := s.reachRejoinStep(rejoinDemoted, srv.ID); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := s.awaitCatchUp(ctx, srv.ID, srv.Address); err != nil {
		return err
	}
	if err := s.reachRejoinStep(rejoinCaughtUp, srv.ID); err != nil {
		return err
	}
	if err := s.checkQuorum(s.votersWith(srv.ID, srv.Address), srv.ID); err != nil {
		return err
	}
	if err := s.node.await(s.node.raft.AddVoter(srv.ID, srv.Address, 0, s.cfg.ApplyTimeout)); err != nil {
		return s.membershipError(err)
	}
	s.logger.Info("member added again is a voter again", "member", srv.ID)
	_ = s.reachRejoinStep(rejoinPromoted, srv.ID) // done: nothing is left to stop
	return nil
}

// askToRejoin asks each of targets in turn to add this node again, until
// one takes the request (the leader), and returns that one's answer; a
// zero answer (not Accepted) when none took it.
func (s *Server) askToRejoin(targets []raft.Server) rejoinAnswer {
	req := rejoinRequest{ID: s.cfg.NodeID, Incarnation: s.ident.incarnation}
	var refusals []string
	for _, t := range targets {
		answer, err := s.node.links.askRejoin(s.dialAddress(t.ID, t.Address), req, helloTimeout)
		switch {
		case err == nil && answer.Accepted:
			return answer
		case err == nil:
			refusals = append(refusals, string(t.ID)+": "+answer.Refused)
		}
	}
	if len(refusals) > 0 {
		s.bootstrapLogs.log(s.logger, slog.LevelWarn, "rejoin:"+strings.Join(refusals, ";"), "asked to be added again, and was not", "answers", strings.Join(refusals, "; "))
	}
	return rejoinAnswer{}
}

// rejoinTargets are the nodes this node asks to add it again: the leader
// it knows of first, then the other members of its configuration, then
// its --peers (a member added by hand is no peer, and may lead).
func (s *Server) rejoinTargets() []raft.Server {
	var out []raft.Server
	seen := map[raft.ServerID]bool{raft.ServerID(s.cfg.NodeID): true}
	add := func(id raft.ServerID, addr raft.ServerAddress) {
		if id != "" && addr != "" && !seen[id] {
			seen[id] = true
			out = append(out, raft.Server{ID: id, Address: addr})
		}
	}
	if addr, id := s.node.leader(); id != "" {
		add(id, addr)
	}
	for _, m := range s.members() {
		add(m.ID, m.Address)
	}
	var peers []string
	for id := range s.cfg.Peers {
		peers = append(peers, id)
	}
	slices.Sort(peers)
	for _, id := range peers {
		add(raft.ServerID(id), raft.ServerAddress(s.cfg.Peers[id]))
	}
	return out
}

// peerServers returns the --peers named ids, with their raft addresses.
func (s *Server) peerServers(ids []string) []raft.Server {
	out := make([]raft.Server, 0, len(ids))
	for _, id := range ids {
		out = append(out, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(s.cfg.Peers[id])})
	}
	return out
}

// rejoinUntilVoter asks to be added again until the group's leader answers
// that it counts this node as a voter holding data, then forgets that it
// asked. The node's own configuration does not decide it, unless the node
// leads: a node that holds only part of the group's log, not yet the
// entry that made it a non-voter, finds itself a voter there, and a leader
// lost before it promoted the node left nobody to finish (docs/design.md,
// Rejoin). A leader's log holds every committed entry, so once it is a
// ready leader, its configuration is the group's word.
func (s *Server) rejoinUntilVoter() {
	defer s.wg.Done()
	for {
		if s.leadsAsVoter() || s.askToRejoin(s.rejoinTargets()).Voter {
			if err := s.ident.setRejoining(false); err != nil {
				s.logger.Warn("recording that this node is a voter again", "err", err)
			}
			s.logger.Info("this node is a voter of its group again")
			return
		}
		select {
		case <-s.done:
			return
		case <-time.After(rejoinPoll):
		}
	}
}

// leadsAsVoter reports whether this node is a ready leader whose
// configuration counts it as a voter (a voter again, elected since).
func (s *Server) leadsAsVoter() bool {
	srv, ok := s.member(raft.ServerID(s.cfg.NodeID))
	return s.leaderReady.Load() && ok && srv.Suffrage == raft.Voter
}

// startRejoin records that this node asked to be added again, and goes on
// asking until it is a voter; once per node.
func (s *Server) startRejoin() {
	if !s.rejoinStarted.CompareAndSwap(false, true) {
		return
	}
	if err := s.ident.setRejoining(true); err != nil {
		s.logger.Warn("recording that this node asked to be added again", "err", err)
	}
	s.logger.Info("the group's leader adds this node again; it catches up from the group, then votes again")
	s.wg.Add(1)
	go s.rejoinUntilVoter()
}

// rejoins tracks the members being added again, one at a time each.
type rejoins struct {
	mu    sync.Mutex
	under map[string]bool
}

func (r *rejoins) begin(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.under[id] {
		return false
	}
	if r.under == nil {
		r.under = map[string]bool{}
	}
	r.under[id] = true
	return true
}

func (r *rejoins) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.under, id)
}
