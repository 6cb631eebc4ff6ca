package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
)

// postJSON calls procedure on the node at addr the way curl does, with
// extra headers as name, value pairs.
func postJSON(t *testing.T, addr, procedure, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/fence.v1."+procedure, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

// A node names its group on every answer, refuses a call for another group
// without acting on it, and keeps its group's id across a restart.
func TestClusterIDRefusesCallsForAnotherGroup(t *testing.T) {
	s := startTestServer(t, nil)
	id := s.clusterID()
	if id == "" {
		t.Fatal("a ready leader has no cluster id")
	}
	resp, body := postJSON(t, s.Addr(), "SessionService/CreateSession", `{"ttl":"30s"}`, fencev1.ClusterIDHeader, "another-group")
	if resp.StatusCode == http.StatusOK || !strings.Contains(body, "failed_precondition") || !strings.Contains(body, "belongs to cluster "+id) {
		t.Errorf("CreateSession for another group: HTTP %d %s; want failed_precondition naming this node's group", resp.StatusCode, body)
	}
	if got := resp.Header.Get(fencev1.ClusterIDHeader); got != id {
		t.Errorf("the refusal names group %q, want %q", got, id)
	}
	var sessions int
	s.fsm.Read(func(st *fsm.State) { sessions = len(st.Sessions()) })
	if sessions != 0 {
		t.Fatalf("%d sessions after a refused CreateSession, want 0", sessions)
	}
	for _, header := range [][]string{{fencev1.ClusterIDHeader, id}, nil} {
		resp, body := postJSON(t, s.Addr(), "SessionService/CreateSession", `{"ttl":"30s"}`, header...)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(fencev1.ClusterIDHeader) != id {
			t.Errorf("CreateSession with header %q: HTTP %d %s, group %q; want 200 from group %q", header, resp.StatusCode, body, resp.Header.Get(fencev1.ClusterIDHeader), id)
		}
	}

	cfg := s.cfg
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if again := mustStart(t, cfg).clusterID(); again != id {
		t.Errorf("after a restart the group is %q, want %q", again, id)
	}
}

// Every node of a group answers with the group's id, and a follower that
// forwards a call answers with the leader's.
func TestClusterIDIsTheGroups(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	id := leader.clusterID()
	waitFor(t, "every node to know the group's id and the leader's address", func() bool {
		for _, n := range c.nodes {
			var api string
			n.fsm.Read(func(st *fsm.State) { api, _ = st.NodeAPI(leader.cfg.NodeID) })
			if n.clusterID() != id || api != leader.Addr() {
				return false
			}
		}
		return true
	})
	follower := c.followers(leader)[0]
	resp, body := postJSON(t, follower.Addr(), "SessionService/CreateSession", `{"ttl":"30s"}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Values(fencev1.ClusterIDHeader)[0] != id || len(resp.Header.Values(fencev1.ClusterIDHeader)) != 1 {
		t.Errorf("CreateSession through a follower: HTTP %d %s, group %q; want 200 from group %q, named once", resp.StatusCode, body, resp.Header.Values(fencev1.ClusterIDHeader), id)
	}
}
