package durable

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// TidySnapshots is raft's file snapshot store, cleaned up after failures.
// raft's store leaves a snapshot's temporary dir behind when it fails
// while starting the snapshot (writing meta.json), or when the sink's last
// flush fails on Close or Cancel: both what a full disk does. Each such
// dir holds part of a snapshot, and with snapshots retried every few
// seconds they would fill a disk that had just been freed, until the next
// restart removed them (RemoveUnfinishedSnapshots). (hashicorp/raft#714;
// the state file such a sink leaves open is closed by its finalizer once
// raft drops the sink, which the space of the removed file waits for.)
type TidySnapshots struct {
	*raft.FileSnapshotStore
	dir    string // the store's snapshots dir
	logger *slog.Logger
	// opened, if set, learns the index of each snapshot opened. raft
	// opens the one it restores just before the FSM reads it, on the
	// FSM's goroutine (at start, or from the leader), so the index last
	// opened when the FSM reports a restore is the restored state's: the
	// lock watch numbers its events from there. (A backup opens the
	// leader's latest snapshot too, but a leader restores none.)
	opened func(index uint64)
}

// NewTidySnapshots wraps store, the file snapshot store of dataDir;
// opened, if not nil, learns the index of each snapshot opened.
func NewTidySnapshots(store *raft.FileSnapshotStore, dataDir string, logger *slog.Logger, opened func(index uint64)) *TidySnapshots {
	return &TidySnapshots{FileSnapshotStore: store, dir: filepath.Join(dataDir, "snapshots"), logger: logger, opened: opened}
}

// Open opens the snapshot id, and tells the index it opens to the
// function NewTidySnapshots was given.
func (t *TidySnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := t.FileSnapshotStore.Open(id)
	if err == nil && t.opened != nil {
		t.opened(meta.Index)
	}
	return meta, rc, err
}

// Create starts a snapshot; a failure removes the dir it left.
func (t *TidySnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := t.FileSnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		// raft names the dir term-index-milliseconds.tmp, and tells
		// nobody the milliseconds.
		tmps, _ := filepath.Glob(filepath.Join(t.dir, fmt.Sprintf("%d-%d-*.tmp", term, index)))
		for _, tmp := range tmps {
			t.remove(tmp)
		}
		return nil, err
	}
	return &tidySink{SnapshotSink: sink, tmp: filepath.Join(t.dir, sink.ID()+".tmp"), store: t}, nil
}

func (t *TidySnapshots) remove(tmp string) {
	if err := os.RemoveAll(tmp); err != nil {
		t.logger.Warn("could not remove a failed snapshot", "dir", tmp, "err", err)
		return
	}
	t.logger.Info("removed a failed snapshot", "dir", tmp)
}

// tidySink removes its snapshot's temporary dir when the snapshot fails.
type tidySink struct {
	raft.SnapshotSink
	tmp   string
	store *TidySnapshots
}

func (s *tidySink) Close() error {
	err := s.SnapshotSink.Close()
	if err != nil {
		s.clean()
	}
	return err
}

func (s *tidySink) Cancel() error {
	err := s.SnapshotSink.Cancel()
	s.clean()
	return err
}

func (s *tidySink) clean() {
	if _, err := os.Stat(s.tmp); err == nil {
		s.store.remove(s.tmp)
	}
}
