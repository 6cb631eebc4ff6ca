package check

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/internal/testutil/netproxy"
)

// node is a server process the checker runs and may kill and restart.
type node struct {
	r     *runner
	index int
	// id is the node's --node-id: n1, n2, ... for the group's members.
	id     string
	api    string
	raft   string
	dir    string
	args   []string
	proc   *proc.Process
	logDir string
	// mounted is set while the node's data dir is a small disk of its own.
	mounted bool
}

func (n *node) name() string { return "node " + n.id }

// newNode makes a node to run from dir, on ports of its own, with the
// arguments of fence serve every node of the checker's takes; the caller
// adds the group's.
func (r *runner) newNode(index int, id, dir string) (*node, error) {
	n := &node{r: r, index: index, id: id, dir: dir}
	var err error
	if n.api, err = freePort(); err != nil {
		return nil, err
	}
	if n.raft, err = freePort(); err != nil {
		return nil, err
	}
	timeout := "100ms"
	if r.cfg.Nodes > 1 {
		timeout = "250ms"
	}
	n.args = []string{"serve", "--node-id", id, "--data-dir", dir,
		"--listen", n.api, "--raft-listen", n.raft, "--heartbeat-timeout", timeout, "--election-timeout", timeout, "--log-level", "warn"}
	return n, nil
}

// startServers starts the checker's own servers: one, or a group whose raft
// links each go through a proxy that a partition can cut.
func (r *runner) startServers(ctx context.Context) error {
	var err error
	r.dataDir = r.cfg.DataDir
	if r.dataDir == "" {
		if r.dataDir, err = os.MkdirTemp("", "fence-check-"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(r.dataDir, 0o700); err != nil {
		return err
	}
	r.nodes = make([]*node, r.cfg.Nodes)
	for i := range r.nodes {
		id := fmt.Sprintf("n%d", i+1)
		if r.nodes[i], err = r.newNode(i, id, filepath.Join(r.dataDir, id)); err != nil {
			return err
		}
	}
	r.links = map[[2]int]*netproxy.Link{}
	var peers []string
	for _, n := range r.nodes {
		peers = append(peers, n.id+"="+n.raft)
		r.cfg.Endpoints = append(r.cfg.Endpoints, n.api)
	}
	for _, n := range r.nodes {
		if r.smallDisks {
			// Small log segments and frequent snapshots: a node writes new
			// files often, so a full disk bites within the fault, not only
			// once a 64 MiB segment, taken when it started, fills up.
			n.args = append(n.args, "--wal-segment-mb", "1", "--snapshot-threshold", "128", "--snapshot-interval", "500ms")
		}
		if len(r.nodes) > 1 {
			var dial []string
			for _, to := range r.nodes {
				if to == n {
					continue
				}
				l, err := netproxy.Listen(to.raft)
				if err != nil {
					return err
				}
				r.links[[2]int{n.index, to.index}] = l
				dial = append(dial, fmt.Sprintf("%s=%s", to.id, l.Addr()))
			}
			n.args = append(n.args, "--peers", strings.Join(peers, ","), "--raft-dial", strings.Join(dial, ","))
		}
	}
	if r.smallDisks {
		if err := r.mountDisks(); err != nil {
			return err
		}
	}
	for _, n := range r.nodes {
		if err := n.launch(); err != nil {
			return err
		}
	}
	return waitServing(ctx, r.nodes)
}

// launch starts the node's server process, its output appended to its
// log file. While the node was down another process may have taken one of
// its ports for an outgoing connection (they come from the same range as
// freePort's); a start that fails for that is tried again.
func (n *node) launch() error {
	for try := 0; ; try++ {
		if err := n.launchOnce(); err != nil {
			return err
		}
		n.r.mu.Lock()
		p := n.proc
		n.r.mu.Unlock()
		if p.Wait(context.Background(), 300*time.Millisecond) != nil || !strings.Contains(p.Stderr(), "address already in use") {
			return nil
		}
		if try == 20 {
			return fmt.Errorf("%s could not start: one of its ports stayed in use by another process:\n%s", n.name(), proc.LastLines(p.Stderr(), 4))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *node) launchOnce() error {
	logFile, err := os.OpenFile(n.dir+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	p, err := proc.Start(proc.Spec{
		Name:          n.name(),
		Path:          n.r.cfg.Binary,
		Args:          n.args,
		Env:           nodeEnv(os.Environ()),
		Stdout:        logFile,
		Stderr:        logFile,
		StderrBytes:   8 << 10,
		DieWithParent: true,
	})
	if err != nil {
		logFile.Close()
		return err
	}
	go func() {
		<-p.Done()
		logFile.Close()
	}()
	n.r.mu.Lock()
	n.proc = p
	n.r.mu.Unlock()
	return nil
}

// nodeEnv is environ without its FENCE_ variables: a node of the check is
// set by its flags alone, never by settings meant for the user's own nodes
// (fence serve reads FENCE_CONFIG, FENCE_MAX_SESSIONS...).
func nodeEnv(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool { return strings.HasPrefix(kv, "FENCE_") })
}

// stop asks the node to exit, and kills it if it has not within 5s.
func (n *node) stop() {
	if n.proc == nil {
		return
	}
	_ = n.proc.Terminate()
	if n.proc.Wait(context.Background(), 5*time.Second) != nil {
		kill(n.proc)
	}
}

// waitServing waits until one of nodes answers /healthz: a leader is elected.
func waitServing(ctx context.Context, nodes []*node) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			resp, err := http.Get("http://" + n.api + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return errors.New("no server became healthy within 30s; see the logs in the data dir")
}

// groupOf returns the id of the group every endpoint belongs to, once each
// has answered with one. Endpoints of two groups are an error: a port of
// the checker's own servers taken by another deployment, or a mistyped
// --endpoints; the run would mix two histories and prove nothing. The ids
// are read from the nodes' answers, not from the client: an answer may
// carry no group in its headers (a node names it there only once it knows
// it, and a proxy may drop it), and a client learns its group from them.
func groupOf(ctx context.Context, endpoints []string) (string, error) {
	c, err := client.New(client.WithEndpoints(endpoints...))
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ids := make([]string, len(endpoints))
	for {
		for i, ep := range endpoints {
			if ids[i] != "" {
				continue
			}
			st, err := c.StatusOf(ctx, ep)
			if errors.Is(err, fence.ErrWrongCluster) {
				return "", fmt.Errorf("%w; the run would mix two histories", err)
			}
			if err == nil {
				ids[i] = st.GetClusterId()
			}
		}
		if !slices.Contains(ids, "") {
			break
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the node at %s did not say which group it is of within 30s", endpoints[slices.Index(ids, "")])
		case <-time.After(50 * time.Millisecond):
		}
	}
	for i, id := range ids {
		if id != ids[0] {
			return "", fmt.Errorf("%w: the node at %s is of group %s, and the node at %s of group %s; the run would mix two histories",
				fence.ErrWrongCluster, endpoints[0], ids[0], endpoints[i], id)
		}
	}
	return ids[0], nil
}

// restartNode kills a node with SIGKILL and starts it again with its
// flags, after whileDown, if any, has done its part to the data dir.
func (r *runner) restartNode(n *node, whileDown func() error) {
	kill(n.proc)
	if whileDown != nil {
		if err := whileDown(); err != nil {
			fmt.Fprintf(r.log, "check: %s: %v\n", n.name(), err)
		}
	}
	time.Sleep(time.Duration(r.rng.IntN(500)) * time.Millisecond)
	if err := n.launch(); err != nil {
		fmt.Fprintf(r.log, "check: restarting %s: %v\n", n.name(), err)
	}
}

// leaderNode asks every node and returns the one that says it leads (of
// the run's group: a node of another group is not asked).
func (r *runner) leaderNode() *node {
	c, err := client.New(client.WithEndpoints(r.cfg.Endpoints...), client.WithClusterID(r.clusterID))
	if err != nil {
		return nil
	}
	defer c.Close()
	for _, n := range r.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.StatusOf(ctx, n.api)
		cancel()
		if err == nil && st.GetState() == "Leader" {
			return n
		}
	}
	return nil
}

// partition cuts (or heals) every raft link to and from n.
func (r *runner) partition(n *node, cut bool) {
	keys := make([][2]int, 0, len(r.links))
	for k := range r.links {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]*100+keys[i][1] < keys[j][0]*100+keys[j][1] })
	for _, k := range keys {
		if k[0] == n.index || k[1] == n.index {
			r.links[k].SetCut(cut)
		}
	}
}

// deadNodes reports the servers that exited without being killed: a node
// that cannot restart on its own data after SIGKILL breaks durability.
func (r *runner) deadNodes() []Violation {
	var out []Violation
	for _, n := range r.nodes {
		select {
		case <-n.proc.Done():
			log, _ := os.ReadFile(n.dir + ".log")
			out = append(out, Violation{Kind: ViolationNodeDied, Detail: fmt.Sprintf("%s exited by itself; the end of its log:\n%s", n.name(), proc.LastLines(string(log), 8))})
		default:
		}
	}
	return out
}

// pauseTarget picks the node a pause fault stops: the leader, or one of
// the followers at random.
func (r *runner) pauseTarget(kind string) *node {
	leader := r.leaderNode()
	if leader == nil || kind == FaultPauseLeader {
		return leader
	}
	return r.follower(leader)
}

// follower picks one of the nodes other than leader at random.
func (r *runner) follower(leader *node) *node {
	var followers []*node
	for _, n := range r.nodes {
		if n != leader {
			followers = append(followers, n)
		}
	}
	return followers[r.rng.IntN(len(followers))]
}

// serverPauseHold draws how long a pause fault stops a server.
func (r *runner) serverPauseHold(kind string) time.Duration {
	if kind == FaultPauseLeader {
		return r.pauseLeaderHold()
	}
	return time.Duration((0.5 + r.rng.Float64()) * float64(slices.Max(r.ttls)))
}

// pauseLeaderHold draws how long to stop the leader, so that it is deposed
// and then, continued, may answer a keepalive a worker sent it while it was
// stopped as if it still led. The worker's client awaits that keepalive
// until its safe-until: at most 0.99*TTL - 100ms after its last renewal,
// sent before the pause. The new leader gives each session a full TTL
// from its election, and expires the worker's session only if the
// worker's next keepalive, TTL/3 after the stale answer, comes later. So
// the pause must outlast 2*TTL/3 plus the election (0.4 to 0.7s measured
// with the checker's 250ms raft timeouts), and any more only narrows the
// set of workers whose keepalive is still awaited. It is aimed at one
// worker's TTL, drawn at random, plus an election of 0.5 to 0.8s.
func (r *runner) pauseLeaderHold() time.Duration {
	ttl := r.ttls[r.rng.IntN(len(r.ttls))]
	election := 500*time.Millisecond + time.Duration(r.rng.IntN(301))*time.Millisecond
	return 2*ttl/3 + election
}
