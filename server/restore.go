package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/server/internal/durable"
)

// DefaultRestoreBump is how far RestoreSnapshot raises the restored
// state's counters by default: more than a group issues tokens in a day
// at its full rate, so that nothing the old group handed out after the
// snapshot was taken is handed out again.
const DefaultRestoreBump = 1_000_000_000

// RestoreResult says what RestoreSnapshot wrote.
type RestoreResult struct {
	// Header is the snapshot file's.
	Header SnapshotHeader
	// LastToken is the restored state's last token (the snapshot's, plus
	// the bump); the next grant gets a higher one.
	LastToken uint64
	// Members are the voters of the restored group's configuration.
	Members []string
}

// keyCurrentTerm is where raft keeps its current term in the stable store
// (hashicorp/raft's own key, part of its data format).
var keyCurrentTerm = []byte("CurrentTerm")

// RestoreSnapshot makes a new data dir, cfg.DataDir, from which a node
// starts with the state of the snapshot file at path: etcdctl snapshot
// restore. The directory must not exist or be empty. It holds a raft
// snapshot of the state at the file's index and term with a fresh
// configuration, cfg.Peers (or this node alone, at its raft advertise
// address), an empty log, the file's term as the current term, and a token
// reserve that covers the restored tokens. Every member of a restored
// group is restored from the same file with the same Peers.
//
// bump raises the restored state's token counter, session ids, acquire
// attempts and KV revision by that much, so that the group's tokens and
// ids continue above everything the group the snapshot came from may have
// handed out after it was taken (etcdctl's --bump-revision); a watch from
// a revision before the restored one is answered ErrCompacted. 0 keeps
// them as they are.
func RestoreSnapshot(cfg Config, path string, bump uint64) (*RestoreResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if cfg.Join {
		return nil, errors.New("a restored node starts a group of its own; it cannot --join one")
	}
	file, err := ReadSnapshotFile(path)
	if err != nil {
		return nil, err
	}
	state := proto.Clone(file.state).(*fsmpb.Snapshot)
	if err := bumpCounters(state, bump); err != nil {
		return nil, err
	}
	// A restored group is a new group, as etcd's restore makes a new
	// cluster: its first leader names it afresh, so that clients of the
	// group the snapshot came from, still running, never mix the two
	// (docs/design.md, "One group per client").
	state.ClusterId = ""
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(state)
	if err != nil {
		return nil, err
	}
	if err := makeEmptyDir(cfg.DataDir); err != nil {
		return nil, err
	}
	res, err := writeRestoredDir(cfg, file.Header, state, body)
	if err != nil {
		return nil, fmt.Errorf("restoring %s into %s: %w (remove the data dir before trying again)", path, cfg.DataDir, err)
	}
	return res, nil
}

// bumpCounters raises the state's counters by bump, and checks that the
// result is still a consistent state.
func bumpCounters(st *fsmpb.Snapshot, bump uint64) error {
	if bump == 0 {
		return nil
	}
	for _, c := range []*uint64{&st.LastToken, &st.LastSessionId, &st.LastAttempt, &st.KvRevision} {
		if *c+bump < *c {
			return fmt.Errorf("raising the snapshot's counters by %d would overflow; choose a smaller bump", bump)
		}
		*c += bump
	}
	if _, err := fsm.Restore(st); err != nil {
		return fmt.Errorf("the bumped state is inconsistent: %w", err)
	}
	return nil
}

// makeEmptyDir creates dir, or accepts an existing empty one.
func makeEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("data dir %s is not empty (it holds %s); a restore makes a new data dir: name one that does not exist or is empty", dir, entries[0].Name())
	}
	return nil
}

func writeRestoredDir(cfg Config, h SnapshotHeader, state *fsmpb.Snapshot, body []byte) (*RestoreResult, error) {
	dir := cfg.DataDir
	if _, err := logStoreKind(dir, cfg.LogStore); err != nil {
		return nil, err
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		return nil, err
	}
	// A node starting from the snapshot must not campaign in a term below
	// the snapshot's last entry's: its log would hold an entry of an
	// older term after one of a newer, and elections compare last terms.
	err = store.SetUint64(keyCurrentTerm, h.Term)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing the raft term: %w", err)
	}
	self := raft.ServerAddress(cfg.RaftListen)
	if cfg.RaftAdvertise != "" {
		self = raft.ServerAddress(cfg.RaftAdvertise)
	}
	conf := bootConfiguration(cfg, self)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, raftLog(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, err
	}
	// The store encodes the configuration for raft's old protocol through
	// a transport; an in-memory one does.
	_, trans := raft.NewInmemTransport(self)
	defer trans.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, h.Index, h.Term, conf, h.Index, trans)
	if err != nil {
		return nil, err
	}
	if _, err := sink.Write(body); err != nil {
		sink.Cancel()
		return nil, err
	}
	if err := sink.Close(); err != nil {
		return nil, err
	}
	if err := checkRestoredSnapshot(snaps, body); err != nil {
		return nil, err
	}
	reserve, err := durable.OpenTokenReserve(dir)
	if err != nil {
		return nil, err
	}
	if err := reserve.Set(state.GetLastToken()); err != nil {
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		return nil, err
	}
	res := &RestoreResult{Header: h, LastToken: state.GetLastToken()}
	for _, srv := range conf.Servers {
		res.Members = append(res.Members, fmt.Sprintf("%s=%s", srv.ID, srv.Address))
	}
	return res, nil
}

// checkRestoredSnapshot reads the snapshot just written back from the
// store, as raft will when the node starts.
func checkRestoredSnapshot(snaps raft.SnapshotStore, body []byte) error {
	metas, err := snaps.List()
	if err != nil || len(metas) != 1 {
		return fmt.Errorf("the snapshot store lists %d snapshots (%v), want the one just written", len(metas), err)
	}
	_, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		return err
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	if string(got) != string(body) {
		return errors.New("the snapshot written does not read back the same")
	}
	return nil
}
