package check

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/server"
)

// startNode starts a node of a group of its own, stopped when t ends.
func startNode(t *testing.T) *server.Server {
	t.Helper()
	return fencetest.Start(t).Server
}

// A run whose endpoints name nodes of two groups would mix two histories,
// and report tokens granted twice and increments lost that neither group
// lost: the checker refuses to start it.
func TestGroupOfRefusesTwoGroups(t *testing.T) {
	ctx := context.Background()
	a, b := startNode(t), startNode(t)
	id, err := groupOf(ctx, []string{a.Addr()})
	if err != nil || id == "" {
		t.Fatalf("groupOf one node: %q, %v; want its group", id, err)
	}
	if _, err := groupOf(ctx, []string{a.Addr(), b.Addr()}); !errors.Is(err, fence.ErrWrongCluster) {
		t.Fatalf("groupOf nodes of two groups: %v, want ErrWrongCluster", err)
	}
}

// A node that answers for another group than the one the run began with (a
// wiped node that founded a second group would) is a violation; one that
// knows no group yet is not.
func TestOtherGroupIsAViolation(t *testing.T) {
	ctx := context.Background()
	a, b := startNode(t), startNode(t)
	groupA, err := groupOf(ctx, []string{a.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	seen := groupsOf(ctx, []string{"node a", "node b"}, []string{a.Addr(), b.Addr()})
	if len(seen) != 2 || seen[0].group != groupA || seen[1].group == "" || seen[1].group == groupA {
		t.Fatalf("groupsOf = %+v; want a in %s and b in a group of its own", seen, groupA)
	}
	vs := otherGroups(groupA, seen)
	if len(vs) != 1 || vs[0].Kind != ViolationOtherGroup || !strings.Contains(vs[0].Detail, "node b answers for group "+seen[1].group) {
		t.Fatalf("otherGroups = %+v; want one %s naming node b and its group", vs, ViolationOtherGroup)
	}
	if vs := otherGroups(groupA, []nodeGroup{{"node a", groupA}, {"node c", ""}}); len(vs) != 0 {
		t.Fatalf("a node that knows no group yet was reported: %+v", vs)
	}
}

// The foreign-add fault's check of the foreign node fails when that node
// no longer leads a group of its own alone: of another group, or not itself.
func TestLeadsAloneCanFail(t *testing.T) {
	ctx := context.Background()
	s := startNode(t)
	group, err := groupOf(ctx, []string{s.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{}
	f := &node{id: "fence1", api: s.Addr()}
	if why := r.leadsAlone(ctx, f, group); why != "" {
		t.Fatalf("a node alone in its group: %s", why)
	}
	if why := r.leadsAlone(ctx, f, "OTHER"); !strings.Contains(why, "answers for group "+group) {
		t.Fatalf("a node of another group than expected: %q", why)
	}
	if why := r.leadsAlone(ctx, &node{id: "n4", api: s.Addr()}, group); !strings.Contains(why, "not itself alone") {
		t.Fatalf("a group whose only member is another node: %q", why)
	}
}

// headerless serves s's API through a reverse proxy on loopback that drops
// the group's id from every answer's headers, as a node does on a Status
// answered while its first leader names the group (the id is read for the
// headers before it is known, and for the answer after), and as a proxy
// that passes on only the headers it knows does.
func headerless(t *testing.T, s *server.Server) string {
	t.Helper()
	target, err := url.Parse("http://" + s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		resp.Header.Del(fencev1.ClusterIDHeader)
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// The group a run begins with is the one each node's answer names, not
// the one its headers name: a Status answered without the header once made
// a run begin with no group at all, so that its workers named none and its
// end reported the node's own group as another one.
func TestGroupOfReadsTheAnswerNotItsHeaders(t *testing.T) {
	ctx := context.Background()
	a, b := startNode(t), startNode(t)
	want, err := groupOf(ctx, []string{a.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := groupOf(ctx, []string{headerless(t, a)}); got != want || err != nil {
		t.Fatalf("groupOf a node whose answers carry no group header: %q, %v; want %q", got, err, want)
	}
	if got, err := groupOf(ctx, []string{headerless(t, a), headerless(t, b)}); !errors.Is(err, fence.ErrWrongCluster) {
		t.Fatalf("groupOf nodes of two groups, without headers: %q, %v; want ErrWrongCluster", got, err)
	}
}

// A foreign-add fault that the run's end overtakes still asks the group and
// checks the foreign node, with a context of its own: its checks made with
// the run's, once it had ended, failed and were reported as a foreign
// node gone silent (a false foreign-member-accepted), or the fault was
// dropped.
func TestForeignAddOutlivesTheRunsEnd(t *testing.T) {
	node := fencetest.Start(t)
	r, _, err := newRunner(Config{Binary: FenceBinary, Endpoints: []string{node.Endpoint()}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.dataDir = t.TempDir()
	if r.clusterID, err = groupOf(context.Background(), r.cfg.Endpoints); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel() // the run's time is up as the fault begins
	ev := FaultEvent{Kind: FaultForeignAdd}
	if !r.addForeignNode(ended, &ev) {
		t.Fatal("the foreign-add fault was dropped")
	}
	if ev.Outcome != OutcomeRefused {
		t.Fatalf("the foreign-add fault's outcome: %q (%s), want %q", ev.Outcome, ev.Note, OutcomeRefused)
	}
	for _, v := range r.found {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
}

// A corrupt-follower fault that the run's end overtakes still waits for
// the damaged node to refuse its log: with the run's context, once it had
// ended, the wait gave up at once, and the refusal passed for a node that
// started on a log damaged in the middle (a false corruption-missed).
func TestCorruptFollowerOutlivesTheRunsEnd(t *testing.T) {
	ctx := context.Background()
	r, _, err := newRunner(Config{Binary: FenceBinary, Nodes: 3, DataDir: t.TempDir(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.stopAll()
	if err := r.startServers(ctx); err != nil {
		t.Fatal(err)
	}
	if r.clusterID, err = groupOf(ctx, r.cfg.Endpoints); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.WithEndpoints(r.cfg.Endpoints...), client.WithClusterID(r.clusterID))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 200 { // batches for the damage to stand before
		if _, err := c.KV().Put(ctx, fmt.Sprintf("k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// A seed whose draws pick a follower, then damage in the middle.
	for seed := uint64(1); ; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		if rng.IntN(2); rng.IntN(2) == 0 {
			r.rng = rand.New(rand.NewPCG(seed, 0x5eed))
			break
		}
	}
	ended, cancel := context.WithCancel(ctx)
	cancel() // the run's time is up as the fault begins
	ev := FaultEvent{Kind: FaultCorruptFollower}
	if !r.corruptFollower(ended, &ev) {
		t.Fatal("the corrupt-follower fault was dropped")
	}
	if !strings.HasSuffix(ev.Target, "(middle)") {
		t.Fatalf("the fault hit %s, want damage in the middle", ev.Target)
	}
	for _, v := range r.found {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
}
