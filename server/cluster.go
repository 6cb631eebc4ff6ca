package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/rpcerr"
)

// AddMember implements fencev1connect.ClusterServiceHandler.
func (s *Server) AddMember(ctx context.Context, req *connect.Request[fencev1.AddMemberRequest]) (*connect.Response[fencev1.AddMemberResponse], error) {
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
	var f raft.IndexFuture
	if m.GetNonvoter() {
		f = s.node.raft.AddNonvoter(id, addr, 0, s.cfg.ApplyTimeout)
	} else {
		f = s.node.raft.AddVoter(id, addr, 0, s.cfg.ApplyTimeout)
	}
	if err := f.Error(); err != nil {
		return nil, s.membershipError(err)
	}
	s.logger.Info("member added", "id", id, "raft", addr, "voter", !m.GetNonvoter())
	return connect.NewResponse(&fencev1.AddMemberResponse{}), nil
}

// RemoveMember implements fencev1connect.ClusterServiceHandler.
func (s *Server) RemoveMember(ctx context.Context, req *connect.Request[fencev1.RemoveMemberRequest]) (*connect.Response[fencev1.RemoveMemberResponse], error) {
	id := req.Msg.GetId()
	if err := checkText("member id", id, 128, true); err != nil {
		return nil, err
	}
	if !s.leaderReady.Load() {
		return nil, s.notReady()
	}
	known := false
	for _, srv := range s.members() {
		known = known || string(srv.ID) == id
	}
	if !known {
		return nil, invalid("%q is not a member of the group", id)
	}
	if err := s.node.raft.RemoveServer(raft.ServerID(id), 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return nil, s.membershipError(err)
	}
	// Forget where it served, so that nobody is pointed at it.
	_, _ = s.apply(&fsmpb.Command{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: id}}})
	s.logger.Info("member removed", "id", id)
	return connect.NewResponse(&fencev1.RemoveMemberResponse{}), nil
}

// RegisterNode implements fencev1connect.ClusterServiceHandler.
func (s *Server) RegisterNode(ctx context.Context, req *connect.Request[fencev1.RegisterNodeRequest]) (*connect.Response[fencev1.RegisterNodeResponse], error) {
	m := req.Msg
	if err := checkText("node id", m.GetId(), 128, true); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(m.GetApiAddress()); err != nil {
		return nil, invalid("api_address %q: want host:port", m.GetApiAddress())
	}
	member := false
	for _, srv := range s.members() {
		member = member || string(srv.ID) == m.GetId()
	}
	if !member {
		return nil, invalid("%q is not a member of the group", m.GetId())
	}
	if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: m.GetId(), ApiAddress: m.GetApiAddress()}}}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&fencev1.RegisterNodeResponse{}), nil
}

// registerLoop keeps this node's API address registered: a leader writes
// it itself, a follower asks the leader to. It checks every interval.
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
		var have, leaderAPI string
		_, leaderID := s.node.raft.LeaderWithID()
		s.fsm.Read(func(st *fsm.State) {
			have, _ = st.NodeAPI(s.cfg.NodeID)
			leaderAPI, _ = st.NodeAPI(string(leaderID))
		})
		if have == s.advertise || leaderID == "" {
			continue
		}
		if s.leaderReady.Load() {
			s.registerSelf()
			continue
		}
		if leaderAPI == "" || string(leaderID) == s.cfg.NodeID {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		c := fencev1connect.NewClusterServiceClient(s.peerAPIClient, s.apiScheme()+leaderAPI)
		_, err := c.RegisterNode(ctx, connect.NewRequest(&fencev1.RegisterNodeRequest{Id: s.cfg.NodeID, ApiAddress: s.advertise}))
		cancel()
		if err != nil {
			s.logger.Debug("registering with the leader", "leader", leaderAPI, "err", err)
		}
	}
}

func (s *Server) membershipError(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrRaftShutdown) {
		return s.node.raftError(err)
	}
	return fmt.Errorf("%w: changing membership: %v", fence.ErrUnavailable, err)
}

func (s *Server) members() []raft.Server {
	f := s.node.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	return f.Configuration().Servers
}

// registerSelf records this node's API address in the replicated state,
// once it leads, so that followers can point clients here.
func (s *Server) registerSelf() {
	var have string
	s.fsm.Read(func(st *fsm.State) { have, _ = st.NodeAPI(s.cfg.NodeID) })
	if have == s.advertise {
		return
	}
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_RegisterNode{RegisterNode: &fsmpb.RegisterNode{NodeId: s.cfg.NodeID, ApiAddress: s.advertise}}})
	if err != nil {
		select {
		case <-s.done: // shutting down: not worth a warning
			s.logger.Debug("registering this node's API address", "err", err)
		default:
			s.logger.Warn("registering this node's API address", "err", err)
		}
	}
}

// leaderHint adds the leader's API address to an Unavailable error, so
// that clients (and people) know where to go.
func (s *Server) leaderHint(err error) error {
	if err == nil || !errors.Is(err, fence.ErrUnavailable) {
		return err
	}
	var de *rpcerr.DetailError
	if errors.As(err, &de) {
		return err
	}
	api := s.leaderAPI()
	if api == "" {
		return err
	}
	return &rpcerr.DetailError{Err: fmt.Errorf("%w (its API: %s)", err, api), Detail: rpcerr.Detail{LeaderAddress: api}}
}

// leaderAPI returns the API address of the leader this node knows of, or
// "" when it knows none, does not know its address, or is the leader.
func (s *Server) leaderAPI() string {
	_, id := s.node.leader()
	if id == "" || string(id) == s.cfg.NodeID {
		return ""
	}
	var api string
	s.fsm.Read(func(st *fsm.State) { api, _ = st.NodeAPI(string(id)) })
	return api
}

// apiScheme is the scheme of the nodes' API URLs.
func (s *Server) apiScheme() string {
	if s.cfg.TLS != nil {
		return "https://"
	}
	return "http://"
}

// newPeerAPIClient returns the HTTP client a node calls other nodes' APIs
// with (see peerAPITLS).
func newPeerAPIClient(cfg Config) *http.Client {
	if cfg.TLS == nil {
		return http.DefaultClient
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: peerAPITLS(cfg)}}
}

// peerAPITLS is the TLS a node dials other nodes' APIs with, nil without
// TLS: it trusts cfg.TLS.RootCAs (nil: the system's) and presents the
// node's own certificate.
func peerAPITLS(cfg Config) *tls.Config {
	if cfg.TLS == nil {
		return nil
	}
	return &tls.Config{RootCAs: cfg.TLS.RootCAs, Certificates: cfg.TLS.Certificates, MinVersion: tls.VersionTLS12}
}
