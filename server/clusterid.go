package server

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/rpcerr"
)

// clusterName is the group's id as this node last read it from its state
// (docs/design.md, "One group per client"). Once a group is named its id
// never changes, so the id is read from the state only until it is known,
// and again after a snapshot restore.
type clusterName struct{ id atomic.Pointer[string] }

func (c *clusterName) get(read func(func(*fsm.State))) string {
	if p := c.id.Load(); p != nil {
		return *p
	}
	var id string
	read(func(st *fsm.State) { id = st.ClusterID() })
	if id != "" {
		c.id.Store(&id)
	}
	return id
}

// forget drops the id read, for a state replaced by a snapshot.
func (c *clusterName) forget() { c.id.Store(nil) }

func (s *Server) clusterID() string { return s.cluster.get(s.fsm.Read) }

// nameCluster commits the group's id, for a group whose state has none:
// the id its data dir was given when the group was bootstrapped, or a
// random one for a group from before identities or restored from a
// snapshot. Only a ready leader's state is current enough to say there is
// none; a SetClusterID that loses a race with another changes nothing.
func (s *Server) nameCluster() error {
	if s.clusterID() != "" {
		return nil
	}
	id := s.ident.groupID()
	if id == "" {
		id = rand.Text()
	}
	if _, _, err := s.node.propose(&fsmpb.Command{Op: &fsmpb.Command_SetClusterId{SetClusterId: &fsmpb.SetClusterID{Id: id}}}); err != nil {
		return fmt.Errorf("naming the cluster: %w", err)
	}
	s.logger.Info("named the cluster", "cluster_id", s.clusterID())
	return nil
}

// checkCluster puts the group's id on every answer, and refuses, before
// anything else sees it, a call that names another group: the client's
// endpoints mix two groups, and acting on the call would mix their locks.
func (s *Server) checkCluster(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := s.clusterID()
		if id != "" {
			w.Header().Set(fencev1.ClusterIDHeader, id)
		}
		if want := r.Header.Get(fencev1.ClusterIDHeader); want != "" && id != "" && want != id {
			errs.Write(w, r, rpcerr.ToConnect(fmt.Errorf("%w: node %s belongs to cluster %s, and the call is for cluster %s; "+
				"the client's endpoints name nodes of two groups", fence.ErrWrongCluster, s.cfg.NodeID, id, want)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// learnGroup records the group's id from the state in the data dir's
// identity, when the identity has none yet: the node then refuses other
// groups' nodes (admit.go); and that the data dir holds the group's raft
// data (noteHeldData). An identity that names another group than the
// state is a data dir mixed up with another group's, said loudly.
func (s *Server) learnGroup() {
	id := s.clusterID()
	if id == "" {
		return
	}
	if err := s.ident.adopt(id); err != nil {
		s.bootstrapLogs.log(s.logger, slog.LevelError, "group mismatch", "the data dir's identity and its state name different groups", "err", err)
		return
	}
	s.noteHeldData()
}
