package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/hashicorp/raft"
)

// A member whose data dir was lost comes back with no data and a new
// incarnation. It may not take part as the member it was (admit.go), nor
// found a group of its own (bootstrap.go); with AutoRejoin on the group's
// leader, it asks to be added again, and the leader does what an operator
// would: removes the member and adds it back as a new one, which catches
// up from the group before it votes.

// serveRejoins makes this node answer rejoin requests.
func (s *Server) serveRejoins() {
	h := s.rejoin
	s.node.rejoins.Store(&h)
}

// rejoin answers a member asking to be added again. The leader adds it
// again only when the node at the member's address is the one asking (same
// incarnation) and holds no data, and the group keeps a reachable quorum
// without it; the adding goes on after the answer.
func (s *Server) rejoin(req rejoinRequest) rejoinAnswer {
	refuse := func(format string, args ...any) rejoinAnswer {
		return rejoinAnswer{Refused: fmt.Sprintf(format, args...)}
	}
	if !s.cfg.AutoRejoin {
		return refuse("the group does not add members again by itself (--auto-rejoin=false): ask an operator to run fence members remove %s, then fence members add", req.ID)
	}
	if !s.leaderReady.Load() {
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
	switch {
	case err != nil:
		s.rejoining.end(req.ID)
		return refuse("the member's address %s does not answer: %v", srv.Address, err)
	case h.Incarnation != req.Incarnation || h.LastIndex > 0:
		s.rejoining.end(req.ID)
		return refuse("the node at the member's address %s is not the one asking, or holds data: another node may use id %s", srv.Address, req.ID)
	}
	if srv.Suffrage == raft.Voter {
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
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.rejoining.end(req.ID)
		if err := s.addAgain(srv); err != nil {
			s.logger.Warn("adding a member again failed", "member", req.ID, "err", err)
		}
	}()
	return rejoinAnswer{Accepted: true}
}

// addAgain removes member srv and adds it back at the same address, as
// a voter once it has caught up if it was one.
func (s *Server) addAgain(srv raft.Server) error {
	if err := s.node.raft.RemoveServer(srv.ID, 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return s.membershipError(err)
	}
	if err := s.node.raft.AddNonvoter(srv.ID, srv.Address, 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return s.membershipError(err)
	}
	s.logger.Info("member whose data dir was lost added again, as a non-voter", "member", srv.ID, "raft", srv.Address)
	if srv.Suffrage != raft.Voter {
		return nil
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
			s.logger.Info("the group's leader adds this node again; it catches up from the group", "leader", id)
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
