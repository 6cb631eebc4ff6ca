package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// clusterNode is one `fence serve` of a cluster: a raft member with its own
// data dir, API and raft ports. It can be killed and restarted on the same
// data and ports.
type clusterNode struct {
	id       string
	addr     string // API, host:port
	raftAddr string
	dataDir  string
	args     []string   // `fence serve` arguments, the same at every start
	bin      string     // the fence binary it runs; "" for the one under test
	proc     *process   // the running (or last) process
	procs    []*process // every process run for this node, for cleanup
	killed   bool       // killed by the test, and not restarted yet
}

// cluster is a raft group of `fence serve` processes on loopback.
type cluster struct {
	nodes  []*clusterNode // the members started, joiners included
	failed []*clusterNode // nodes of start attempts that lost a port race
	extra  []string       // flags given to every node
	admin  *client.Client // for StatusOf, which names its node
}

// startCluster starts n nodes, n1..nN, bootstrapped with the same --peers,
// and waits until one of them is a ready leader. extra flags go to every
// `fence serve`.
func startCluster(t *testing.T, n int, extra ...string) *cluster {
	t.Helper()
	return startClusterOf(t, fenceBin, n, extra...)
}

// startClusterOf is startCluster with the fence binary at bin.
func startClusterOf(t *testing.T, bin string, n int, extra ...string) *cluster {
	t.Helper()
	c := &cluster{extra: extra}
	// One cleanup for every process of every node, registered before any
	// client or session of the test, so that those are closed while the
	// nodes still run.
	t.Cleanup(func() {
		for _, nd := range append(c.failed, c.nodes...) {
			for _, p := range nd.procs {
				p.cleanup(t)
			}
		}
	})
	c.admin = newClient(t, "127.0.0.1:1") // never dialed: StatusOf names its node
	// A port found free can be taken by someone else before a node binds
	// it; then start the whole group again on other ports and data dirs.
	for attempt := 1; ; attempt++ {
		addrs := freeAddrs(t, 2*n)
		c.nodes = nil
		var peers []string
		for i := range n {
			nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), addr: addrs[2*i], raftAddr: addrs[2*i+1], dataDir: t.TempDir(), bin: bin}
			peers = append(peers, nd.id+"="+nd.raftAddr)
			c.nodes = append(c.nodes, nd)
		}
		ok := true
		for _, nd := range c.nodes {
			nd.args = append(nd.serveArgs(), "--peers", strings.Join(peers, ","))
			nd.args = append(nd.args, extra...)
			if ok = nd.start(t); !ok {
				break
			}
		}
		if ok {
			break
		}
		if attempt == 3 {
			t.Fatalf("could not start a %d-node cluster on free ports", n)
		}
		for _, nd := range c.nodes {
			if nd.proc != nil {
				_ = nd.proc.Kill()
				<-nd.proc.Done()
			}
		}
		c.failed = append(c.failed, c.nodes...)
	}
	c.waitLeader(t, 30*time.Second)
	// A founder slower than the others founds the group at its next look
	// at its peers, which needs every peer to answer (docs/design.md,
	// Bootstrap is a one-time act): a test's faults begin once every node
	// holds the group's data.
	waitFor(t, 30*time.Second, "every node to hold the group's data", func() bool {
		for _, nd := range c.nodes {
			if st, err := c.statusOf(nd); err != nil || st.GetClusterId() == "" || st.GetAppliedIndex() == 0 {
				return false
			}
		}
		return true
	})
	return c
}

// serveArgs are the flags every node gets: its identity and addresses.
func (nd *clusterNode) serveArgs() []string {
	return []string{"serve",
		"--node-id", nd.id,
		"--data-dir", nd.dataDir,
		"--listen", nd.addr,
		"--raft-listen", nd.raftAddr,
	}
}

// start runs `fence serve` and reports false if it exited at once because
// a port was taken.
func (nd *clusterNode) start(t *testing.T) bool {
	t.Helper()
	nd.proc = startProcess(t, "fence serve "+nd.id+" "+nd.addr, cmp.Or(nd.bin, fenceBin), nd.args...)
	nd.procs = append(nd.procs, nd.proc)
	nd.killed = false
	waitFor(t, startTimeout, "fence serve "+nd.id+" to open its ports", func() bool {
		return nd.proc.Exited() || serving(nd.proc.Stderr(), nd.addr)
	})
	if nd.proc.Exited() {
		if strings.Contains(nd.proc.Stderr(), "address already in use") {
			t.Logf("%s could not bind %s or %s: %s", nd.id, nd.addr, nd.raftAddr, strings.TrimSpace(nd.proc.Stderr()))
			return false
		}
		nd.proc.failIfExited(t)
	}
	return true
}

// restart starts the node again on the same data and ports, after a kill.
func (nd *clusterNode) restart(t *testing.T) {
	t.Helper()
	waitFor(t, 10*time.Second, "fence serve "+nd.id+" to bind its ports again", func() bool { return nd.start(t) })
}

// kill sends SIGKILL to the node and waits until it is gone.
func (nd *clusterNode) kill(t *testing.T) {
	t.Helper()
	nd.killed = true
	nd.proc.signal(t, syscall.SIGKILL)
	if code := nd.proc.waitExit(t, 10*time.Second); code != -1 {
		t.Fatalf("%s exited with status %d, not by SIGKILL", nd.id, code)
	}
}

func (nd *clusterNode) running() bool { return nd.proc != nil && !nd.proc.Exited() }

// failIfDied fails the test at once if a node the test did not kill has
// exited: a crash, or a signal from outside the test.
func (c *cluster) failIfDied(t *testing.T) {
	t.Helper()
	for _, nd := range c.members() {
		if nd.proc != nil && !nd.killed && nd.proc.Exited() {
			t.Fatalf("%s (pid %d) exited though the test did not kill it (%v); stderr:\n%s",
				nd.id, nd.proc.Pid(), nd.proc.State(), tail(nd.proc.Stderr(), 3000))
		}
	}
}

// othersThan returns the members other than nd.
func (c *cluster) othersThan(nd *clusterNode) []*clusterNode {
	var out []*clusterNode
	for _, m := range c.members() {
		if m != nd {
			out = append(out, m)
		}
	}
	return out
}

// members returns the nodes started as members, joiners included.
func (c *cluster) members() []*clusterNode { return c.nodes }

// addrs returns the API addresses of the given nodes (default: all members).
func (c *cluster) addrs(nodes ...*clusterNode) []string {
	if len(nodes) == 0 {
		nodes = c.members()
	}
	var out []string
	for _, nd := range nodes {
		out = append(out, nd.addr)
	}
	return out
}

// statusOf asks one node for its own view, briefly.
func (c *cluster) statusOf(nd *clusterNode) (*fencev1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.admin.StatusOf(ctx, nd.addr)
}

// leaderNow returns the running node that says it is the leader, if every
// running node that answers names it.
func (c *cluster) leaderNow() *clusterNode {
	var leader *clusterNode
	leaderID := ""
	for _, nd := range c.members() {
		if !nd.running() {
			continue
		}
		st, err := c.statusOf(nd)
		if err != nil {
			continue
		}
		if st.GetState() == "Leader" {
			if leader != nil {
				return nil
			}
			leader = nd
		}
		if st.GetLeaderId() != "" {
			if leaderID != "" && leaderID != st.GetLeaderId() {
				return nil
			}
			leaderID = st.GetLeaderId()
		}
	}
	if leader == nil || leader.id != leaderID {
		return nil
	}
	return leader
}

// waitLeader waits until the running nodes agree on a leader that serves
// linearizable reads, and returns it.
func (c *cluster) waitLeader(t *testing.T, timeout time.Duration) *clusterNode {
	t.Helper()
	var leader *clusterNode
	waitFor(t, timeout, "the cluster to elect a leader that serves reads", func() bool {
		c.failIfDied(t)
		if leader = c.leaderNow(); leader == nil {
			return false
		}
		status, _ := post(t, leader.addr, "fence.v1.LockService/ListLocks", `{}`)
		return status == http.StatusOK
	})
	return leader
}

// newClusterClient returns a Go client for the given API addresses.
func newClusterClient(t *testing.T, addrs []string) *client.Client {
	t.Helper()
	return newClient(t, addrs[0], client.WithEndpoints(addrs...))
}

// failoverAck is a grant acknowledged to a load worker.
type failoverAck struct {
	key       grantKey
	token     uint64
	worker    int
	requested time.Time // when Lock was called
	acked     time.Time // when it returned the grant
}

// failoverLedger records what the cluster acknowledged to the load's
// clients, by token (tokens are unique).
type failoverLedger struct {
	mu          sync.Mutex
	acks        []failoverAck
	byToken     map[uint64]grantKey // every acknowledged grant
	held        map[uint64]grantKey // acknowledged, and no release sent
	releaseSent map[uint64]bool     // a release was sent (it may not have committed)
	errs        []string            // invariant violations, seen by the workers and the monitor
}

func newFailoverLedger() *failoverLedger {
	return &failoverLedger{byToken: map[uint64]grantKey{}, held: map[uint64]grantKey{}, releaseSent: map[uint64]bool{}}
}

func (l *failoverLedger) granted(a failoverAck) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.byToken[a.token]; ok {
		l.errorfLocked("token %d acknowledged twice: to %v and to %v", a.token, prev, a.key)
	}
	l.byToken[a.token] = a.key
	l.held[a.token] = a.key
	l.acks = append(l.acks, a)
}

func (l *failoverLedger) releasing(token uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, token)
	l.releaseSent[token] = true
}

func (l *failoverLedger) errorf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errorfLocked(format, args...)
}

func (l *failoverLedger) errorfLocked(format string, args ...any) {
	if len(l.errs) < 50 {
		l.errs = append(l.errs, fmt.Sprintf(format, args...))
	}
}

// outstanding returns the grants acknowledged and not (yet) being released.
func (l *failoverLedger) outstanding() map[uint64]grantKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[uint64]grantKey, len(l.held))
	for token, k := range l.held {
		out[token] = k
	}
	return out
}

func (l *failoverLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

// checkListing checks one committed state of the load's locks: at most one
// holder per lock, every listed grant the clients were told of is that
// grant, and, for a linearizable listing, every grant acknowledged before
// the listing was asked for (before: l.outstanding() taken then) is still
// held, unless a release was sent for it or its session is gone.
func (l *failoverLedger) checkListing(where string, listing *locksJSON, before map[uint64]grantKey, lost func(session uint64) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	listed := map[uint64]grantKey{}
	for _, lk := range listing.Locks {
		if len(lk.Holders) > 1 {
			l.errorfLocked("%s: exclusive lock %s has %d holders: %+v", where, lk.Name, len(lk.Holders), lk.Holders)
		}
		for _, h := range lk.Holders {
			k := grantKey{lk.Name, h.SessionID}
			listed[h.Token] = k
			if ack, ok := l.byToken[h.Token]; ok && ack != k {
				l.errorfLocked("%s: %s is held by session %d with token %d, but that token was acknowledged to session %d for %s",
					where, k.lock, k.session, h.Token, ack.session, ack.lock)
			}
		}
	}
	for token, k := range before {
		if listed[token] == k || l.releaseSent[token] || lost(k.session) {
			continue
		}
		l.errorfLocked("%s: acknowledged grant lost: %s (token %d) was acknowledged to session %d and not released, but is not held (holders listed: %v)",
			where, k.lock, token, k.session, listed)
	}
}

// listLoadLocks lists the load's locks through c: a linearizable read,
// answered by the leader the client follows.
func listLoadLocks(ctx context.Context, c *client.Client) (*locksJSON, error) {
	locks, err := c.Locks(ctx, "load/")
	if err != nil {
		return nil, err
	}
	data, err := protojson.Marshal(&fencev1.ListLocksResponse{Locks: locks})
	if err != nil {
		return nil, err
	}
	out := &locksJSON{}
	return out, json.Unmarshal(data, out)
}

// listStale asks one node for its own applied state of the load's locks.
func listStale(ctx context.Context, addr string) (*locksJSON, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/fence.v1.LockService/ListLocks",
		strings.NewReader(`{"prefix":"load/","stale":true}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	out := &locksJSON{}
	return out, json.Unmarshal(data, out)
}

// runFailoverLoad locks and unlocks in a loop until ctx ends, recording
// every acknowledgement in l. Any failure before ctx ends is returned: the
// cluster must keep serving through a leader's loss.
func runFailoverLoad(ctx context.Context, s *client.Session, worker int, l *failoverLedger) error {
	var last uint64
	for n := 0; ctx.Err() == nil; n++ {
		name, keep := loadLock(worker, n)
		m := client.NewMutex(s, name)
		requested := time.Now()
		g, err := m.Lock(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker %d (session %d): locking %s: %w", worker, s.ID(), name, err)
		}
		l.granted(failoverAck{key: grantKey{name, s.ID()}, token: g.Token(), worker: worker, requested: requested, acked: time.Now()})
		// This worker's requests are sequential, so each is committed after
		// the one before: its tokens must rise.
		if g.Token() <= last {
			l.errorf("worker %d: token %d acknowledged after its token %d", worker, g.Token(), last)
		}
		last = g.Token()
		if keep {
			continue
		}
		l.releasing(g.Token())
		if err := m.Unlock(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker %d (session %d): unlocking %s (token %d): %w", worker, s.ID(), name, g.Token(), err)
		}
	}
	return nil
}

// TestClusterKillLeaderUnderLoad kills the leader of a 3-node cluster with
// SIGKILL while sessions lock and unlock, and restarts it on its data: once
// with the default raft timeouts, so that the failover time is the one users
// get, and once with tuned ones.
func TestClusterKillLeaderUnderLoad(t *testing.T) {
	t.Run("default-timeouts", func(t *testing.T) { killLeaderUnderLoad(t, "default 500ms raft timeouts") })
	t.Run("tuned-timeouts", func(t *testing.T) {
		killLeaderUnderLoad(t, "raft timeouts of 150ms", "--heartbeat-timeout", "150ms", "--election-timeout", "150ms")
	})
}

func killLeaderUnderLoad(t *testing.T, setting string, extra ...string) {
	c := startCluster(t, 3, extra...)
	const (
		workers   = 6
		minBefore = 150 // acknowledged grants before the kill
		minAfter  = 150 // grants requested after the kill, acknowledged
	)
	r := startFailoverRun(t, c, workers, 5*time.Second)
	defer r.stop()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d acknowledged grants and a kept lock", minBefore), func() bool {
		r.workerFailed()
		return r.l.count() >= minBefore && len(r.l.outstanding()) > 0
	})

	leader, mark := r.killLeader()
	var newLeader *clusterNode
	waitFor(t, 20*time.Second, "a survivor to be elected leader", func() bool {
		r.workerFailed()
		newLeader = c.leaderNow()
		return newLeader != nil
	})
	electedAfter := time.Since(mark.killAt)

	// The load continues: every worker gets grants it asked for after the kill.
	waitFor(t, 30*time.Second, fmt.Sprintf("%d grants requested after the kill, and some for every worker", minAfter), func() bool {
		r.workerFailed()
		total, perWorker := r.grantsAfter(mark)
		return total >= minAfter && len(perWorker) == workers
	})

	// Restart the killed node on its data and ports, under load.
	restartAt := time.Now()
	leader.restart(t)
	waitFor(t, 20*time.Second, leader.id+" to rejoin as a follower", func() bool {
		r.workerFailed()
		st, err := c.statusOf(leader)
		return err == nil && st.GetState() == "Follower" && st.GetLeaderId() != "" && st.GetLeaderId() != leader.id
	})
	rejoinedAfter := time.Since(restartAt)
	waitFor(t, 10*time.Second, "a linearizable check after the restart", func() bool {
		r.workerFailed()
		return r.mon.lastLeaderLook().After(restartAt)
	})
	r.stop()

	// Sessions survived the failover: their keepalives reached the new leader.
	for i, s := range r.sessions {
		if err := s.Err(); err != nil {
			t.Errorf("worker %d's session %d ended: %v", i, s.ID(), err)
		}
	}
	survivors := c.addrs(c.othersThan(leader)...)
	final := r.checkFinalListing(survivors)
	failover, firstAfterKill := r.checkLedger(mark)
	t.Logf("failover (%s): new leader %s elected %v after SIGKILL; first grant acknowledged after the kill at %v; first grant requested after the kill acknowledged at %v",
		setting, newLeader.id, electedAfter.Round(time.Millisecond), firstAfterKill.Round(time.Millisecond), failover.Round(time.Millisecond))
	if failover > 10*time.Second {
		t.Errorf("failover took %v, over 10s", failover)
	}
	waitCaughtUp(t, c, leader, newLeader, restartAt, rejoinedAfter)
	checkSameLocks(t, c, leader, survivors, final)
}

// failoverRun is the load of killLeaderUnderLoad: sessions that lock and
// unlock, the ledger of what the cluster acknowledged to them, and the
// monitor that checks committed states while they run.
type failoverRun struct {
	t        *testing.T
	c        *cluster
	sessions []*client.Session
	l        *failoverLedger
	errs     chan error
	stopLoad context.CancelFunc
	mon      *failoverMonitor
	running  int // workers whose end is not yet received from errs
	stopped  bool
}

func startFailoverRun(t *testing.T, c *cluster, workers int, ttl time.Duration) *failoverRun {
	r := &failoverRun{t: t, c: c, l: newFailoverLedger(), errs: make(chan error, workers), running: workers}
	for i := range workers {
		r.sessions = append(r.sessions, newSession(t, newClusterClient(t, c.addrs()), ttl, fmt.Sprintf("e2e cluster worker %d", i)))
	}
	ctx, stop := context.WithCancel(context.Background())
	r.stopLoad = stop
	for i, s := range r.sessions {
		go func() { r.errs <- runFailoverLoad(ctx, s, i, r.l) }()
	}
	r.mon = startFailoverMonitor(c, r.l, newClusterClient(t, c.addrs()), r.lost)
	return r
}

// lost reports whether the client of session id has given it up.
func (r *failoverRun) lost(id uint64) bool {
	for _, s := range r.sessions {
		if s.ID() == id {
			return s.Err() != nil
		}
	}
	return false
}

// workerFailed fails the test at once if a node died or a worker failed.
func (r *failoverRun) workerFailed() {
	r.t.Helper()
	r.c.failIfDied(r.t)
	select {
	case err := <-r.errs:
		r.running--
		r.t.Fatalf("load failed: %v", err)
	default:
	}
}

// killMark is the ledger as it stood when the leader was killed.
type killMark struct {
	ackedBefore int       // grants acknowledged before the kill
	maxBefore   uint64    // the highest token among them
	killAt      time.Time // just before SIGKILL
	deadAt      time.Time // no request started from now on can reach the old leader
}

// killLeader kills the leader with SIGKILL and notes the ledger then.
func (r *failoverRun) killLeader() (*clusterNode, killMark) {
	leader := r.c.leaderNow()
	if leader == nil {
		leader = r.c.waitLeader(r.t, 10*time.Second)
	}
	r.l.mu.Lock()
	mark := killMark{ackedBefore: len(r.l.acks), killAt: time.Now()}
	for _, a := range r.l.acks {
		mark.maxBefore = max(mark.maxBefore, a.token)
	}
	heldAtKill := len(r.l.held)
	r.l.mu.Unlock()
	leader.kill(r.t)
	mark.deadAt = time.Now()
	r.t.Logf("killed leader %s after %d acknowledged grants (max token %d, %d held)", leader.id, mark.ackedBefore, mark.maxBefore, heldAtKill)
	return leader, mark
}

// grantsAfter counts the grants requested after the kill and acknowledged.
func (r *failoverRun) grantsAfter(mark killMark) (total int, perWorker map[int]int) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	perWorker = map[int]int{}
	for _, a := range r.l.acks[mark.ackedBefore:] {
		if a.requested.After(mark.deadAt) {
			total++
			perWorker[a.worker]++
		}
	}
	return total, perWorker
}

// stop ends the load, reports how its workers ended, and stops the monitor.
func (r *failoverRun) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.stopLoad()
	for ; r.running > 0; r.running-- {
		select {
		case err := <-r.errs:
			if err != nil {
				r.t.Errorf("load failed: %v", err)
			}
		case <-time.After(20 * time.Second):
			r.t.Error("load workers did not stop")
			return
		}
	}
	r.mon.close()
}

// checkFinalListing checks the final committed state, from the survivors.
func (r *failoverRun) checkFinalListing(survivors []string) *locksJSON {
	before := r.l.outstanding()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	final, err := listLoadLocks(ctx, newClusterClient(r.t, survivors))
	if err != nil {
		r.t.Fatalf("listing locks at the end: %v", err)
	}
	r.l.checkListing("final listing", final, before, r.lost)
	return final
}

// checkLedger reports the ledger's violations, checks that every token
// requested after the kill is above every token acknowledged before it,
// and returns how long the failover took: to the first grant requested
// after the kill, and to the first acknowledged after it.
func (r *failoverRun) checkLedger(mark killMark) (failover, firstAfterKill time.Duration) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	for _, e := range r.l.errs {
		r.t.Error(e)
	}
	firstAfterKill = -1
	newGrants, kept := 0, 0
	for _, a := range r.l.acks[mark.ackedBefore:] {
		d := a.acked.Sub(mark.killAt)
		if a.requested.After(mark.deadAt) {
			newGrants++
			if a.token <= mark.maxBefore {
				r.t.Errorf("token %d (%s, session %d) was requested after the kill, but is not above the %d acknowledged before it",
					a.token, a.key.lock, a.key.session, mark.maxBefore)
			}
			if failover == 0 || d < failover {
				failover = d
			}
		}
		if a.acked.After(mark.deadAt) && (firstAfterKill < 0 || d < firstAfterKill) {
			firstAfterKill = d
		}
	}
	for _, k := range r.l.held {
		if strings.HasPrefix(k.lock, "load/keep-") {
			kept++
		}
	}
	leaderChecks, staleChecks := r.mon.counts()
	r.t.Logf("%d grants in all, %d requested after the kill, %d locks kept to the end; %d linearizable and %d applied-state checks",
		len(r.l.acks), newGrants, kept, leaderChecks, staleChecks)
	return failover, firstAfterKill
}

// failoverMonitor checks committed states while the load runs: the
// leader's (linearizable, through a client that follows it) and each
// node's own applied state (stale reads).
type failoverMonitor struct {
	stop context.CancelFunc
	done chan struct{}

	mu           sync.Mutex
	leaderChecks int
	staleChecks  int
	lastLook     time.Time // when the last successful linearizable check was asked for
}

func startFailoverMonitor(c *cluster, l *failoverLedger, cl *client.Client, lost func(uint64) bool) *failoverMonitor {
	ctx, stop := context.WithCancel(context.Background())
	m := &failoverMonitor{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			m.look(ctx, c, l, cl, lost)
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return m
}

// look checks the leader's state once, then each node's applied state.
func (m *failoverMonitor) look(ctx context.Context, c *cluster, l *failoverLedger, cl *client.Client, lost func(uint64) bool) {
	asked := time.Now()
	before := l.outstanding()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if listing, err := listLoadLocks(ctx, cl); err == nil {
		l.checkListing("linearizable listing", listing, before, lost)
		m.mu.Lock()
		m.leaderChecks++
		m.lastLook = asked
		m.mu.Unlock()
	}
	for _, nd := range c.members() {
		if stale, err := listStale(ctx, nd.addr); err == nil {
			l.checkListing("applied state of "+nd.id, stale, nil, lost)
			m.mu.Lock()
			m.staleChecks++
			m.mu.Unlock()
		}
	}
}

func (m *failoverMonitor) lastLeaderLook() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastLook
}

func (m *failoverMonitor) counts() (leader, stale int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leaderChecks, m.staleChecks
}

func (m *failoverMonitor) close() {
	m.stop()
	<-m.done
}

// waitCaughtUp waits until the restarted node, asked directly, is a
// follower that has applied at least what the leader had committed when
// asked, and issued the same last token.
func waitCaughtUp(t *testing.T, c *cluster, restarted, newLeader *clusterNode, restartAt time.Time, rejoinedAfter time.Duration) {
	t.Helper()
	var leaderSt, st *fencev1.StatusResponse
	waitFor(t, 20*time.Second, restarted.id+" to catch up with the leader", func() bool {
		c.failIfDied(t)
		current := c.leaderNow()
		if current == nil || current == restarted {
			return false
		}
		var err error
		if leaderSt, err = c.statusOf(current); err != nil || leaderSt.GetState() != "Leader" {
			return false
		}
		if st, err = c.statusOf(restarted); err != nil {
			return false
		}
		return st.GetState() == "Follower" && st.GetAppliedIndex() >= leaderSt.GetCommitIndex() && st.GetLastToken() == leaderSt.GetLastToken()
	})
	t.Logf("%s rejoined %v after its restart and caught up %v after it: applied %d >= leader %s's commit %d, last token %d, term %d",
		restarted.id, rejoinedAfter.Round(time.Millisecond), time.Since(restartAt).Round(time.Millisecond),
		st.GetAppliedIndex(), leaderSt.GetNodeId(), leaderSt.GetCommitIndex(), st.GetLastToken(), st.GetTerm())
	if leaderSt.GetNodeId() != newLeader.id {
		t.Logf("leadership moved from %s to %s after the failover", newLeader.id, leaderSt.GetNodeId())
	}
}

// checkSameLocks waits until the restarted node's own applied state holds
// the same locks as the leader's. (Calls the stopped load gave up on may
// still be settling on the leader: a wait cancelled as it was granted gives
// the lock back.)
func checkSameLocks(t *testing.T, c *cluster, restarted *clusterNode, survivors []string, final *locksJSON) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var applied, current map[string]string
	waitFor(t, 10*time.Second, restarted.id+"'s applied state to hold the leader's locks", func() bool {
		stale, err := listStale(ctx, restarted.addr)
		if err != nil {
			return false
		}
		now, err := listLoadLocks(ctx, newClusterClient(t, survivors))
		if err != nil {
			return false
		}
		applied, current = holdersOf(stale), holdersOf(now)
		return maps.Equal(applied, current)
	})
	for name, h := range holdersOf(final) {
		if current[name] != h {
			t.Logf("after the load stopped, %s went from %s to %q", name, h, current[name])
		}
	}
}

// holdersOf maps each held lock of a listing to its holder and token.
func holdersOf(l *locksJSON) map[string]string {
	out := map[string]string{}
	for _, lk := range l.Locks {
		var hs []string
		for _, h := range lk.Holders {
			hs = append(hs, fmt.Sprintf("%d/%d", h.SessionID, h.Token))
		}
		if len(hs) > 0 {
			out[lk.Name] = strings.Join(hs, ",")
		}
	}
	return out
}

func TestClusterMembershipProcesses(t *testing.T) {
	c := startCluster(t, 3, "--heartbeat-timeout", "200ms", "--election-timeout", "200ms")
	endpoints := []string{"--endpoints", strings.Join(c.addrs(), ",")}

	// A fourth node, started with --join, waits to be added.
	addrs := freeAddrs(t, 2)
	n4 := &clusterNode{id: "n4", addr: addrs[0], raftAddr: addrs[1], dataDir: t.TempDir()}
	n4.args = append(append(n4.serveArgs(), "--join"), c.extra...)
	c.nodes = append(c.nodes, n4)
	if !n4.start(t) {
		t.Fatal("n4 could not bind its ports")
	}
	if out, errOut, code := runFence(t, append(endpoints, "members", "add", "n4", n4.raftAddr)...); code != 0 {
		t.Fatalf("fence members add exited %d: %s%s", code, out, errOut)
	}

	// It catches up: after a grant, its own last token is the leader's.
	cl := newClusterClient(t, c.addrs())
	s := newSession(t, cl, 10*time.Second, "e2e members")
	m := client.NewMutex(s, "members/a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("locking members/a: %v", err)
	}
	leader := c.waitLeader(t, 10*time.Second)
	waitFor(t, 15*time.Second, "n4 to catch up", func() bool {
		c.failIfDied(t)
		st, err := c.statusOf(n4)
		if err != nil || st.GetState() != "Follower" {
			return false
		}
		lst, err := c.statusOf(leader)
		return err == nil && st.GetLastToken() == lst.GetLastToken() && st.GetLastToken() >= g.Token()
	})

	// Remove a follower that is not n4.
	var victim *clusterNode
	for _, nd := range c.members()[:3] {
		if nd != leader {
			victim = nd
			break
		}
	}
	if out, errOut, code := runFence(t, append(endpoints, "members", "remove", victim.id)...); code != 0 {
		t.Fatalf("fence members remove %s exited %d: %s%s", victim.id, code, out, errOut)
	}
	var remaining []*clusterNode
	for _, nd := range c.members() {
		if nd != victim {
			remaining = append(remaining, nd)
		}
	}

	out, errOut, code := runFence(t, append(endpoints, "members", "list")...)
	if code != 0 {
		t.Fatalf("fence members list exited %d: %s", code, errOut)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 {
			listed = append(listed, f[0])
		}
	}
	slices.Sort(listed)
	var want []string
	for _, nd := range remaining {
		want = append(want, nd.id)
	}
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("fence members list shows %v, want %v:\n%s", listed, want, out)
	}

	// The group keeps serving: a lock can be taken, with a higher token,
	// through the remaining members only (the removed node still runs).
	out, errOut, code = runFence(t, "--endpoints", strings.Join(c.addrs(remaining...), ","),
		"lock", "--timeout", "20s", "members/b", "--", "sh", "-c", `echo "$FENCE_TOKEN"`)
	if code != 0 {
		t.Fatalf("fence lock after the removal exited %d: %s%s", code, out, errOut)
	}
	token, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil || token <= g.Token() {
		t.Errorf("fence lock after the removal printed token %q, want a number above %d", out, g.Token())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Errorf("unlocking members/a: %v", err)
	}
}
