// Package check is fence's safety checker, in the style of Jepsen: worker
// processes take a lock and read-modify-write data in the fenced KV store
// (and optionally a fenced SQL table) while a seeded schedule of faults
// pauses them past their leases, kills them, and kills and restarts the
// server. From the history of every operation it checks that no stale
// write was accepted, no acknowledged increment or append was lost, grant
// tokens rise in real-time order, and the KV history is linearizable.
//
// With Unsafe, the workers write without tokens, to a resource that does
// not check them; the checker must then find lost updates, which shows
// that it can fail.
//
// It is part of the fence tool (cmd/fence/internal/): `fence check` and the
// workers it starts (`fence check-worker`) run it. It drives its processes
// with internal/proc and cuts its links with internal/testutil/netproxy.
package check

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/internal/testutil/netproxy"
)

// Config configures a run.
type Config struct {
	// Binary is the fence executable that runs the server and the workers.
	Binary string
	// Endpoints of a running service; empty starts servers of our own,
	// which allows the server faults.
	Endpoints []string
	// Nodes is how many servers to start when Endpoints is empty (default
	// 1). With 3 or 5, the leader faults apply.
	Nodes    int
	Workers  int
	Duration time.Duration
	Seed     uint64
	// TTL of the workers' sessions; pauses of workers last longer than it.
	// Zero means 1s, or, when pause-leader may be injected, a TTL of 3 to
	// 4s that each worker process draws from the seeded schedule (see
	// workerTTL).
	TTL time.Duration
	// Faults to inject, from FaultKinds; nil means all that apply.
	Faults []string
	// FaultInterval is the mean time between faults.
	FaultInterval time.Duration
	Unsafe        bool
	// Postgres is a DSN; when set, workers also increment a fenced counter there.
	Postgres string
	// DataDir holds the server's data; empty means a temporary directory.
	DataDir string
	// Log receives progress lines.
	Log io.Writer
}

// Fault kinds.
const (
	FaultPause      = "pause"       // SIGSTOP a worker past its TTL, then SIGCONT
	FaultKillWorker = "kill-worker" // SIGKILL a worker, start a new one
	FaultKillServer = "kill-server" // SIGKILL a server, restart it on its data
	FaultKillLeader = "kill-leader" // SIGKILL the cluster's leader, restart it
	FaultPartition  = "partition"   // cut the leader off from the majority, then heal
	// FaultPauseLeader: SIGSTOP the leader until after the others elected
	// a new one and before keepalives sent to it time out, then SIGCONT:
	// the deposed leader must not answer them as if it still led.
	FaultPauseLeader   = "pause-leader"
	FaultPauseFollower = "pause-follower" // SIGSTOP a follower for about a TTL, then SIGCONT
	// FaultCorruptFollower: SIGKILL a follower, damage its raft log (in the
	// middle: it must refuse to start; a torn tail: it must start), undo
	// the damage and restart it.
	FaultCorruptFollower = "corrupt-follower"
	// FaultDiskFull: fill the disk of the leader or of a follower (each
	// node runs on a small tmpfs of its own; Linux, as root) for 1 to 3s,
	// then free it.
	FaultDiskFull = "disk-full"
	// FaultWipe: SIGKILL a follower (or, one time in four, the leader),
	// delete its data dir, and start it again with its flags, as a pod
	// restarted on an empty volume. It must not found a group of its own;
	// the group's leader adds it again (auto-rejoin), and it comes back as
	// a voter once it has caught up. One time in four the leader is killed
	// too, as it adds the follower again. Only while every node is up and
	// a voter, one node at a time.
	FaultWipe = "wipe"
	// FaultForeignAdd: start a single node of a group of its own, and ask
	// the checked group to add it as a new member. The group must refuse
	// (ErrMembership, naming both groups) and stay as it was, and the node
	// must go on leading its own group.
	FaultForeignAdd = "foreign-add"
)

// FaultKinds lists the faults the checker knows, in a stable order.
var FaultKinds = []string{FaultPause, FaultKillWorker, FaultKillServer, FaultKillLeader, FaultPartition, FaultPauseLeader, FaultPauseFollower, FaultCorruptFollower, FaultDiskFull, FaultWipe, FaultForeignAdd}

// FaultEvent is a fault that was injected.
type FaultEvent struct {
	Kind   string
	Target string
	Start  time.Time
	End    time.Time
	// Note is what the fault step saw of the fault's effect, if anything.
	Note string
	// Outcome is, for the faults that have one to tell, what became of it
	// in a few fixed words ("back as a voter", "refused"): the summary
	// counts them.
	Outcome string
}

// Result is a run's outcome.
type Result struct {
	Seed     uint64
	Faults   []FaultEvent
	Ops      []Op
	Final    Final
	Analysis Analysis
	Started  time.Time
	Ended    time.Time
}

// Failed reports whether any guarantee was broken.
func (r *Result) Failed() bool { return len(r.Analysis.Violations) > 0 }

// kill kills p's process group and waits until p is reaped.
func kill(p *proc.Process) {
	_ = p.Kill()
	<-p.Done()
}

type runner struct {
	cfg     Config
	rng     *rand.Rand
	hist    *History
	prefix  string
	log     io.Writer
	mu      sync.Mutex
	nodes   []*node // the servers the checker runs, if any
	links   map[[2]int]*netproxy.Link
	workers []*proc.Process
	runs    []int
	ttls    []time.Duration // of each worker's current process
	drawTTL bool            // each worker process draws its TTL
	faults  []FaultEvent
	// found are violations the fault steps saw themselves.
	found   []Violation
	dataDir string
	wg      sync.WaitGroup
	// clusterID is the group's id: the workers talk to it alone.
	clusterID string
	// smallDisks gives each node a small disk of its own, to fill.
	smallDisks bool
	// unrejoined are the wiped nodes not yet voters again when their
	// fault ended.
	unrejoined []pendingRejoin
	// foreign counts the foreign nodes started, to name their data dirs.
	foreign int
}

// Run runs the checker and returns what it found. An error means the run
// itself could not be carried out; broken guarantees are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := proc.CanPause(); err != nil {
		return nil, fmt.Errorf("fence check pauses and resumes processes: %w", err)
	}
	r, kinds, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	cfg = r.cfg
	res := &Result{Seed: cfg.Seed, Started: time.Now()}
	// Stopped however the run ends, a failed start included: it may have
	// started some nodes and mounted their disks.
	defer r.stopAll()
	if len(cfg.Endpoints) == 0 {
		if err := r.startServers(ctx); err != nil {
			return nil, err
		}
	}
	if r.clusterID, err = groupOf(ctx, r.cfg.Endpoints); err != nil {
		return nil, err
	}
	var sql *sqlCounter
	if cfg.Postgres != "" {
		if sql, err = openSQLCounter(ctx, cfg.Postgres, r.prefix); err != nil {
			return nil, err
		}
		defer sql.Close()
	}
	r.workers = make([]*proc.Process, cfg.Workers)
	r.runs = make([]int, cfg.Workers)
	r.ttls = make([]time.Duration, cfg.Workers)
	for i := range r.workers {
		if err := r.startWorker(i); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(r.log, "check: %d workers, seed %d, faults %v, TTLs %v, for %v\n", cfg.Workers, cfg.Seed, kinds, r.ttls, cfg.Duration)

	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	r.injectFaults(runCtx, kinds)
	cancel()
	r.stopWorkers()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.settleRejoins(ctx)
	res.Final, err = r.readFinal(ctx, sql)
	if err != nil {
		if dead := r.deadNodes(); len(dead) > 0 {
			err = fmt.Errorf("%w; %s", err, dead[0].Detail)
		}
		if other := r.checkGroups(ctx); len(other) > 0 {
			err = fmt.Errorf("%w; %s", err, other[0].Detail)
		}
		return nil, err
	}
	res.Ended = time.Now()
	res.Ops = r.hist.Ops()
	res.Faults = r.faults
	res.Analysis = Analyze(res.Ops, res.Final, r.prefix, 30*time.Second)
	res.Analysis.Violations = append(res.Analysis.Violations, r.deadNodes()...)
	res.Analysis.Violations = append(res.Analysis.Violations, r.checkGroups(ctx)...)
	r.mu.Lock()
	res.Analysis.Violations = append(res.Analysis.Violations, r.found...)
	r.mu.Unlock()
	return res, nil
}

// newRunner makes the runner of a run of cfg, its defaults filled in, and
// the kinds of fault it injects.
func newRunner(cfg Config) (*runner, []string, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 5
	}
	if cfg.FaultInterval <= 0 {
		cfg.FaultInterval = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Nodes <= 0 {
		cfg.Nodes = 1
	}
	r := &runner{
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
		hist:   newHistory(),
		prefix: fmt.Sprintf("check/%d-%d/", cfg.Seed, time.Now().UnixNano()),
		log:    cfg.Log,
	}
	kinds, err := r.faultKinds()
	if err != nil {
		return nil, nil, err
	}
	r.drawTTL = r.cfg.TTL <= 0 && slices.Contains(kinds, FaultPauseLeader)
	r.smallDisks = slices.Contains(kinds, FaultDiskFull)
	if r.cfg.TTL <= 0 {
		r.cfg.TTL = time.Second
	}
	return r, kinds, nil
}

func (r *runner) addViolation(v Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.found = append(r.found, v)
}

func (r *runner) faultKinds() ([]string, error) {
	kinds := r.cfg.Faults
	if kinds == nil {
		kinds = FaultKinds
	}
	var out []string
	for _, k := range kinds {
		known := false
		for _, f := range FaultKinds {
			known = known || f == k
		}
		if !known {
			return nil, fmt.Errorf("unknown fault %q: want one of %v", k, FaultKinds)
		}
		if k == FaultKillServer && len(r.cfg.Endpoints) > 0 {
			continue // not our server to kill
		}
		if groupFault(k) && (len(r.cfg.Endpoints) > 0 || r.cfg.Nodes < 3) {
			continue // needs a cluster of our own
		}
		if k == FaultDiskFull {
			if len(r.cfg.Endpoints) > 0 {
				continue // not our servers' disks
			}
			if err := canFillDisks(); err != nil {
				if r.cfg.Faults != nil {
					return nil, err
				}
				continue
			}
		}
		out = append(out, k)
	}
	return out, nil
}

// groupFault reports whether a fault needs a group of the checker's own.
func groupFault(kind string) bool {
	switch kind {
	case FaultKillLeader, FaultPartition, FaultPauseLeader, FaultPauseFollower, FaultCorruptFollower, FaultWipe, FaultForeignAdd:
		return true
	}
	return false
}

// workerTTL draws the TTL of a worker process about to start. With
// pause-leader and no TTL given it is 3 to 4s, so that the window
// pauseLeaderHold aims for exists: keepalives go out every TTL/3, and one
// sent to the paused leader must have been sent more than the client's
// safety margin (100ms and 1% of the TTL) after the new leader took over,
// 0.3 to 0.6s after the pause began with the checker's 250ms raft
// timeouts. Each process draws its own, so that the workers' keepalives,
// which start in step, drift apart: a pause then catches each at another
// point of its cycle, and one worker can lose its session while another
// is renewed by the deposed leader.
func (r *runner) workerTTL() time.Duration {
	if !r.drawTTL {
		return r.cfg.TTL
	}
	return 3*time.Second + time.Duration(r.rng.IntN(1001))*time.Millisecond
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (r *runner) startWorker(i int) error {
	r.runs[i]++
	r.ttls[i] = r.workerTTL()
	args := []string{"check-worker", "--endpoints", strings.Join(r.cfg.Endpoints, ","), "--cluster-id", r.clusterID, "--id", strconv.Itoa(i), "--run", strconv.Itoa(r.runs[i]),
		"--ttl", r.ttls[i].String(), "--prefix", r.prefix, "--seed", strconv.FormatUint(r.cfg.Seed, 10)}
	if r.cfg.Unsafe {
		args = append(args, "--unsafe")
	}
	if r.cfg.Postgres != "" {
		args = append(args, "--postgres", r.cfg.Postgres)
	}
	p, err := proc.Start(proc.Spec{
		Name:          fmt.Sprintf("worker %d", i),
		Path:          r.cfg.Binary,
		Args:          args,
		Lines:         true,
		Stderr:        proc.NewPrefixWriter(os.Stderr, ""),
		StderrBytes:   8 << 10,
		DieWithParent: true,
	})
	if err != nil {
		return err
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for l := range p.Lines() {
			var op Op
			if json.Unmarshal([]byte(l.Text), &op) == nil {
				r.hist.add(op)
			}
		}
	}()
	r.mu.Lock()
	r.workers[i] = p
	r.mu.Unlock()
	return nil
}

// stopWorkers ends every worker (continuing any paused one first) and
// waits until their reports are read.
func (r *runner) stopWorkers() {
	for _, p := range r.workers {
		if p != nil {
			_ = p.Terminate()
		}
	}
	timeout := time.After(10 * time.Second)
	for _, p := range r.workers {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		case <-timeout:
			kill(p)
		}
	}
	r.wg.Wait()
}

func (r *runner) stopAll() {
	r.stopWorkers()
	for _, n := range r.nodes {
		if n != nil { // a failed start may leave some unmade
			n.stop()
		}
	}
	r.unmountDisks()
	for _, l := range r.links {
		l.Close()
	}
	if len(r.nodes) > 0 && r.cfg.DataDir == "" {
		os.RemoveAll(r.dataDir)
	}
}

// readFinal reads the counter, the list and the txn workload's keys once
// every worker has stopped.
func (r *runner) readFinal(ctx context.Context, sql *sqlCounter) (Final, error) {
	// A node the last fault killed may still be starting, and this client
	// has not talked to the group yet: it waits for the nodes as long as
	// for a leader.
	c, err := client.New(client.WithEndpoints(r.cfg.Endpoints...), client.WithClusterID(r.clusterID),
		client.WithRetryBudget(30*time.Second), client.WithDialTimeout(30*time.Second))
	if err != nil {
		return Final{}, err
	}
	defer c.Close()
	var f Final
	from, to := moveKeys(r.prefix)
	for key, dst := range map[string]*string{r.prefix + "counter": &f.Counter, r.prefix + "list": &f.List, from: &f.MoveFrom, to: &f.MoveTo} {
		kv, err := c.KV().Get(ctx, key)
		if err != nil {
			return Final{}, fmt.Errorf("reading %s at the end: %w", key, err)
		}
		if kv != nil {
			*dst = string(kv.GetValue())
		}
	}
	if sql != nil {
		if f.SQLCounter, err = sql.value(ctx); err != nil {
			return Final{}, err
		}
		f.HaveSQL = true
	}
	return f, nil
}
