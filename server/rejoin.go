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
)

// A member whose data dir was lost comes back with no data and a new
// incarnation. It may not take part as the member it was (admit.go), nor
// found a group of its own (bootstrap.go); with AutoRejoin on the group's
// leader, it asks to be added again, and the leader does what an operator
// would, in steps that any later leader can take up: it demotes the member
// to a non-voter in one configuration change (the member never leaves the
// configuration), the node then catches up from the group, and the leader
// makes it a voter again. The node keeps asking, across its restarts and
// leader changes, until it is a voter (its identity records that it
// asked), and each request takes up the step where it stands.

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
// up. The steps go on after the answer.
func (s *Server) rejoin(req rejoinRequest) rejoinAnswer {
	refuse := func(format string, args ...any) rejoinAnswer {
		return rejoinAnswer{Refused: fmt.Sprintf(format, args...)}
	}
	if !s.cfg.AutoRejoin {
		return refuse("the group does not add members again by itself (--auto-rejoin=false): ask an operator to run fence members remove %s, then fence members add", req.ID)
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
	h, err := s.helloFrom(id, srv.Address)
	var demote bool
	switch {
	case err != nil:
		s.rejoining.end(req.ID)
		return refuse("the member's address %s does not answer: %v", srv.Address, err)
	case h.Incarnation != req.Incarnation:
		s.rejoining.end(req.ID)
		return refuse("the node at the member's address %s is not the one asking: another node may use id %s", srv.Address, req.ID)
	case srv.Suffrage == raft.Voter && h.LastIndex > 0:
		s.rejoining.end(req.ID)
		return refuse("%s is a voter with data already", req.ID)
	case srv.Suffrage == raft.Voter:
		var rest []raft.Server
		for _, v := range s.voters() {
			if v.ID != id {
				rest = append(rest, v)
			}
		}
		if err := s.checkQuorum(rest, ""); err != nil {
			s.rejoining.end(req.ID)
			return refuse("%v", err)
		}
		demote = true
	}
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

// addAgain demotes member srv to a non-voter if demote is set, then makes
// it a voter once it has caught up.
func (s *Server) addAgain(srv raft.Server, demote bool) error {
	if demote {
		if err := s.node.raft.DemoteVoter(srv.ID, 0, s.cfg.ApplyTimeout).Error(); err != nil {
			return s.membershipError(err)
		}
		s.logger.Info("member whose data dir was lost is a non-voter until it has caught up", "member", srv.ID, "raft", srv.Address)
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
	if err := s.checkQuorum(s.votersWith(srv.ID, srv.Address), srv.ID); err != nil {
		return err
	}
	if err := s.node.raft.AddVoter(srv.ID, srv.Address, 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return s.membershipError(err)
	}
	s.logger.Info("member added again is a voter again", "member", srv.ID)
	return nil
}

// askToRejoin asks each peer holding the group's data to add this node
// again; the leader among them takes it. It reports whether one did.
func (s *Server) askToRejoin(holders []string) bool {
	req := rejoinRequest{ID: s.cfg.NodeID, Incarnation: s.ident.incarnation}
	var refusals []string
	for _, id := range holders {
		addr := s.dialAddress(raft.ServerID(id), raft.ServerAddress(s.cfg.Peers[id]))
		answer, err := s.node.links.askRejoin(addr, req, helloTimeout)
		switch {
		case err == nil && answer.Accepted:
			return true
		case err == nil:
			refusals = append(refusals, id+": "+answer.Refused)
		}
	}
	if len(refusals) > 0 {
		s.bootstrapLogs.log(s.logger, slog.LevelWarn, "rejoin:"+strings.Join(refusals, ";"), "asked to be added again, and was not", "answers", strings.Join(refusals, "; "))
	}
	return false
}

// rejoinUntilVoter asks the peers to add this node again until the
// group's configuration makes it a voter, then forgets that it asked.
func (s *Server) rejoinUntilVoter() {
	defer s.wg.Done()
	var peers []string
	for id := range s.cfg.Peers {
		if id != s.cfg.NodeID {
			peers = append(peers, id)
		}
	}
	slices.Sort(peers)
	for {
		if srv, ok := s.member(raft.ServerID(s.cfg.NodeID)); ok && srv.Suffrage == raft.Voter && s.node.hasData() {
			if err := s.ident.setRejoining(false); err != nil {
				s.logger.Warn("recording that this node is a voter again", "err", err)
			}
			s.logger.Info("this node is a voter of its group again")
			return
		}
		s.askToRejoin(peers)
		select {
		case <-s.done:
			return
		case <-time.After(rejoinPoll):
		}
	}
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
