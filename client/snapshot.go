package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
)

// SnapshotHeader describes a snapshot's body: the raft index and term of
// the state, its last token, the body's size and SHA-256.
type SnapshotHeader = fencev1.SnapshotHeader

// Snapshot is a copy of the service's state on its way from the leader,
// for a backup: Header describes it, and Read returns the body. Read
// fails, rather than return io.EOF, if the body does not match the
// header's size and SHA-256. Close it when done. It is not safe for
// concurrent use.
type Snapshot struct {
	Header *SnapshotHeader

	stream *connect.ServerStreamForClient[fencev1.SnapshotResponse]
	cancel context.CancelFunc
	buf    []byte
	read   uint64
	sum    hash.Hash
	err    error
}

// Snapshot asks the leader for a copy of the state, taken at a
// linearizable point: it holds every write acknowledged before the call.
// It returns once the header has arrived; the body streams through the
// Snapshot's Read, bounded by ctx. Until the header arrives the call is
// retried like any other, on Unavailable; a transfer broken off later
// fails the Read and is not retried.
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	var snap *Snapshot
	err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := ep.cluster.Snapshot(sctx, connect.NewRequest(&fencev1.SnapshotRequest{}))
		if err != nil {
			cancel()
			return err
		}
		if !stream.Receive() {
			err := stream.Err()
			stream.Close()
			cancel()
			if err == nil {
				err = errors.New("the node ended the snapshot before its header")
			}
			return err
		}
		h := stream.Msg().GetHeader()
		if h == nil {
			stream.Close()
			cancel()
			return errors.New("the node's first snapshot message has no header")
		}
		snap = &Snapshot{Header: h, stream: stream, cancel: cancel, sum: sha256.New()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// Read reads the snapshot's body.
func (s *Snapshot) Read(p []byte) (int, error) {
	for len(s.buf) == 0 && s.err == nil {
		s.err = s.next()
	}
	if len(s.buf) == 0 {
		return 0, s.err
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

// next receives the next chunk, or checks the body at its end.
func (s *Snapshot) next() error {
	if s.stream.Receive() {
		chunk := s.stream.Msg().GetChunk()
		if s.read += uint64(len(chunk)); s.read > s.Header.GetSize() {
			return fmt.Errorf("the snapshot's body runs past the %d bytes its header announced", s.Header.GetSize())
		}
		s.sum.Write(chunk)
		s.buf = chunk
		return nil
	}
	if err := s.stream.Err(); err != nil {
		return fmt.Errorf("the snapshot transfer broke off after %d of %d bytes: %w", s.read, s.Header.GetSize(), rpcerr.FromConnect(err))
	}
	if s.read != s.Header.GetSize() {
		return fmt.Errorf("the snapshot transfer ended after %d of %d bytes", s.read, s.Header.GetSize())
	}
	if got := s.sum.Sum(nil); !bytes.Equal(got, s.Header.GetSha256()) {
		return fmt.Errorf("the snapshot's body arrived damaged: SHA-256 %s, its header says %s", hex.EncodeToString(got), hex.EncodeToString(s.Header.GetSha256()))
	}
	return io.EOF
}

// Close ends the transfer.
func (s *Snapshot) Close() error {
	s.cancel()
	return s.stream.Close()
}
