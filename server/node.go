package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

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
	metrics   *storageMetrics       // nil: not measured
	store     *raftboltdb.BoltStore // the stable store (term, vote), and the log with LogStoreBolt
	wal       *wal.WAL              // the log with LogStoreWAL
	walMeta   *metadb.BoltMetaDB
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
	// batcher groups the commands proposed while an entry is being
	// committed into one entry.
	batcher *batcher
}

// openNode opens the node's raft member; api is the address this node's
// API is reached on, which it tells other nodes over node links.
// snapshotOpened learns the raft index of every snapshot opened, the one
// a restore reads included.
func openNode(cfg Config, api string, ident *identity, f *fsm.FSM, snapshotOpened func(index uint64), logger *slog.Logger, m *storageMetrics) (*node, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	hlog, sink := newRaftLog(logger)
	n := &node{fsm: f, metrics: m, timeout: cfg.ApplyTimeout, heartbeat: cfg.HeartbeatTimeout, dataDir: cfg.DataDir, id: raft.ServerID(cfg.NodeID),
		ident: ident, addrs: cfg.RaftAddressProvider, api: api, join: cfg.Join, logger: logger, closed: make(chan struct{})}
	fail := func(err error) (*node, error) {
		n.close()
		return nil, err
	}
	// The parts, as raft.NewRaft takes them: each is opened and checked
	// here, so that a damaged data dir is refused before raft reads it.
	logs, err := n.openLog(cfg, hlog)
	if err != nil {
		return fail(err)
	}
	snaps, err := durable.OpenSnapshots(cfg.DataDir, n.log, hlog, logger, snapshotOpened)
	if err != nil {
		return fail(err)
	}
	if err := n.openTransport(cfg, hlog); err != nil {
		return fail(err)
	}
	rc, err := raftConfig(cfg, hlog)
	if err != nil {
		return fail(err)
	}
	n.protocolVersion = rc.ProtocolVersion
	// A node with no data starts without a configuration: Server.Start
	// bootstraps a new group only once it is sure the group is new
	// (bootstrap.go), and a node that joins is added by the group.
	n.raft, err = raft.NewRaft(rc, f, logs, n.store, snaps, n.transport)
	if err != nil {
		return fail(fmt.Errorf("starting raft: %w", err))
	}
	sink.members.Store(n.raft)
	n.raftLog = sink
	n.batcher = newBatcher(n)
	n.links.serve(n)
	return n, nil
}

// openLog opens the raft store (bbolt, which keeps raft's stable state,
// and the log unless it is a WAL), verifies every entry of the log, and
// returns the log raft reads, behind a cache of the newest entries.
func (n *node) openLog(cfg Config, hlog hclog.Logger) (raft.LogStore, error) {
	kind, err := logStoreKind(cfg.DataDir, cfg.LogStore)
	if err != nil {
		return nil, err
	}
	n.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("opening raft store in %s: %w", cfg.DataDir, err)
	}
	var logStore raft.LogStore = n.store
	if kind == LogStoreWAL {
		walDir := filepath.Join(cfg.DataDir, "wal")
		if err := os.MkdirAll(walDir, 0o700); err != nil {
			return nil, err
		}
		// raft-wal v0.4.0's Close leaves its meta store open (and locked),
		// so the node owns the meta store and closes it itself.
		n.walMeta = &metadb.BoltMetaDB{}
		segment := wal.DefaultSegmentSize
		if cfg.WALSegmentMB > 0 {
			segment = cfg.WALSegmentMB << 20
		}
		n.wal, err = wal.Open(walDir, wal.WithLogger(hlog), wal.WithMetaStore(n.walMeta), wal.WithSegmentSize(segment))
		if err != nil {
			return nil, fmt.Errorf("opening raft log in %s: %w", cfg.DataDir, err)
		}
		if err := durable.CheckWALTail(walDir); err != nil {
			return nil, durable.CorruptLogMessage(cfg.DataDir, err)
		}
		logStore = durable.TruncatedWAL{WAL: n.wal}
	}
	checked, err := durable.NewCheckedLog(logStore, n.store)
	if err != nil {
		return nil, err
	}
	if n.metrics != nil {
		checked.AppendSeconds = n.metrics.logAppend
	}
	n.log = checked
	if err := checked.Verify(); err != nil {
		return nil, durable.CorruptLogMessage(cfg.DataDir, durable.LocateDamage(cfg.DataDir, kind == LogStoreWAL, err))
	}
	cache, err := raft.NewLogCache(1024, checked)
	if err != nil {
		return nil, err
	}
	return durable.DetachedLogs{LogCache: cache}, nil
}

// openTransport listens for peers on the raft address, behind the node
// links' multiplexer (nodelink.go), which introduces every connection.
func (n *node) openTransport(cfg Config, hlog hclog.Logger) error {
	advertiseAddr := cfg.RaftAdvertise
	if advertiseAddr == "" {
		advertiseAddr = cfg.RaftListen
	}
	tcpAddr, err := net.ResolveTCPAddr("tcp", advertiseAddr)
	if err != nil {
		return fmt.Errorf("raft advertise address: %w", err)
	}
	var advertise net.Addr // nil: the transport advertises the port it bound
	if tcpAddr.Port != 0 {
		advertise = tcpAddr
	}
	stream, err := listenPeerStream(cfg.RaftListen, advertise, cfg.PeerTLS)
	if err != nil {
		return fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err)
	}
	n.links = newNodeLinkMux(stream)
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		ServerAddressProvider: cfg.RaftAddressProvider,
		// One AppendEntries in flight to a follower: no pipeline. raft's
		// pipeline deadlocks when a follower refuses an append (its log
		// write failed, or its log is behind): the goroutine that decodes
		// answers stops reading them, the next send waits for it forever,
		// the follower gets no entry from then on, and raft's Shutdown
		// hangs (seen here with failing disks; hashicorp/raft#612 reads
		// the same). fence keeps one batch in flight, so the pipeline
		// bought nothing measurable (hashicorp/raft#541 found it slows
		// commits under batching).
		MaxRPCsInFlight: 1,
		MaxPool:         3,
		Timeout:         10 * time.Second,
		Logger:          hlog,
		Stream:          n.links,
	})
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

// Log stores. Both keep raft's term and vote in raft-boltdb's raft.db.
const (
	// LogStoreWAL keeps the raft log in hashicorp/raft-wal segment files,
	// which append and fsync once per batch: commits take about two thirds
	// of the time they take with LogStoreBolt. The default for new data
	// dirs. It needs raft-wal v0.4.1 or newer: v0.4.0 sealed a segment
	// without an index when raft truncated the log's tail, as a follower
	// does after a leader change, and then could not reopen it
	// (hashicorp/raft-wal#31; fence check --nodes 3 found a node panicking
	// on restart, and TestWALReopensAfterTailAndHeadTruncation guards it).
	LogStoreWAL = "wal"
	// LogStoreBolt keeps the raft log in raft-boltdb's bbolt file, whose
	// transactions fsync twice per batch.
	LogStoreBolt = "bolt"
)

// logStoreKind returns the log store a data dir uses: the one it was
// created with, recorded in the file log-store, or want for a new dir.
func logStoreKind(dir, want string) (string, error) {
	marker := filepath.Join(dir, "log-store")
	data, err := os.ReadFile(marker)
	switch {
	case err == nil:
		have := string(trimNewline(data))
		if want != "" && have != want {
			return "", fmt.Errorf("data dir %s keeps its raft log in %q, not %q; start with --log-store %s", dir, have, want, have)
		}
		return have, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); err == nil {
		return "", fmt.Errorf("data dir %s has a raft.db but no log-store file; it was not written by this version of fence", dir)
	}
	if want == "" {
		want = LogStoreWAL
	}
	if err := os.WriteFile(marker, []byte(want+"\n"), 0o600); err != nil {
		return "", err
	}
	return want, nil
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
	if n.wal != nil {
		errs = append(errs, n.wal.Close(), n.walMeta.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}
