package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsmpb"
)

// snapshotChunk is the most body bytes one SnapshotResponse carries.
const snapshotChunk = 1 << 20

// Snapshot implements fencev1connect.ClusterServiceHandler: a copy of the
// state for a backup, taken on the leader at a linearizable point.
//
// A barrier committed in this node's term proves it still leads and waits
// until every entry before it is applied, so the state includes every
// write acknowledged before the call arrived. raft then snapshots the
// state machine between two applies, which gives the exact index and term
// of the state; the snapshot is also kept in the leader's snapshot store,
// as a scheduled one would be (consul snapshot save does the same).
func (s handlers) Snapshot(ctx context.Context, _ *connect.Request[fencev1.SnapshotRequest], stream *connect.ServerStream[fencev1.SnapshotResponse]) error {
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	if err := s.node.await(s.node.raft.Barrier(s.cfg.ApplyTimeout)); err != nil {
		return s.node.raftError(err)
	}
	future := s.node.raft.Snapshot()
	if err := future.Error(); err != nil {
		return fmt.Errorf("%w: taking a snapshot: %v", fence.ErrUnavailable, err)
	}
	meta, rc, err := future.Open()
	if err != nil {
		return fmt.Errorf("%w: opening the snapshot just taken: %v", fence.ErrUnavailable, err)
	}
	body, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return fmt.Errorf("%w: reading the snapshot just taken: %v", fence.ErrUnavailable, err)
	}
	var state fsmpb.Snapshot
	if err := proto.Unmarshal(body, &state); err != nil {
		return fmt.Errorf("the snapshot just taken does not decode: %w", err)
	}
	sum := sha256.Sum256(body)
	header := &fencev1.SnapshotHeader{
		Index: meta.Index, Term: meta.Term, LastToken: state.GetLastToken(),
		Size: uint64(len(body)), Sha256: sum[:], NodeId: s.cfg.NodeID, Version: s.cfg.Version,
	}
	s.logger.Info("snapshot sent for a backup", "index", meta.Index, "term", meta.Term, "bytes", len(body))
	if err := stream.Send(&fencev1.SnapshotResponse{Header: header}); err != nil {
		return err
	}
	for len(body) > 0 {
		n := min(len(body), snapshotChunk)
		if err := stream.Send(&fencev1.SnapshotResponse{Chunk: body[:n]}); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}
