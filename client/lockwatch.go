package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// LockEvent is one change to a watched lock: a grant, a release, a
// holder's expiry, revoke or abandonment, a wait queued or given up, a
// lock-delay started or ended (GetType says which). Its revision names
// it on every node.
type LockEvent = fencev1.LockEvent

// LockWatch streams what happens to the locks under a prefix; see
// Client.WatchLocks. Its methods are safe for concurrent use.
type LockWatch struct {
	w *resumingWatch[fencev1.LockWatchResponse, *LockEvent]
}

// lockWatch is how a watch of the locks under prefix is opened and read.
func lockWatch(prefix string) watchKind[fencev1.LockWatchResponse, *LockEvent] {
	return watchKind[fencev1.LockWatchResponse, *LockEvent]{
		call: func(ctx context.Context, ep *endpoint, start uint64, interval time.Duration) (*connect.ServerStreamForClient[fencev1.LockWatchResponse], error) {
			return ep.locks.Watch(ctx, connect.NewRequest(&fencev1.LockWatchRequest{Prefix: prefix, StartRevision: start, ProgressInterval: durationpb.New(interval)}))
		},
		events:   (*fencev1.LockWatchResponse).GetEvents,
		revision: (*LockEvent).GetRevision,
		header:   (*fencev1.LockWatchResponse).GetRevision,
		reached: func(m *fencev1.LockWatchResponse) uint64 {
			if m.GetProgress() {
				return m.GetRevision()
			}
			return 0
		},
	}
}

// WatchLocks watches the locks whose names start with prefix ("" for
// every lock) and returns once the watch is in place. It delivers, in the
// order they happened, the events from fromRevision on (first those the
// leader still keeps, then new ones), or with fromRevision 0 every event
// after WatchLocks returns. Pass the last revision seen + 1 to pick up
// where an earlier watch ended. With auth on, it needs lock read on
// prefix.
//
// When the stream breaks (the node it is on fails or loses leadership),
// the watch resumes on the leader after the last revision it delivered,
// within the client's retry budget: every node numbers the events alike,
// so none is missed or delivered twice. It ends, with Err saying why, when
// ctx ends, when it cannot resume in time, when the leader no longer keeps
// the events it missed (fence.ErrCompacted: list the locks, and watch
// again from now), or when the caller loses its permission
// (fence.ErrPermissionDenied, fence.ErrAuthFailed).
func (c *Client) WatchLocks(ctx context.Context, prefix string, fromRevision uint64) (*LockWatch, error) {
	w, err := startWatch(ctx, c, lockWatch(prefix), fromRevision)
	if err != nil {
		return nil, err
	}
	return &LockWatch{w: w}, nil
}

// Events delivers the events; it is closed when the watch ends, after
// which Err says why.
func (w *LockWatch) Events() <-chan *LockEvent { return w.w.events }

// Err returns why the watch ended, once Events is closed.
func (w *LockWatch) Err() error { return w.w.Err() }

// Close ends the watch and waits for its goroutine to exit.
func (w *LockWatch) Close() { w.w.Close() }
