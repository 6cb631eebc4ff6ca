package fsm

import (
	"fmt"
	"sort"

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

// NodeAPI returns where the node with the given id serves its API, if it
// has registered.
func (s *State) NodeAPI(id string) (string, bool) {
	addr, ok := s.nodes[id]
	return addr, ok
}

// Nodes returns every registered node id with its API address, in id order.
func (s *State) Nodes() [][2]string {
	out := make([][2]string, 0, len(s.nodes))
	for _, id := range sortedNodeIDs(s.nodes) {
		out = append(out, [2]string{id, s.nodes[id]})
	}
	return out
}

func sortedNodeIDs(m map[string]string) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
