package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// node is this server's member of the raft group: the log and stable store
// in bbolt, file snapshots, a TCP transport, and the FSM.
type node struct {
	raft      *raft.Raft
	fsm       *fsm.FSM
	store     *raftboltdb.BoltStore
	transport *raft.NetworkTransport
	timeout   time.Duration
}

func openNode(cfg Config, f *fsm.FSM, logger *slog.Logger) (*node, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	hlog := hclog.New(&hclog.LoggerOptions{
		Name:   "raft",
		Level:  hclog.Warn,
		Output: slogWriter{logger},
	})
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("opening raft log in %s: %w", cfg.DataDir, err)
	}
	n := &node{fsm: f, store: store, timeout: cfg.ApplyTimeout}
	fail := func(err error) (*node, error) {
		n.close()
		return nil, err
	}
	logs, err := raft.NewLogCache(1024, store)
	if err != nil {
		return fail(err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
	if err != nil {
		return fail(fmt.Errorf("opening snapshot store: %w", err))
	}
	tcpAddr, err := net.ResolveTCPAddr("tcp", cfg.RaftListen)
	if err != nil {
		return fail(fmt.Errorf("raft listen address: %w", err))
	}
	var advertise net.Addr // nil: the transport advertises the port it bound
	if tcpAddr.Port != 0 {
		advertise = tcpAddr
	}
	n.transport, err = raft.NewTCPTransportWithConfig(cfg.RaftListen, advertise, &raft.NetworkTransportConfig{
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  hlog,
	})
	if err != nil {
		return fail(fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err))
	}

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
		return fail(fmt.Errorf("raft config: %w", err))
	}

	exists, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return fail(err)
	}
	if !exists {
		// A single node is a one-member raft group, bootstrapped on first start.
		boot := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter,
			ID:       rc.LocalID,
			Address:  n.transport.LocalAddr(),
		}}}
		if err := raft.BootstrapCluster(rc, logs, store, snaps, n.transport, boot); err != nil {
			return fail(fmt.Errorf("bootstrapping: %w", err))
		}
	}
	n.raft, err = raft.NewRaft(rc, f, logs, store, snaps, n.transport)
	if err != nil {
		return fail(fmt.Errorf("starting raft: %w", err))
	}
	return n, nil
}

// propose commits cmd and returns the result of applying it. It waits for
// the commit even when ctx ends first, because a command's effects (a grant)
// must be seen by whoever proposed it; ApplyTimeout bounds the wait.
func (n *node) propose(cmd *fsmpb.Command) (fsm.Result, error) {
	data, err := fsm.Encode(cmd)
	if err != nil {
		return fsm.Result{}, fmt.Errorf("encoding command: %w", err)
	}
	f := n.raft.Apply(data, n.timeout)
	if err := f.Error(); err != nil {
		return fsm.Result{}, n.raftError(err)
	}
	res, ok := f.Response().(fsm.Result)
	if !ok {
		return fsm.Result{}, fmt.Errorf("raft returned %T, not a result", f.Response())
	}
	return res, nil
}

// verifyLeader confirms with a quorum that this node is still the leader.
func (n *node) verifyLeader() error {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return n.raftError(err)
	}
	return nil
}

func (n *node) isLeader() bool { return n.raft.State() == raft.Leader }

// raftError maps raft's failures to fence's errors: anything that a retry
// against the leader may fix is ErrUnavailable.
func (n *node) raftError(err error) error {
	addr, id := n.raft.LeaderWithID()
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrRaftShutdown),
		errors.Is(err, raft.ErrAbortedByRestore):
		if id == "" {
			return fmt.Errorf("%w: no leader is elected right now (%v); retry shortly", fence.ErrUnavailable, err)
		}
		return fmt.Errorf("%w: node is not the leader (%v); the leader is %s at %s", fence.ErrUnavailable, err, id, addr)
	}
	return err
}

func (n *node) close() error {
	var errs []error
	if n.raft != nil {
		errs = append(errs, n.raft.Shutdown().Error())
	}
	if n.transport != nil {
		errs = append(errs, n.transport.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}

// slogWriter feeds hclog's formatted lines into slog.
type slogWriter struct{ logger *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	if w.logger != nil {
		w.logger.Warn(string(trimNewline(p)), "component", "raft")
	}
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
