package check

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/server"
)

// The wipe fault's fallback does what an operator does for a wiped member
// that its group does not add again by itself (--auto-rejoin=false): the
// member is still a voter, with no data, and fence members add alone
// leaves a voter as it is; so it removes the member first, then adds it,
// and says so. It used to run the add alone and report "made it a voter".
func TestAddByHandAddsAWipedVoterAgain(t *testing.T) {
	ctx := context.Background()
	peers := map[string]string{}
	for _, id := range []string{"n1", "n2", "n3"} {
		addr, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		peers[id] = addr
	}
	cfgs := map[string]server.Config{}
	nodes := map[string]*server.Server{}
	start := func(id string) {
		s, err := server.Start(cfgs[id])
		if err != nil {
			t.Fatalf("starting %s: %v", id, err)
		}
		t.Cleanup(func() { s.Close() })
		nodes[id] = s
	}
	for id, addr := range peers {
		cfg := server.DefaultConfig()
		cfg.NodeID, cfg.Peers, cfg.AutoRejoin = id, peers, false
		cfg.DataDir, cfg.Listen, cfg.RaftListen = t.TempDir(), "127.0.0.1:0", addr
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 200*time.Millisecond, 200*time.Millisecond
		cfgs[id] = cfg
		start(id)
	}
	r := &runner{}
	leader := func() *server.Server {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for _, s := range nodes {
				if st, err := statusOf(ctx, s.Addr()); err == nil && st.GetState() == "Leader" {
					return s
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no leader")
		return nil
	}
	var err error
	if r.clusterID, err = groupOf(ctx, []string{leader().Addr()}); err != nil {
		t.Fatal(err)
	}
	victim := "n1"
	if nodes[victim] == leader() {
		victim = "n2"
	}
	nodes[victim].Close()
	cfg := cfgs[victim]
	cfg.DataDir = t.TempDir()
	cfgs[victim] = cfg
	start(victim)
	var n *node
	for i, id := range []string{"n1", "n2", "n3"} {
		r.nodes = append(r.nodes, &node{r: r, index: i, id: id, api: nodes[id].Addr(), raft: peers[id]})
		r.cfg.Endpoints = append(r.cfg.Endpoints, nodes[id].Addr())
		if id == victim {
			n = r.nodes[i]
		}
	}
	if !r.countsAsVoter(ctx, leader().Addr(), victim) {
		t.Fatal("the wiped member is no voter before it is added by hand")
	}

	note := r.addByHand(ctx, n)
	if !strings.Contains(note, "fence members remove and add made it a voter") {
		t.Fatalf("addByHand says %q", note)
	}
	st, err := statusOf(ctx, n.api)
	if err != nil || st.GetClusterId() != r.clusterID || st.GetAppliedIndex() == 0 {
		t.Fatalf("added by hand, the wiped node holds no data of group %s: %v", r.clusterID, statusSummary(st, err))
	}
	if !r.countsAsVoter(ctx, leader().Addr(), victim) {
		t.Fatal("added by hand, the wiped node is no voter")
	}
}

func statusSummary(st interface {
	GetClusterId() string
	GetAppliedIndex() uint64
}, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("group %q, applied index %d", st.GetClusterId(), st.GetAppliedIndex())
}
