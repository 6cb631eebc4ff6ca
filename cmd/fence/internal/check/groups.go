package check

import (
	"context"
	"fmt"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// statusOf asks the node at api to describe itself, with a client of its
// own that names no group: a node of another group answers it too, where
// the run's clients would refuse it.
func statusOf(ctx context.Context, api string) (*fencev1.StatusResponse, error) {
	c, err := client.New(client.WithEndpoints(api))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.StatusOf(ctx, api)
}

// nodeGroup is the group a node answered for, "" while it knows none.
type nodeGroup struct {
	name, group string
}

// groupsOf asks each node (by API address; names name them in the
// violations) which group it answers for. A node that does not answer is
// left out: one that died is found by deadNodes.
func groupsOf(ctx context.Context, names, apis []string) []nodeGroup {
	var out []nodeGroup
	for i, api := range apis {
		if st, err := statusOf(ctx, api); err == nil {
			out = append(out, nodeGroup{name: names[i], group: st.GetClusterId()})
		}
	}
	return out
}

// otherGroups reports every node that answers for a group other than want,
// the group the run began with: a node that founded a second group (its
// data dir lost, say) could hand out the same tokens again. A node that
// knows no group yet (one that waits to be added again) is not one.
func otherGroups(want string, seen []nodeGroup) []Violation {
	var out []Violation
	for _, g := range seen {
		if g.group != "" && g.group != want {
			out = append(out, Violation{Kind: ViolationOtherGroup,
				Detail: fmt.Sprintf("%s answers for group %s; the run began with group %s", g.name, g.group, want)})
		}
	}
	return out
}

// checkGroups asks every node of the run, at its end, which group it
// answers for.
func (r *runner) checkGroups(ctx context.Context) []Violation {
	names := make([]string, len(r.cfg.Endpoints))
	for i, ep := range r.cfg.Endpoints {
		names[i] = "the node at " + ep
		if i < len(r.nodes) {
			names[i] = r.nodes[i].name()
		}
	}
	return otherGroups(r.clusterID, groupsOf(ctx, names, r.cfg.Endpoints))
}
