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
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// A member whose data dir was lost comes back with no data and a new
// incarnation. It may not take part as the member it was (admit.go), nor
// found a group of its own (bootstrap.go); with AutoRejoin on the group's
// leader, it asks to be added again, and the leader does what an operator
// would (docs/design.md, Rejoin): it records in the replicated state that
// it adds the member again (RejoinMember), removes it from the
// configuration, adds it back as a new member, a non-voter, and makes it a
// voter once it has caught up. The node keeps asking, across its restarts
// and leader changes, until a leader says it counts it as a voter (its
// identity records that it asked, and its hello says so); each request,
// and each leader that finds a member asking or recorded, takes the work
// up where it stands.
//
// Why remove first: the node must receive no part of the group's log
// before a configuration in which it does not vote is committed. A node
// that holds data takes raft connections that count it a voter (admit),
// and raft replicates to a member as soon as a configuration naming it is
// appended, committed or not. Demoted in place, the node could get a
// prefix of the log while the demotion was not yet committed; were the
// leader then lost, a peer lacking an entry the node had acknowledged
// before it lost its data could be elected with the node's vote. Removed,
// it gets nothing until the removal is committed (raft appends the next
// configuration only then), and a removal committed by a majority of the
// voters without it leaves its vote unable to make a quorum with anyone
// who lacks an entry.

// rejoinPoll is how often a node that asked to be added again asks again.
const rejoinPoll = time.Second

// serveRejoins makes this node answer rejoin requests.
func (s *Server) serveRejoins() {
	h := s.rejoin
	s.node.rejoins.Store(&h)
}

// rejoin answers a member asking to be added again. The leader takes the
// request only from the node at the member's address (same incarnation),
// and from a node that is no member only while the replicated state
// records that it is being added again. A voter that holds data is told
// that it is one once the configuration that says so is committed: that
// is the only word by which the node stops asking (its own configuration
// may lag the group's). Otherwise the leader takes the steps where they
// stand (addAgain), after the answer.
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
		addr, recorded := s.rejoinRecord(id)
		if !recorded {
			return refuse("%s is not a member of group %s: add it with fence members add", req.ID, s.ident.groupID())
		}
		srv.ID, srv.Address = id, raft.ServerAddress(addr)
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
	case known && srv.Suffrage == raft.Voter && h.LastIndex > 0:
		if !s.committedVoter(id) {
			return rejoinAnswer{Accepted: true} // it asks again once a configuration that counts it is committed
		}
		s.rejoinDone(id)
		return rejoinAnswer{Accepted: true, Voter: true}
	case !s.cfg.AutoRejoin:
		return refuse("the group does not add members again by itself (--auto-rejoin=false): ask an operator to run fence members remove %s, then fence members add", req.ID)
	case s.fsm.Protocol() < fsm.Protocol6:
		return refuse("the group runs protocol %d, and adds a member again by itself from protocol %d, once every member runs this version of fence: "+
			"until then, ask an operator to run fence members remove %s, then fence members add", s.fsm.Protocol(), fsm.Protocol6, req.ID)
	}
	if err := s.checkJoiner(h, srv.Address, known); err != nil {
		return refuse("%v", err)
	}
	remove := known && srv.Suffrage == raft.Voter
	if remove {
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
		if err := s.addAgain(srv, remove); err != nil {
			s.logger.Warn("adding a member again: not done yet; it asks again", "member", req.ID, "err", err)
		}
	}()
	return rejoinAnswer{Accepted: true}
}

// finishRejoins takes up, on the leader, the rejoin of each node that
// lost its data: the members whose hello (hellos[i] of members[i], nil: no
// answer) says it asked to be added again (or, a voter, that it waits
// with --join and no data) or whom the replicated state records as being added again, and
// that are no voters with data yet; and the nodes the record names that
// are no members (a leader lost between removing and adding one). A
// leader that began may be gone halfway, the node's own requests may not
// reach this leader (a member added by hand is none of its --peers), and
// a node wiped twice may not know it is rejoining: the record decides, so
// no operator is needed to finish what a lost leader began. It also drops
// the records of members that are voters with data again.
func (s *Server) finishRejoins(members []raft.Server, hellos []*nodeHello) {
	records := map[raft.ServerID]string{}
	for _, r := range s.rejoinRecords() {
		records[raft.ServerID(r[0])] = r[1]
	}
	asking := map[raft.ServerID]*nodeHello{}
	committed := s.configurationCommitted()
	for i, srv := range members {
		h := hellos[i]
		_, recorded := records[srv.ID]
		delete(records, srv.ID)
		switch {
		case h == nil || string(srv.ID) == s.cfg.NodeID:
		case srv.Suffrage == raft.Voter && h.LastIndex > 0:
			if committed {
				s.rejoinDone(srv.ID)
			}
		case h.Rejoining || recorded || h.Joining && srv.Suffrage == raft.Voter:
			// A voter here holds no data: a joiner that is one lost it.
			asking[srv.ID] = h
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, addr := range records { // recorded, and no members
		wg.Go(func() {
			if h, err := s.helloFrom(id, raft.ServerAddress(addr)); err == nil {
				mu.Lock()
				asking[id] = &h
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, h := range asking {
		if answer := s.rejoin(rejoinRequest{ID: h.ID, Incarnation: h.Incarnation}); answer.Refused != "" {
			s.logger.Debug("a member that lost its data is not being added again", "member", h.ID, "why", answer.Refused)
		}
	}
}

// rejoinRecord returns the raft address at which the replicated state
// records that member id is being added again, if it does.
func (s *Server) rejoinRecord(id raft.ServerID) (addr string, ok bool) {
	s.fsm.Read(func(st *fsm.State) { addr, ok = st.Rejoin(string(id)) })
	return addr, ok
}

// rejoinRecords returns every member the replicated state records as
// being added again, with its raft address.
func (s *Server) rejoinRecords() (out [][2]string) {
	s.fsm.Read(func(st *fsm.State) { out = st.Rejoins() })
	return out
}

// recordRejoin commits that member srv is being added again.
func (s *Server) recordRejoin(srv raft.Server) error {
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_RejoinMember{RejoinMember: &fsmpb.RejoinMember{MemberId: string(srv.ID), RaftAddress: string(srv.Address)}}})
	return err
}

// dropRejoinRecord commits that member id is no longer being added again,
// if the replicated state records that it is, and reports whether it did.
func (s *Server) dropRejoinRecord(id raft.ServerID) (bool, error) {
	if _, ok := s.rejoinRecord(id); !ok {
		return false, nil
	}
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_RejoinMember{RejoinMember: &fsmpb.RejoinMember{MemberId: string(id), Done: true}}})
	return err == nil, err
}

// rejoinDone drops the record of member id, which is a voter with data
// again; a failure is logged, and the next round of hellos drops it.
func (s *Server) rejoinDone(id raft.ServerID) {
	if _, err := s.dropRejoinRecord(id); err != nil {
		s.logger.Warn("dropping the record of a member added again", "member", id, "err", err)
	}
}

// rejoinStep names a step of adding a member again: a test can stop the
// leader at each (see rejoinFailpoint).
type rejoinStep string

const (
	rejoinTaken    rejoinStep = "taken"     // the leader took the request
	rejoinRecorded rejoinStep = "recorded"  // the replicated state records the rejoin
	rejoinRemoved  rejoinStep = "removed"   // the member is out of the configuration
	rejoinAdded    rejoinStep = "added"     // it is a member again, a non-voter
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

// addAgain adds member srv again: with remove set (a voter whose node
// holds no data) it records the rejoin and removes the member first; a
// member that is not in the configuration is added as a non-voter at the
// address recorded, unless the record was dropped meanwhile (an operator
// removed it); then the member is made a voter once it has caught up, and
// the record is dropped.
func (s *Server) addAgain(srv raft.Server, remove bool) error {
	if err := s.reachRejoinStep(rejoinTaken, srv.ID); err != nil {
		return err
	}
	if remove {
		if err := s.removeToAddAgain(srv); err != nil {
			return err
		}
	}
	if _, known := s.member(srv.ID); !known {
		if err := s.addNonvoterAgain(srv); err != nil {
			return err
		}
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
	if err := s.promoteAgain(srv); err != nil {
		return err
	}
	s.logger.Info("member added again is a voter again", "member", srv.ID)
	s.rejoinDone(srv.ID)
	_ = s.reachRejoinStep(rejoinPromoted, srv.ID) // done: nothing is left to stop
	return nil
}

// promoteAgain makes srv a voter, if it is still a non-voter member at its
// address: an operator may have removed it meanwhile (raft's AddVoter would
// add it back), or removed and added it elsewhere. A voter there already
// (an operator's add promoted it) is left as it is.
func (s *Server) promoteAgain(srv raft.Server) error {
	s.changing.Lock()
	defer s.changing.Unlock()
	now, known := s.member(srv.ID)
	switch {
	case !known || now.Address != srv.Address:
		return fmt.Errorf("%w: %s is no longer a member at %s (an operator removed or moved it meanwhile)", fence.ErrMembership, srv.ID, srv.Address)
	case now.Suffrage == raft.Voter:
		return nil
	}
	if err := s.node.await(s.node.raft.AddVoter(srv.ID, srv.Address, 0, s.cfg.ApplyTimeout)); err != nil {
		return s.membershipError(err)
	}
	return nil
}

// removeToAddAgain records that voter srv is being added again, then
// removes it from the configuration.
func (s *Server) removeToAddAgain(srv raft.Server) error {
	if err := s.recordRejoin(srv); err != nil {
		return err
	}
	if err := s.reachRejoinStep(rejoinRecorded, srv.ID); err != nil {
		return err
	}
	s.changing.Lock()
	err := s.node.await(s.node.raft.RemoveServer(srv.ID, 0, s.cfg.ApplyTimeout))
	s.changing.Unlock()
	if err != nil {
		return s.membershipError(err)
	}
	s.logger.Info("member whose data dir was lost is removed, to be added again as a new member", "member", srv.ID, "raft", srv.Address)
	return s.reachRejoinStep(rejoinRemoved, srv.ID)
}

// addNonvoterAgain adds srv, recorded as being added again and not a
// member, as a non-voter.
func (s *Server) addNonvoterAgain(srv raft.Server) error {
	s.changing.Lock()
	defer s.changing.Unlock()
	if _, ok := s.rejoinRecord(srv.ID); !ok {
		return fmt.Errorf("%w: %s was removed by an operator while it was being added again", fence.ErrMembership, srv.ID)
	}
	if err := s.node.await(s.node.raft.AddNonvoter(srv.ID, srv.Address, 0, s.cfg.ApplyTimeout)); err != nil {
		return s.membershipError(err)
	}
	s.logger.Info("member whose data dir was lost is added again, a non-voter until it has caught up", "member", srv.ID, "raft", srv.Address)
	return s.reachRejoinStep(rejoinAdded, srv.ID)
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
