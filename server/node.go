package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/server/internal/durable"
)

// node is this server's member of the raft group: the stable store in
// bbolt, the log in raft-wal segments or bbolt, file snapshots, a TCP
// transport, and the FSM.
type node struct {
	raft      *raft.Raft
	fsm       *fsm.FSM
	metrics   *storageMetrics // nil: not measured
	transport *raft.NetworkTransport
	links     *nodeLinkMux // the raft port's stream layer, with node links
	ident     *identity    // whom the data dir belongs to
	addrs     raft.ServerAddressProvider
	api       string // where this node serves the API, for hellos
	join      bool   // started with --join: added by the group, never founds one
	// rejoins answers members asking to be added again (rejoin.go).
	rejoins atomic.Pointer[func(rejoinRequest) rejoinAnswer]
	// lowDisk says the data dir's disk is low on space (diskwatch.go).
	lowDisk atomic.Bool
	// foundingSince is when the node, holding no data, began asking its
	// peers whether it founds the group with them, finding nothing wrong
	// and no peer holding data (bootstrapWhenAgreed; UnixNano, 0 when it
	// does not): for foundingGrace, admit refuses a voter's raft
	// connection as errFounding (founding).
	foundingSince atomic.Int64
	logger        *slog.Logger
	raftLog       *raftLogSink // raft's own lines, on their way to logger
	log           *durable.CheckedLog
	dataDir       string
	timeout       time.Duration
	heartbeat     time.Duration
	id            raft.ServerID
	// protocolVersion is raft's protocol version of this node, which its
	// own RPCs carry.
	protocolVersion raft.ProtocolVersion
	// closed is closed when the node starts to close: raft answers no
	// future still queued when it shuts down, so waits end on this instead.
	closed    chan struct{}
	closeOnce sync.Once
	// closeParts closes the parts the node was assembled from, but the
	// stream layer, which the transport closes (nodeParts.close).
	closeParts func() error
	// batcher groups the commands proposed while an entry is being
	// committed into one entry.
	batcher *batcher
}

// openNode opens the node's raft member from the data dir and the raft
// address (or from the parts cfg.openParts opens, in a test); api is the
// address this node's API is reached on, which it tells other nodes over
// node links. snapshotOpened learns the raft index of every snapshot
// opened, the one a restore reads included.
func openNode(cfg Config, api string, ident *identity, f *fsm.FSM, snapshotOpened func(index uint64), logger *slog.Logger, m *storageMetrics) (*node, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	hlog, sink := newRaftLog(logger)
	open := openParts
	if cfg.openParts != nil {
		open = cfg.openParts
	}
	parts, err := open(cfg, hlog, logger, snapshotOpened)
	if err != nil {
		return nil, err
	}
	n := &node{fsm: f, metrics: m, timeout: cfg.ApplyTimeout, heartbeat: cfg.HeartbeatTimeout, dataDir: cfg.DataDir, id: raft.ServerID(cfg.NodeID),
		ident: ident, addrs: cfg.RaftAddressProvider, api: api, join: cfg.Join, logger: logger, closed: make(chan struct{}), closeParts: parts.close}
	if err := n.assemble(cfg, parts, hlog); err != nil {
		n.close()
		return nil, err
	}
	sink.members.Store(n.raft)
	n.raftLog = sink
	n.batcher = newBatcher(n)
	n.links.serve(n)
	return n, nil
}

// assemble builds the node from its parts, as raft.NewRaft takes them,
// after checking them: every entry of the log, and the snapshots against
// the log, so that a damaged data dir is refused before raft reads it.
// raft reads the log through the checks, behind a cache of the newest
// entries, and reaches its peers through node links (nodelink.go), which
// introduce every connection.
func (n *node) assemble(cfg Config, parts nodeParts, hlog hclog.Logger) error {
	checked, err := durable.NewCheckedLog(parts.logs, parts.stable)
	if err != nil {
		return err
	}
	if n.metrics != nil {
		checked.AppendSeconds = n.metrics.logAppend
	}
	n.log = checked
	if err := checked.Verify(); err != nil {
		return durable.CorruptLogMessage(cfg.DataDir, durable.LocateDamage(cfg.DataDir, parts.wal, err))
	}
	if err := durable.CheckSnapshots(cfg.DataDir, parts.snaps, checked, n.logger); err != nil {
		return err
	}
	cache, err := raft.NewLogCache(1024, checked)
	if err != nil {
		return err
	}
	rc, err := raftConfig(cfg, hlog)
	if err != nil {
		return err
	}
	n.protocolVersion = rc.ProtocolVersion
	stream, err := parts.listen()
	if err != nil {
		return err
	}
	n.links = newNodeLinkMux(stream)
	n.transport = newTransport(cfg, n.links, hlog)
	// A node with no data starts without a configuration: Server.Start
	// bootstraps a new group only once it is sure the group is new
	// (bootstrap.go), and a node that joins is added by the group.
	n.raft, err = raft.NewRaft(rc, n.fsm, durable.DetachedLogs{LogCache: cache}, parts.stable, parts.snaps, n.transport)
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	return nil
}

// raftConfig is raft's configuration of a node.
func raftConfig(cfg Config, hlog hclog.Logger) (*raft.Config, error) {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.BatchApplyCh = true
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.SnapshotThreshold
	rc.NoLegacyTelemetry = true
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raft config: %w", err)
	}
	return rc, nil
}

// bootConfiguration is the first configuration of a new group: the static
// peers, or this node alone. A single node is a one-member raft group, so
// that growing it later takes the same path.
func bootConfiguration(cfg Config, self raft.ServerAddress) raft.Configuration {
	if len(cfg.Peers) == 0 {
		return raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: self}}}
	}
	ids := make([]string, 0, len(cfg.Peers))
	for id := range cfg.Peers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var conf raft.Configuration
	for _, id := range ids {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(cfg.Peers[id])})
	}
	return conf
}

// propose commits cmd and returns the result of applying it. It waits for
// the commit even when ctx ends first, because a command's effects (a grant)
// must be seen by whoever proposed it; ApplyTimeout bounds the wait, and
// the node's closing ends it. Commands proposed while another entry is
// being committed go together in one entry (see batcher). It also returns
// the command's fsm.Seq, which orders it among the effects the FSM's
// observer hears.
func (n *node) propose(cmd *fsmpb.Command) (fsm.Result, uint64, error) {
	data, err := fsm.Encode(cmd)
	if err != nil {
		return fsm.Result{}, 0, fmt.Errorf("encoding command: %w", err)
	}
	res, seq, err := n.batcher.propose(data)
	if err != nil {
		return fsm.Result{}, 0, n.raftError(err)
	}
	return res, uint64(seq), nil
}

// confirmLeadership proves that this node is the leader after the call: a
// group commits a barrier entry in this node's term. A quorum accepted an
// entry that did not exist before the call, and no quorum accepts one once
// it has voted in a newer term; the barrier also waits until every entry
// before it is applied. raft's VerifyLeader is not enough for a group: it
// counts answers to heartbeats that were sent before the call arrived, so a
// leader paused and resumed may count answers its followers gave before
// they elected another. A sole voter has nobody to be replaced by, and
// VerifyLeader answers at once.
func (n *node) confirmLeadership() error {
	var err error
	if n.soleVoter() {
		err = n.await(n.raft.VerifyLeader())
	} else {
		err = n.await(n.raft.Barrier(n.timeout))
	}
	if err != nil {
		return n.raftError(err)
	}
	return nil
}

// soleVoter reports whether this node is the only voter of the latest
// configuration.
func (n *node) soleVoter() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	voters := 0
	self := false
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters++
			self = self || srv.ID == n.id
		}
	}
	return voters == 1 && self
}

// problems lists what is wrong with the node's storage, for Status.
func (n *node) problem() string {
	if n.log != nil && n.log.Full() {
		return fmt.Sprintf("disk full: the last write to the raft log in %s found no space", n.dataDir)
	}
	return ""
}

func (n *node) isLeader() bool { return n.raft.State() == raft.Leader }

// leader is the leader this node knows of, if it has heard from it within
// half a heartbeat timeout (raft's leader sends a heartbeat every tenth):
// a leader that went silent (paused, its disk stuck) is not named, nor
// are calls forwarded to it, while the followers wait to elect another.
func (n *node) leader() (raft.ServerAddress, raft.ServerID) {
	addr, id := n.raft.LeaderWithID()
	if id == "" || id == n.id || time.Since(n.raft.LastContact()) <= n.heartbeat/2 {
		return addr, id
	}
	return "", ""
}

// raftError maps raft's failures to fence's errors: anything that a retry
// against the leader may fix is ErrUnavailable.
func (n *node) raftError(err error) error {
	addr, id := n.leader()
	switch {
	case errors.Is(err, syscall.ENOSPC), n.log != nil && n.log.Full():
		// raft reports a failed log write as text (%q), so the log store's
		// own record of it counts.
		return fmt.Errorf("%w: the data dir %s is out of space (%v); free space there or grow the volume", fence.ErrDiskFull, n.dataDir, err)
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrRaftShutdown),
		errors.Is(err, raft.ErrAbortedByRestore), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		if id == "" {
			return fmt.Errorf("%w: no leader is elected right now (%v); retry shortly", fence.ErrUnavailable, err)
		}
		return fmt.Errorf("%w: node is not the leader (%v); the leader is %s at %s", fence.ErrUnavailable, err, id, addr)
	}
	return err
}

// await waits for f, or until the node closes. hashicorp/raft answers a
// future it has dequeued when it shuts down, but not one still queued:
// waiting on that alone left a proposal, and Server.Close waiting for it,
// blocked for ever.
func (n *node) await(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.closed:
		return raft.ErrRaftShutdown
	}
}

func (n *node) close() error {
	n.closeOnce.Do(func() { close(n.closed) })
	var errs []error
	if n.raft != nil {
		errs = append(errs, n.raft.Shutdown().Error())
	}
	if n.transport != nil {
		errs = append(errs, n.transport.Close())
	}
	if n.closeParts != nil {
		errs = append(errs, n.closeParts())
	}
	return errors.Join(errs...)
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}
