package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/fencelock/fence/server/internal/durable"
)

// nodeParts are what a node is assembled from (node.assemble), opened, as
// raft.NewRaft takes them: the log as its store keeps it (the node checks
// it, and keeps a cache in front), raft's stable store, the snapshot store
// (the node checks its snapshots against the log) and the raft port's
// stream layer, which listen opens once the checks passed (so that a node
// refusing its data dir never answers a peer). openParts opens them from
// the data dir and the raft address; a test may open its own
// (Config.openParts), a log that fails its writes, say, around the real
// one.
type nodeParts struct {
	logs   raft.LogStore
	stable raft.StableStore
	snaps  raft.SnapshotStore
	listen func() (raft.StreamLayer, error)
	// wal says logs is a raft-wal log, for the report of a damaged entry.
	wal bool
	// close closes the stores; the stream layer is the transport's to
	// close.
	close func() error
}

// openParts opens a node's parts from cfg's data dir and raft address.
// snapshotOpened, if not nil, learns the index of every snapshot opened.
func openParts(cfg Config, hlog hclog.Logger, logger *slog.Logger, snapshotOpened func(index uint64)) (parts nodeParts, err error) {
	var closers []func() error
	parts.close = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			parts.close()
		}
	}()
	kind, err := logStoreKind(cfg.DataDir, cfg.LogStore)
	if err != nil {
		return parts, err
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return parts, fmt.Errorf("opening raft store in %s: %w", cfg.DataDir, err)
	}
	closers = append(closers, store.Close)
	parts.stable, parts.logs = store, store
	if kind == LogStoreWAL {
		parts.wal = true
		walDir := filepath.Join(cfg.DataDir, "wal")
		if parts.logs, err = openWAL(walDir, cfg.WALSegmentMB, hlog, &closers); err != nil {
			return parts, fmt.Errorf("opening raft log in %s: %w", cfg.DataDir, err)
		}
		if err := durable.CheckWALTail(walDir); err != nil {
			return parts, durable.CorruptLogMessage(cfg.DataDir, err)
		}
	}
	durable.RemoveUnfinishedSnapshots(cfg.DataDir, logger)
	fileSnaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hlog)
	if err != nil {
		return parts, fmt.Errorf("opening snapshot store: %w", err)
	}
	parts.snaps = durable.NewTidySnapshots(fileSnaps, cfg.DataDir, logger, snapshotOpened)
	parts.listen = func() (raft.StreamLayer, error) { return listenRaft(cfg) }
	return parts, nil
}

// openWAL opens the raft-wal log in dir, with segments of segmentMB (0:
// raft-wal's default), and adds what closes it to closers.
func openWAL(dir string, segmentMB int, hlog hclog.Logger, closers *[]func() error) (raft.LogStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// raft-wal v0.4.0's Close leaves its meta store open (and locked), so
	// the node owns the meta store and closes it itself.
	meta := &metadb.BoltMetaDB{}
	*closers = append(*closers, meta.Close)
	segment := wal.DefaultSegmentSize
	if segmentMB > 0 {
		segment = segmentMB << 20
	}
	w, err := wal.Open(dir, wal.WithLogger(hlog), wal.WithMetaStore(meta), wal.WithSegmentSize(segment))
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, w.Close)
	return durable.TruncatedWAL{WAL: w}, nil
}

// listenRaft listens for peers on the raft address.
func listenRaft(cfg Config) (raft.StreamLayer, error) {
	advertiseAddr := cfg.RaftAdvertise
	if advertiseAddr == "" {
		advertiseAddr = cfg.RaftListen
	}
	tcpAddr, err := net.ResolveTCPAddr("tcp", advertiseAddr)
	if err != nil {
		return nil, fmt.Errorf("raft advertise address: %w", err)
	}
	var advertise net.Addr // nil: the transport advertises the port it bound
	if tcpAddr.Port != 0 {
		advertise = tcpAddr
	}
	stream, err := listenPeerStream(cfg.RaftListen, advertise, cfg.PeerTLS)
	if err != nil {
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err)
	}
	return stream, nil
}

// newTransport is raft's transport over stream.
func newTransport(cfg Config, stream raft.StreamLayer, hlog hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
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
		Stream:          stream,
	})
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
