package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/testutil/netproxy"
)

// testCluster is a raft group of real nodes in this process, talking raft
// over loopback TCP through a proxy per directed link.
type testCluster struct {
	t        testing.TB
	reserved map[string]net.Listener // raft ports held until their node starts
	ids      []string
	cfgs     map[string]Config
	nodes    map[string]*Server
	links    map[[2]string]*netproxy.Link // [from, to]
	mu       sync.Mutex
	editCfg  func(*Config)
}

// reserve picks a raft address for id and holds its port until id starts.
func (c *testCluster) reserve(id string) string {
	ln := listenBelowEphemeral(c.t)
	c.reserved[id] = ln
	return ln.Addr().String()
}

func startCluster(t testing.TB, n int, edit func(*Config)) *testCluster {
	c := newCluster(t, n, edit)
	for _, id := range c.ids {
		c.start(id)
	}
	c.leader()
	return c
}

// newCluster configures a group of n nodes, holding their raft ports, and
// starts none of them.
func newCluster(t testing.TB, n int, edit func(*Config)) *testCluster {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%d", i+1)
	}
	return newClusterOf(t, ids, edit)
}

// newClusterOf is newCluster with the nodes' ids.
func newClusterOf(t testing.TB, ids []string, edit func(*Config)) *testCluster {
	c := &testCluster{t: t, cfgs: map[string]Config{}, nodes: map[string]*Server{}, links: map[[2]string]*netproxy.Link{}, editCfg: edit, reserved: map[string]net.Listener{}}
	peers := map[string]string{}
	for _, id := range ids {
		c.ids = append(c.ids, id)
		peers[id] = c.reserve(id)
	}
	for _, id := range c.ids {
		cfg := c.baseConfig(id, peers[id])
		cfg.Peers = peers
		c.cfgs[id] = cfg
	}
	return c
}

func (c *testCluster) baseConfig(id, raftAddr string) Config {
	cfg := DefaultConfig()
	cfg.NodeID = id
	cfg.DataDir = c.t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = raftAddr
	cfg.HeartbeatTimeout = 300 * time.Millisecond
	cfg.ElectionTimeout = 300 * time.Millisecond
	cfg.ApplyTimeout = 3 * time.Second
	from := id
	cfg.RaftAddressProvider = addressProvider(func(to raft.ServerID) (raft.ServerAddress, error) {
		c.mu.Lock()
		_, known := c.cfgs[string(to)]
		c.mu.Unlock()
		if !known { // not one of the test's nodes: raft dials the address it was given
			return "", fmt.Errorf("no link to %s", to)
		}
		return raft.ServerAddress(c.link(from, string(to)).Addr()), nil
	})
	if c.editCfg != nil {
		c.editCfg(&cfg)
	}
	return cfg
}

// link returns the proxy from one node to another, made on first use.
func (c *testCluster) link(from, to string) *netproxy.Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]string{from, to}
	p, ok := c.links[key]
	if !ok {
		var err error
		if p, err = netproxy.Listen(c.cfgs[to].RaftListen); err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { p.Close() })
		c.links[key] = p
	}
	return p
}

type addressProvider func(raft.ServerID) (raft.ServerAddress, error)

func (f addressProvider) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) { return f(id) }

func (c *testCluster) start(id string) *Server {
	c.mu.Lock()
	if ln, ok := c.reserved[id]; ok {
		ln.Close()
		delete(c.reserved, id)
	}
	cfg := c.cfgs[id]
	c.mu.Unlock()
	s, err := Start(cfg)
	// Between the reservation's close and raft's bind, the kernel may lend
	// the port to another process's outgoing connection for a moment.
	for tries := 0; err != nil && errors.Is(err, syscall.EADDRINUSE) && tries < 40; tries++ {
		time.Sleep(50 * time.Millisecond)
		s, err = Start(cfg)
	}
	if err != nil {
		c.t.Fatalf("starting %s: %v", id, err)
	}
	c.t.Cleanup(func() { s.Close() })
	c.nodes[id] = s
	return s
}

// startJoiner starts a new node id with Join set, not yet a member of the
// group: the test adds it. It returns the node and its config.
func (c *testCluster) startJoiner(id string) (*Server, Config) {
	cfg := c.baseConfig(id, c.reserve(id))
	cfg.Join = true
	c.mu.Lock()
	c.cfgs[id] = cfg
	c.mu.Unlock()
	c.ids = append(c.ids, id)
	return c.start(id), cfg
}

func (c *testCluster) stop(id string) {
	if err := c.nodes[id].Close(); err != nil {
		c.t.Logf("closing %s: %v", id, err)
	}
	delete(c.nodes, id)
}

// restartFromSnapshots has every node take a snapshot, then stops every
// node and starts it again, so that each restores its state from its own
// snapshot.
func (c *testCluster) restartFromSnapshots() {
	c.t.Helper()
	for _, id := range c.ids {
		if err := c.nodes[id].node.raft.Snapshot().Error(); err != nil {
			c.t.Fatalf("snapshot of %s: %v", id, err)
		}
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
}

// leader waits until exactly one running node is a ready leader.
func (c *testCluster) leader() *Server {
	c.t.Helper()
	var leader *Server
	waitFor(c.t, "a ready leader", func() bool {
		leader = nil
		for _, s := range c.nodes {
			if s.leaderReady.Load() {
				if leader != nil {
					return false
				}
				leader = s
			}
		}
		return leader != nil
	})
	return leader
}

// followers returns the running nodes other than leader, in id order.
func (c *testCluster) followers(leader *Server) []*Server {
	var out []*Server
	for _, id := range c.ids {
		if n, ok := c.nodes[id]; ok && n != leader {
			out = append(out, n)
		}
	}
	return out
}

// isolate cuts every link to and from id.
func (c *testCluster) isolate(id string, cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, p := range c.links {
		if key[0] == id || key[1] == id {
			p.SetCut(cut)
		}
	}
}

func (c *testCluster) endpoints(except ...string) []string {
	var out []string
	for _, id := range c.ids {
		skip := false
		for _, e := range except {
			skip = skip || e == id
		}
		if s, ok := c.nodes[id]; ok && !skip {
			out = append(out, s.Addr())
		}
	}
	return out
}

func (c *testCluster) client(endpoints ...string) *client.Client {
	if len(endpoints) == 0 {
		endpoints = c.endpoints()
	}
	cl, err := client.New(client.WithEndpoints(endpoints...))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

func lastToken(s *Server) uint64 {
	var t uint64
	s.fsm.Read(func(st *fsm.State) { t = st.LastToken() })
	return t
}

// The leader goes away: a new one is elected, the holder keeps its lock
// and its session, the waiter keeps waiting and gets the lock on release,
// and tokens continue above every token issued before.
func TestClusterLeaderFailover(t *testing.T) {
	c := startCluster(t, 3, nil)
	cl := c.client()
	ctx := context.Background()
	holder, m, g1 := mustHoldLock(t, cl, 5*time.Second, "orders")
	waiter := mustNewSession(t, cl, client.WithTTL(5*time.Second))
	type result struct {
		g   *client.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := client.NewMutex(waiter, "orders").Lock(ctx)
		got <- result{g, err}
	}()
	waitFor(t, "the waiter to queue", func() bool {
		locks, err := cl.Locks(ctx, "orders")
		return err == nil && len(locks) == 1 && len(locks[0].GetWaiters()) == 1
	})

	old := c.leader()
	before := lastToken(old)
	c.stop(old.cfg.NodeID)
	start := time.Now()
	c.leader()
	t.Logf("new leader after %v", time.Since(start).Round(time.Millisecond))

	locks, err := cl.Locks(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if h := locks[0].GetHolders(); len(h) != 1 || h[0].GetToken() != g1.Token() || h[0].GetSessionId() != holder.ID() {
		t.Fatalf("after failover holders = %v, want session %d with token %d", h, holder.ID(), g1.Token())
	}
	time.Sleep(2 * time.Second) // several keepalive rounds against the new leader
	if holder.Err() != nil || g1.Err() != nil {
		t.Fatalf("the holder lost its session across the failover: %v", holder.Err())
	}
	mustUnlock(t, m)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if r.g.Token() <= before {
			t.Fatalf("token after failover %d is not above %d issued before", r.g.Token(), before)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not granted after the release")
	}
}

// A leader cut off from the majority stops granting; the majority elects
// a leader and goes on; after healing, the old leader follows and its
// state is the majority's.
func TestClusterPartitionedLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	old := c.leader()
	oldID := old.cfg.NodeID
	c.isolate(oldID, true)

	// The old leader cannot commit: a grant asked of it fails.
	oldClient, err := client.New(client.WithEndpoints(old.Addr()), client.WithRetryBudget(0))
	if err != nil {
		t.Fatal(err)
	}
	defer oldClient.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, err := oldClient.NewSession(ctx); err == nil {
		_, err = client.NewMutex(s, "p").Lock(ctx)
		if err == nil {
			t.Fatal("the partitioned old leader granted a lock")
		}
	}
	waitFor(t, "the old leader to step down", func() bool { return !old.leaderReady.Load() })

	majority := c.client(c.endpoints(oldID)...)
	s, err := majority.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := client.NewMutex(s, "p").Lock(ctx)
	if err != nil {
		t.Fatalf("the majority did not grant: %v", err)
	}

	c.isolate(oldID, false)
	waitFor(t, "the old leader to catch up", func() bool {
		return old.node.raft.State() == raft.Follower && lastToken(old) == g.Token()
	})
	var holders []fsm.HolderInfo
	old.fsm.Read(func(st *fsm.State) {
		info, _ := st.Lock("p")
		holders = info.Holders
	})
	if len(holders) != 1 || holders[0].Token != g.Token() {
		t.Fatalf("old leader's state after healing: %v, want the majority's grant %d", holders, g.Token())
	}
}

// A node that was down while the log was compacted catches up from a
// snapshot when it comes back.
func TestClusterRestartedNodeCatchesUpFromSnapshot(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) { cfg.SnapshotThreshold = 16 })
	leader := c.leader()
	var down string
	for _, id := range c.ids {
		if id != leader.cfg.NodeID {
			down = id
			break
		}
	}
	c.stop(down)
	cl := c.client(c.endpoints(down)...)
	ctx := context.Background()
	s := mustNewSession(t, cl)
	m := client.NewMutex(s, "churn")
	for range 100 {
		mustLock(t, m)
		mustUnlock(t, m)
	}
	if _, err := cl.KV().Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := leader.node.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	want := lastToken(leader)
	restarted := c.start(down)
	// raft backs off replication to a node that kept failing, up to tens of
	// seconds, before it sends the snapshot.
	start := time.Now()
	waitForWithin(t, time.Minute, "the restarted node to catch up from a snapshot", func() bool {
		return lastToken(restarted) == want && restarted.restores.Load() > 0
	})
	t.Logf("caught up from a snapshot in %v", time.Since(start).Round(time.Millisecond))
	var kv fsm.KeyValue
	restarted.fsm.Read(func(st *fsm.State) { kv, _ = st.Get("k") })
	if string(kv.Value) != "v" {
		t.Fatalf("restarted node has k = %q", kv.Value)
	}
}

// Membership changes: a fourth node joins and catches up, a node leaves,
// and the group keeps serving.
func TestClusterMembership(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx := context.Background()
	cl := c.client()
	s := mustNewSession(t, cl)
	mustLock(t, client.NewMutex(s, "m"))

	n4, cfg4 := c.startJoiner("n4")
	if err := cl.AddMember(ctx, "n4", cfg4.RaftListen, true); err != nil {
		t.Fatalf("adding n4: %v", err)
	}
	waitFor(t, "n4 to catch up", func() bool { return lastToken(n4) == lastToken(c.leader()) })

	victim := "n1"
	if c.leader().cfg.NodeID == victim {
		victim = "n2"
	}
	if err := cl.RemoveMember(ctx, victim); err != nil {
		t.Fatalf("removing %s: %v", victim, err)
	}
	c.stop(victim)
	if err := cl.RemoveMember(ctx, "no-such-node"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("removing an unknown member: %v", err)
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetMembers()) != 3 {
		t.Fatalf("members after add and remove: %v", st.GetMembers())
	}
	s2 := mustNewSession(t, cl)
	if _, err := client.NewMutex(s2, "after").Lock(ctx); err != nil {
		t.Fatalf("the group stopped serving: %v", err)
	}
}

// A follower answers stale reads from its own state, even when cut off
// from the leader; linearizable reads need the leader.
func TestClusterStaleReadOnFollower(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	followers := c.followers(leader)
	follower := followers[0]
	ctx := context.Background()
	if _, err := c.client().KV().Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	fc, err := client.New(client.WithEndpoints(follower.Addr()), client.WithRetryBudget(0))
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	waitFor(t, "the follower to apply the put", func() bool {
		kv, err := fc.KV().Get(ctx, "k", client.Stale())
		return err == nil && kv != nil && string(kv.GetValue()) == "v1"
	})
	c.isolate(follower.cfg.NodeID, true)
	defer c.isolate(follower.cfg.NodeID, false)
	waitFor(t, "the follower to notice it is cut off", func() bool {
		_, id := follower.node.raft.LeaderWithID()
		return id == ""
	})
	if kv, err := fc.KV().Get(ctx, "k", client.Stale()); err != nil || string(kv.GetValue()) != "v1" {
		t.Fatalf("stale read on a cut-off follower = %v, %v", kv, err)
	}
	if _, err := fc.KV().Get(ctx, "k"); !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("linearizable read on a cut-off follower: %v, want ErrUnavailable", err)
	}
}

// A watch survives the failure of the leader it streams from: it resumes
// on the new leader after the last change it delivered, and misses none.
func TestClusterWatchResumesAfterLeaderFailure(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := c.client().KV()
	w, err := kv.Watch(ctx, "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	expect := func(key string) {
		t.Helper()
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("the watch ended: %v; want %s", w.Err(), key)
			}
			if ev.GetKv().GetKey() != key {
				t.Fatalf("event for %s, want %s", ev.GetKv().GetKey(), key)
			}
		case <-ctx.Done():
			t.Fatalf("no event; want %s", key)
		}
	}
	if _, err := kv.Put(ctx, "jobs/1", []byte("a")); err != nil {
		t.Fatal(err)
	}
	expect("jobs/1")
	old := c.leader()
	c.stop(old.cfg.NodeID)
	for _, key := range []string{"jobs/2", "jobs/3"} {
		if _, err := kv.Put(ctx, key, []byte("b")); err != nil {
			t.Fatal(err)
		}
	}
	expect("jobs/2")
	expect("jobs/3")
}

// A follower forwards calls it cannot answer to the leader, for clients
// that cannot follow the leader's address themselves: JSON over HTTP from
// curl, and gRPC, watch streams included. The Go client opts out and
// follows the hint. With the leader's API unreachable, the follower
// answers itself: stale reads, and Unavailable with the leader's address.
func TestClusterFollowerForwardsToLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	leader := c.leader()
	followers := c.followers(leader)
	follower := followers[0]
	waitFor(t, "both followers to learn the leader's API address", func() bool {
		for _, f := range followers {
			var api string
			f.fsm.Read(func(st *fsm.State) { api, _ = st.NodeAPI(leader.cfg.NodeID) })
			if api != leader.Addr() {
				return false
			}
		}
		return true
	})
	post := func(procedure, body string, header ...string) (int, string) {
		t.Helper()
		resp, data := postJSON(t, follower.Addr(), procedure, body, header...)
		return resp.StatusCode, data
	}
	code, body := post("SessionService/CreateSession", `{"ttl":"30s"}`)
	if code != http.StatusOK {
		t.Fatalf("CreateSession through a follower: HTTP %d %s", code, body)
	}
	var sess struct {
		SessionID     uint64 `json:"sessionId,string"`
		SessionSecret string `json:"sessionSecret"`
	}
	if err := json.Unmarshal([]byte(body), &sess); err != nil {
		t.Fatal(err)
	}
	if len(sess.SessionSecret) < 22 { // 128 bits in base64
		t.Fatalf("CreateSession through a follower answered secret %q", sess.SessionSecret)
	}
	// The leader checks the secret of a forwarded call as of any other:
	// the follower passes on no authority of its own.
	for _, secret := range []string{"", "guessed"} {
		code, body = post("LockService/Acquire", fmt.Sprintf(`{"sessionId":"%d","sessionSecret":%q,"lock":"fwd"}`, sess.SessionID, secret))
		if code != http.StatusUnauthorized || !strings.Contains(body, "REASON_SESSION_SECRET") {
			t.Fatalf("Acquire through a follower with secret %q: HTTP %d %s", secret, code, body)
		}
	}
	code, body = post("LockService/Acquire", fmt.Sprintf(`{"sessionId":"%d","sessionSecret":%q,"lock":"fwd"}`, sess.SessionID, sess.SessionSecret))
	if code != http.StatusOK || !strings.Contains(body, `"token"`) {
		t.Fatalf("Acquire through a follower: HTTP %d %s", code, body)
	}
	if code, body = post("KVService/Put", `{"key":"k","value":"dg=="}`); code != http.StatusOK {
		t.Fatalf("Put through a follower: HTTP %d %s", code, body)
	}

	// gRPC over HTTP/2, a watch stream included.
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	kv := fencev1connect.NewKVServiceClient(h2c, "http://"+follower.Addr(), connect.WithGRPC())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := mustOpenWatch(t, ctx, kv, "w/", "gRPC watch through a follower")
	defer stream.Close()
	if _, err := kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "w/1", Value: []byte("x")})); err != nil {
		t.Fatalf("gRPC put through a follower: %v", err)
	}
	if !stream.Receive() || len(stream.Msg().GetEvents()) != 1 || stream.Msg().GetEvents()[0].GetKv().GetKey() != "w/1" {
		t.Fatalf("gRPC watch through a follower delivered %v, %v", stream.Msg(), stream.Err())
	}

	// A follower closing ends the streams it forwards, promptly.
	other := followers[1]
	okv := fencev1connect.NewKVServiceClient(h2c, "http://"+other.Addr(), connect.WithGRPC())
	ostream := mustOpenWatch(t, ctx, okv, "w/", "watch through the other follower")
	defer ostream.Close()
	if err := other.Close(); err != nil {
		t.Fatalf("closing a follower with a forwarded stream open: %v", err)
	}
	delete(c.nodes, other.cfg.NodeID)
	if ostream.Receive() {
		t.Fatalf("the stream forwarded by a closed node delivered %v", ostream.Msg())
	}

	// A client that follows the leader itself is not forwarded, and the
	// Go client is one.
	if code, body = post("KVService/Put", `{"key":"k","value":"dg=="}`, fencev1.FollowLeaderHeader, "1"); code == http.StatusOK || !strings.Contains(body, leader.Addr()) {
		t.Fatalf("Put with %s on a follower: HTTP %d %s; want Unavailable naming the leader", fencev1.FollowLeaderHeader, code, body)
	}
	gc := c.client(follower.Addr())
	if _, err := gc.KV().Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Go client following the hint: %v", err)
	}

	// The leader's API gone, the follower answers itself.
	leader.http.Close()
	if code, body = post("KVService/Get", `{"key":"k","stale":true}`); code != http.StatusOK || !strings.Contains(body, `"found":true`) {
		t.Fatalf("stale read with the leader's API down: HTTP %d %s", code, body)
	}
	if code, body = post("KVService/Put", `{"key":"k","value":"dg=="}`); code == http.StatusOK || !strings.Contains(body, "unavailable") {
		t.Fatalf("write with the leader's API down: HTTP %d %s; want Unavailable", code, body)
	}
}

// A leader cut off from the majority believes it leads until its lease
// check notices, and a new leader may be elected meanwhile. It must not
// renew a session in that time: its client would count on a deadline that
// the new leader, which expires sessions on its own clock, does not honour
// (docs/design.md, "Sessions and leader changes").
func TestClusterCutOffLeaderRenewsNoSession(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) {
		// A long lease, so that the old leader still believes it leads
		// when the keepalive arrives.
		cfg.HeartbeatTimeout = 2 * time.Second
		cfg.ElectionTimeout = 2 * time.Second
	})
	old := c.leader()
	a := newAPI(t, old)
	id := a.session(30 * time.Second)
	c.isolate(old.cfg.NodeID, true)
	if !old.node.isLeader() {
		t.Fatal("the old leader stepped down at once; the test proves nothing")
	}
	err := a.keepAlive(id)
	if err == nil {
		t.Fatal("a leader cut off from the majority renewed a session")
	}
	if codeOf(err) != connect.CodeUnavailable {
		t.Fatalf("keepalive on a cut-off leader: %v, want Unavailable", err)
	}
	if _, err := a.locks.Check(context.Background(), connect.NewRequest(&fencev1.CheckRequest{Lock: "x"})); codeOf(err) != connect.CodeUnavailable {
		t.Fatalf("linearizable read on a cut-off leader: %v, want Unavailable", err)
	}
}

// A polling Acquire taken up again on a leader cut off from the majority
// is not answered from its state: a leader paused and replaced could
// otherwise report a wait or a grant that has since ended.
func TestClusterCutOffLeaderResumesNoWait(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.HeartbeatTimeout = 2 * time.Second
		cfg.ElectionTimeout = 2 * time.Second
		cfg.ApplyTimeout = 500 * time.Millisecond
	})
	old := c.leader()
	a := newAPI(t, old)
	a.mustAcquire(a.session(30*time.Second), "x")
	req := &fencev1.AcquireRequest{SessionId: a.session(30 * time.Second), Lock: "x", RequestId: 7, Poll: durationpb.New(100 * time.Millisecond)}
	resp, err := a.locks.Acquire(context.Background(), connect.NewRequest(req))
	if err != nil || !resp.Msg.GetWaiting() {
		t.Fatalf("first poll: %v, %v", resp, err)
	}
	c.isolate(old.cfg.NodeID, true)
	if !old.node.isLeader() {
		t.Fatal("the old leader stepped down at once; the test proves nothing")
	}
	req.ResumeAttempt = resp.Msg.GetAttempt()
	again, err := a.locks.Acquire(context.Background(), connect.NewRequest(req))
	if err == nil {
		t.Fatalf("a leader cut off from the majority took up a wait from its own state: %v", again.Msg)
	}
	if codeOf(err) != connect.CodeUnavailable {
		t.Fatalf("resuming on a cut-off leader: %v, want Unavailable", err)
	}
}
