package fsm

import (
	"fmt"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

func (s *State) registerNode(c *fsmpb.RegisterNode) Result {
	if c.GetNodeId() == "" {
		return Result{Err: fmt.Errorf("%w: node id is empty", fence.ErrInvalidArgument)}
	}
	if c.GetApiAddress() == "" {
		delete(s.nodes, c.GetNodeId())
	} else {
		s.nodes[c.GetNodeId()] = c.GetApiAddress()
	}
	return Result{}
}

// rejoinMember records, or with done forgets, that the leader adds
// member c.MemberId again at c.RaftAddress (fsmpb.RejoinMember).
func (s *State) rejoinMember(c *fsmpb.RejoinMember) Result {
	switch {
	case c.GetMemberId() == "":
		return Result{Err: fmt.Errorf("%w: member id is empty", fence.ErrInvalidArgument)}
	case c.GetDone():
		delete(s.rejoins, c.GetMemberId())
	case c.GetRaftAddress() == "":
		return Result{Err: fmt.Errorf("%w: member %s is added again at no raft address", fence.ErrInvalidArgument, c.GetMemberId())}
	default:
		s.rejoins[c.GetMemberId()] = c.GetRaftAddress()
	}
	return Result{}
}

// Rejoin returns the raft address at which member id is being added
// again, if it is (fsmpb.RejoinMember).
func (s *State) Rejoin(id string) (string, bool) {
	addr, ok := s.rejoins[id]
	return addr, ok
}

// Rejoins returns every member being added again with its raft address,
// in id order.
func (s *State) Rejoins() [][2]string { return pairs(s.rejoins) }

// NodeAPI returns where the node with the given id serves its API, if it
// has registered.
func (s *State) NodeAPI(id string) (string, bool) {
	addr, ok := s.nodes[id]
	return addr, ok
}

// Nodes returns every registered node id with its API address, in id order.
func (s *State) Nodes() [][2]string { return pairs(s.nodes) }

// pairs returns m's keys with their values, in key order.
func pairs(m map[string]string) [][2]string {
	out := make([][2]string, 0, len(m))
	for _, id := range sortedKeys(m) {
		out = append(out, [2]string{id, m[id]})
	}
	return out
}
