package server

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/rpcerr"
)

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

// peerAPITLS is the TLS a node dials other nodes' APIs with, nil without
// TLS: it trusts cfg.TLS.RootCAs (nil: the system's) and presents the
// node's own certificate.
func peerAPITLS(cfg Config) *tls.Config {
	if cfg.TLS == nil {
		return nil
	}
	return &tls.Config{RootCAs: cfg.TLS.RootCAs, Certificates: cfg.TLS.Certificates, MinVersion: tls.VersionTLS12}
}
