package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Membership changes are safe even for an operator who errs
// (docs/design.md, Node-to-node calls and membership): a new member must
// answer at its raft address before it is added, joins as a non-voter,
// and becomes a voter only once its log has caught up; and no change
// leaves the voters without a quorum of reachable ones.

// helloTimeout bounds one hello to another node.
const helloTimeout = time.Second

// catchUpPoll is how often the leader asks a joining node how far its log goes.
const catchUpPoll = 50 * time.Millisecond

// maxCatchUp bounds how long AddMember waits for a new member to catch up
// when its caller sets no deadline.
const maxCatchUp = time.Minute

// AddMember implements fencev1connect.ClusterServiceHandler.
func (s handlers) AddMember(ctx context.Context, req *connect.Request[fencev1.AddMemberRequest]) (*connect.Response[fencev1.AddMemberResponse], error) {
	m := req.Msg
	if err := checkText("member id", m.GetId(), 128, true); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(m.GetRaftAddress()); err != nil {
		return nil, invalid("raft_address %q: want host:port", m.GetRaftAddress())
	}
	if !s.leaderReady.Load() {
		return nil, s.notReady()
	}
	id, addr := raft.ServerID(m.GetId()), raft.ServerAddress(m.GetRaftAddress())
	current, known := s.member(id)
	if known && current.Address != addr {
		return nil, invalid("%s is a member at %s already; remove it first to move it to %s", id, current.Address, addr)
	}
	if known && (current.Suffrage == raft.Voter || m.GetNonvoter()) {
		if err := s.checkVoterHoldsData(current); err != nil {
			return nil, err
		}
		return connect.NewResponse(&fencev1.AddMemberResponse{}), nil // nothing to do
	}
	h, err := s.helloFrom(id, addr)
	if err != nil {
		return nil, err
	}
	if err := s.checkJoiner(h, addr, known); err != nil {
		return nil, err
	}
	if !known {
		if err := s.node.raft.AddNonvoter(id, addr, 0, s.cfg.ApplyTimeout).Error(); err != nil {
			return nil, s.membershipError(err)
		}
		s.logger.Info("member added as a non-voter", "id", id, "raft", addr)
		s.registerMembers()
	}
	if m.GetNonvoter() {
		return connect.NewResponse(&fencev1.AddMemberResponse{}), nil
	}
	if err := s.awaitCatchUp(ctx, id, addr); err != nil {
		return nil, err
	}
	if err := s.checkQuorum(s.votersWith(id, addr), id); err != nil {
		return nil, fmt.Errorf("%w; %s stays a non-voter", err, id)
	}
	if err := s.node.raft.AddVoter(id, addr, 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return nil, s.membershipError(err)
	}
	s.logger.Info("member made a voter", "id", id, "raft", addr)
	return connect.NewResponse(&fencev1.AddMemberResponse{}), nil
}

// checkVoterHoldsData refuses to report as done the adding of a voter
// whose node answers that it holds no data (its data dir was lost): the
// voter is in the configuration, but not the member it was, and an
// operator who adds it by hand must hear that add alone does nothing.
// A node that does not answer is taken at its word as it was.
func (s *Server) checkVoterHoldsData(srv raft.Server) error {
	if srv.Suffrage != raft.Voter {
		return nil
	}
	h, err := s.helloFrom(srv.ID, srv.Address)
	if err != nil || h.LastIndex > 0 {
		return nil
	}
	how := fmt.Sprintf("run fence members remove %s, then fence members add %s %s", srv.ID, srv.ID, srv.Address)
	if s.cfg.AutoRejoin {
		how = "the group adds it again by itself once it asks (fence status shows it rejoining); to do it by hand, " + how
	}
	return fmt.Errorf("%w: %s is a voter already, but its node at %s holds no data (its data dir was lost), so it votes for nothing and stores nothing: %s",
		fence.ErrMembership, srv.ID, srv.Address, how)
}

// RemoveMember implements fencev1connect.ClusterServiceHandler.
func (s handlers) RemoveMember(ctx context.Context, req *connect.Request[fencev1.RemoveMemberRequest]) (*connect.Response[fencev1.RemoveMemberResponse], error) {
	id := req.Msg.GetId()
	if err := checkText("member id", id, 128, true); err != nil {
		return nil, err
	}
	if !s.leaderReady.Load() {
		return nil, s.notReady()
	}
	// An operator's removal ends a rejoin under way: the group does not
	// add the member again behind it.
	s.changing.Lock()
	defer s.changing.Unlock()
	rejoining, err := s.dropRejoinRecord(raft.ServerID(id))
	if err != nil {
		return nil, err
	}
	srv, known := s.member(raft.ServerID(id))
	if !known && rejoining {
		s.logger.Info("member being added again is no longer: an operator removed it", "id", id)
		return connect.NewResponse(&fencev1.RemoveMemberResponse{}), nil
	}
	if !known {
		return nil, invalid("%q is not a member of the group", id)
	}
	if srv.Suffrage == raft.Voter {
		var remaining []raft.Server
		for _, v := range s.voters() {
			if v.ID != srv.ID {
				remaining = append(remaining, v)
			}
		}
		if len(remaining) == 0 {
			return nil, fmt.Errorf("%w: %s is the group's only voter", fence.ErrMembership, id)
		}
		if err := s.checkQuorum(remaining, ""); err != nil {
			return nil, fmt.Errorf("%w; %s stays a member", err, id)
		}
	}
	if err := s.node.raft.RemoveServer(raft.ServerID(id), 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return nil, s.membershipError(err)
	}
	// Forget where it served, so that nobody is pointed at it.
	_, _ = s.apply(&fsmpb.Command{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: id}}})
	s.logger.Info("member removed", "id", id)
	return connect.NewResponse(&fencev1.RemoveMemberResponse{}), nil
}

// helloFrom asks the node at addr who it is, and refuses (ErrMembership)
// when nothing answers there or another node does.
func (s *Server) helloFrom(id raft.ServerID, addr raft.ServerAddress) (nodeHello, error) {
	h, err := s.node.links.askHello(s.dialAddress(id, addr), helloTimeout)
	if err != nil {
		return h, fmt.Errorf("%w: no fence node answers at %s (%v); start it with --join first, and check the address", fence.ErrMembership, addr, err)
	}
	if h.ID != string(id) {
		return h, fmt.Errorf("%w: the node at %s is %q, not %q", fence.ErrMembership, addr, h.ID, id)
	}
	return h, nil
}

// checkJoiner refuses (ErrMembership) to add the node whose hello is h:
// one of another group, one that holds data and is not of this group, or
// one that does not speak the group's protocol. known says whether the
// configuration names it already.
func (s *Server) checkJoiner(h nodeHello, addr raft.ServerAddress, known bool) error {
	mine := s.ident.groupID()
	switch {
	case h.Group != "" && mine != "" && h.Group != mine:
		return fmt.Errorf("%w: the node at %s (%s) belongs to group %s, and this group is %s; a node serves one group for life: "+
			"to move it here, start it with an empty data dir and --join, then add it", fence.ErrMembership, addr, h.ID, h.Group, mine)
	case !known && h.LastIndex > 0 && h.Group != mine:
		return fmt.Errorf("%w: the node at %s (%s) holds data (its log reaches index %d) of group %s, not of this one (%s); "+
			"only a node with an empty data dir, started with --join, can be added", fence.ErrMembership, addr, h.ID, h.LastIndex, groupName(h.Group), groupName(mine))
	case helloProtocol(h) < s.fsm.Protocol():
		return fmt.Errorf("%w: the node at %s (%s) speaks protocol %d, older than this group's %d: upgrade it to the group's version of fence first",
			fence.ErrMembership, addr, h.ID, helloProtocol(h), s.fsm.Protocol())
	}
	return nil
}

// dialAddress is where raft dials server id (see node.dialAddress).
func (s *Server) dialAddress(id raft.ServerID, addr raft.ServerAddress) raft.ServerAddress {
	return s.node.dialAddress(id, addr)
}

// awaitCatchUp waits until the new member's log holds every entry the
// leader had when the wait began (the entry that added it included), so
// that as a voter it can take part in commits at once. Its log must match
// the leader's, not only reach as far: its last entry is of the leader's
// term, which only this leader writes, so by raft's log matching every
// entry before it is the leader's too. It ends as soon as this node no
// longer leads that term: the member's last entry could then never be of
// it, and the wait would hold up, for its full length, the next leader's
// (or this node's next term's) promotion.
func (s *Server) awaitCatchUp(ctx context.Context, id raft.ServerID, addr raft.ServerAddress) error {
	target, term := s.node.raft.LastIndex(), s.node.raft.CurrentTerm()
	ctx, cancel := context.WithTimeout(ctx, maxCatchUp)
	defer cancel()
	var have uint64
	for {
		if !s.node.isLeader() || s.node.raft.CurrentTerm() != term {
			return s.membershipError(fmt.Errorf("%w: this node no longer leads term %d, in which %s was to catch up", raft.ErrLeadershipLost, term, id))
		}
		if h, err := s.helloFrom(id, addr); err == nil {
			have = h.LastIndex
			// A node from before terms were in hellos is caught up by index.
			if have >= target && (h.LastTerm == term || h.Protocol == 0) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s joined as a non-voter and has not caught up yet (its log is at %d, the leader's was at %d); it goes on catching up: add it again to make it a voter", fence.ErrMembership, id, have, target)
		case <-s.done:
			return fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
		case <-time.After(catchUpPoll):
		}
	}
}

// checkQuorum refuses (ErrMembership) a configuration whose voters would
// not have a quorum of reachable ones: this node, and every other voter
// that answers a hello at its address (known is taken as reachable, for
// it just answered).
func (s *Server) checkQuorum(voters []raft.Server, known raft.ServerID) error {
	var (
		mu          sync.Mutex
		wg          sync.WaitGroup
		unreachable []string
	)
	for _, v := range voters {
		if string(v.ID) == s.cfg.NodeID || v.ID == known {
			continue
		}
		wg.Go(func() {
			if _, err := s.helloFrom(v.ID, v.Address); err != nil {
				mu.Lock()
				unreachable = append(unreachable, string(v.ID))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	reachable, quorum := len(voters)-len(unreachable), len(voters)/2+1
	if reachable < quorum {
		return fmt.Errorf("%w: the group would have %d voters, of which %d are reachable (%v are not), fewer than the quorum of %d; it could not commit, or elect a leader",
			fence.ErrMembership, len(voters), reachable, unreachable, quorum)
	}
	return nil
}

// member returns the member id of the current configuration.
func (s *Server) member(id raft.ServerID) (raft.Server, bool) {
	for _, srv := range s.members() {
		if srv.ID == id {
			return srv, true
		}
	}
	return raft.Server{}, false
}

// voters returns the voters of the current configuration.
func (s *Server) voters() []raft.Server {
	var out []raft.Server
	for _, srv := range s.members() {
		if srv.Suffrage == raft.Voter {
			out = append(out, srv)
		}
	}
	return out
}

// votersWith returns the voters with id added as one.
func (s *Server) votersWith(id raft.ServerID, addr raft.ServerAddress) []raft.Server {
	return append(s.voters(), raft.Server{ID: id, Address: addr, Suffrage: raft.Voter})
}

// registerLoop keeps the members' API addresses in the replicated state,
// on the leader: it writes its own, and asks every other member over a
// node link at the member's raft address (see nodeLinkMux), every
// interval. Followers do nothing: only the leader writes.
func (s *Server) registerLoop(interval time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if s.leaderReady.Load() {
			s.registerSelf()
			s.registerMembers()
		}
	}
}

// registerMembers asks each other member for its hello, records the API
// addresses that changed, and moves the group to a newer protocol once
// every member speaks it.
func (s *Server) registerMembers() {
	members := s.members()
	hellos := make([]*nodeHello, len(members))
	var wg sync.WaitGroup
	for i, srv := range members {
		if string(srv.ID) == s.cfg.NodeID {
			h := s.node.hello()
			hellos[i] = &h
			continue
		}
		wg.Go(func() {
			h, err := s.node.links.askHello(s.dialAddress(srv.ID, srv.Address), helloTimeout)
			if err != nil || h.ID != string(srv.ID) {
				return
			}
			hellos[i] = &h
			s.registerAPI(h)
		})
	}
	wg.Wait()
	s.agreeProtocol(members, hellos)
	s.finishRejoins(members, hellos)
}

// registerAPI records where a member serves the API, if that changed.
func (s *Server) registerAPI(h nodeHello) {
	if _, _, err := net.SplitHostPort(h.API); err != nil {
		return
	}
	var have string
	s.fsm.Read(func(st *fsm.State) { have, _ = st.NodeAPI(h.ID) })
	if have == h.API {
		return
	}
	if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: h.ID, ApiAddress: h.API}}}); err != nil {
		s.logger.Debug("registering a member's API address", "member", h.ID, "err", err)
	}
}

// agreeProtocol moves the group to the newest protocol every member
// speaks (docs/design.md, "Versions in a group"), when each answered its
// hello (hellos[i] of members[i], nil: no answer) and that protocol is
// newer than the group's. While the group has not yet left its first
// protocol, a founder that does not answer counts with the protocol it
// spoke when it founded the group with this node; once the group has
// moved, a member may have been rolled back to the group's protocol since,
// and only its answer counts.
func (s *Server) agreeProtocol(members []raft.Server, hellos []*nodeHello) {
	common := fsm.Protocol
	first := s.fsm.Protocol() == fsm.Protocol1
	for i, h := range hellos {
		switch founded := s.ident.founderProtocol(string(members[i].ID)); {
		case h != nil:
			common = min(common, helloProtocol(*h))
		case first && founded > 0:
			common = min(common, founded)
		default:
			return
		}
	}
	have := s.fsm.Protocol()
	if common <= have {
		return
	}
	if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_SetProtocol{SetProtocol: &fsmpb.SetProtocol{Version: common}}}); err != nil {
		s.logger.Debug("moving the group to a newer protocol", "protocol", common, "err", err)
		return
	}
	s.logger.Info("the group moved to a newer protocol: every member speaks it", "protocol", common, "was", have)
}

// agreeFoundingProtocol moves a group still at its first protocol to the
// one its founders spoke when they founded it with this node, before this
// leader is ready, when every member is a founder: so that a new group's
// first calls find it (a txn needs protocol 5; the hellos would agree on
// it only after the leader is ready). A member that is no founder is
// heard first (agreeProtocol).
func (s *Server) agreeFoundingProtocol() error {
	if s.fsm.Protocol() != fsm.Protocol1 {
		return nil
	}
	common := fsm.Protocol
	for _, m := range s.members() {
		founded := s.ident.founderProtocol(string(m.ID))
		if founded == 0 {
			return nil
		}
		common = min(common, founded)
	}
	if common <= fsm.Protocol1 {
		return nil
	}
	if _, _, err := s.node.propose(&fsmpb.Command{Op: &fsmpb.Command_SetProtocol{SetProtocol: &fsmpb.SetProtocol{Version: common}}}); err != nil {
		return fmt.Errorf("moving a new group to its founders' protocol: %w", err)
	}
	return nil
}

// helloProtocol is the newest protocol a hello's node speaks.
func helloProtocol(h nodeHello) uint32 { return max(h.Protocol, fsm.Protocol1) }

// committedVoter reports whether this node leads, and its configuration
// counts member id as a voter, and that configuration is committed: read
// within one term of this node's leadership, in which its log only grows,
// so that the configuration read is the one whose commit is checked.
func (s *Server) committedVoter(id raft.ServerID) bool {
	term := s.node.raft.CurrentTerm()
	srv, known := s.member(id)
	committed := s.configurationCommitted()
	return known && srv.Suffrage == raft.Voter && committed && s.node.isLeader() && s.node.raft.CurrentTerm() == term
}

// configurationCommitted reports whether this node's latest configuration
// is committed. raft acts on a configuration as soon as it is appended;
// a leader vouches for one, to a member asking whether it votes, only once
// it is committed (an uncommitted one may be lost with the leader).
func (s *Server) configurationCommitted() bool {
	st := s.node.raft.Stats()
	return parseUint(st["commit_index"]) >= parseUint(st["latest_configuration_index"])
}
