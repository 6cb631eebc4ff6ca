package client

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/rpcerr"
)

// watchKind is how the client opens and reads one kind of watch stream
// (KV changes, lock events).
type watchKind[Resp, Ev any] struct {
	// call opens the stream on ep from revision start (0: from now), the
	// server sending progress every interval while it has nothing else.
	call func(ctx context.Context, ep *endpoint, start uint64, interval time.Duration) (*connect.ServerStreamForClient[Resp], error)
	// events are a message's events, and revision an event's.
	events   func(*Resp) []Ev
	revision func(Ev) uint64
	// header is the revision of the first message: the watch gets every
	// event after it. reached is the revision a progress message says
	// every event up to was delivered (0 if it says none).
	header  func(*Resp) uint64
	reached func(*Resp) uint64
}

// resumingWatch delivers a watch's events and, when its stream breaks (the
// node it is on fails or loses leadership), opens it again on the leader
// from the revision after the last one it delivered.
type resumingWatch[Resp, Ev any] struct {
	c    *Client
	kind watchKind[Resp, Ev]
	// next is the revision the stream opens at: the first event not yet
	// delivered (0 until the first stream said where it started).
	next   uint64
	events chan Ev
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

// startWatch opens the watch from start (0: from now) and returns once it
// is in place.
func startWatch[Resp, Ev any](ctx context.Context, c *Client, kind watchKind[Resp, Ev], start uint64) (*resumingWatch[Resp, Ev], error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &resumingWatch[Resp, Ev]{c: c, kind: kind, next: start, events: make(chan Ev), cancel: cancel, done: make(chan struct{})}
	stream, header, err := w.open(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	// A broken stream resumes at the first event not yet delivered: the
	// one asked for, or the first after the watch was in place.
	if w.next == 0 {
		w.next = header + 1
	}
	go w.run(ctx, stream)
	return w, nil
}

// watchStream is one Watch call on one node, with the watchdog that ends
// it when the node sends nothing (no event, no progress) for too long.
type watchStream[Resp any] struct {
	*connect.ServerStreamForClient[Resp]
	ep       *endpoint
	cancel   context.CancelFunc
	watchdog *time.Timer
	limit    time.Duration
	silent   atomic.Bool
}

// close ends the call.
func (s *watchStream[Resp]) close() {
	s.Close()
	s.cancel()
}

// receive waits for the next message, for at most the stream's limit.
func (s *watchStream[Resp]) receive() bool {
	s.watchdog.Reset(s.limit)
	ok := s.Receive()
	s.watchdog.Stop()
	return ok
}

// err says why the stream ended; a silent node's end is ErrUnavailable.
func (s *watchStream[Resp]) err() error {
	if s.silent.Load() {
		s.ep.silentUntil.Store(s.ep.clk.Now().Add(silentFor).UnixNano())
		return fmt.Errorf("%w: %s sent nothing on the watch for %v", fence.ErrUnavailable, s.ep.url, s.limit)
	}
	return rpcerr.FromConnect(s.Err())
}

// open starts the stream at w.next and waits for the server's "in place"
// message, whose revision it returns. The server sends progress every
// attempt timeout while there is no event; a stream silent for two of
// those and one more is given up for another node.
func (w *resumingWatch[Resp, Ev]) open(ctx context.Context) (*watchStream[Resp], uint64, error) {
	var (
		stream *watchStream[Resp]
		rev    uint64
	)
	interval := w.c.opts.attempt
	err := w.c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		sctx, cancel := context.WithCancel(ctx)
		s := &watchStream[Resp]{ep: ep, cancel: cancel, limit: 3 * interval}
		s.watchdog = time.AfterFunc(s.limit, func() { s.silent.Store(true); cancel() })
		conn, err := w.kind.call(sctx, ep, w.next, interval)
		if err == nil {
			s.ServerStreamForClient = conn
			if s.receive() {
				stream, rev = s, w.kind.header(conn.Msg())
				return nil
			}
			err = s.err()
			conn.Close()
		} else if s.silent.Load() {
			err = s.err()
		}
		s.watchdog.Stop()
		cancel()
		return err
	})
	return stream, rev, err
}

func (w *resumingWatch[Resp, Ev]) run(ctx context.Context, stream *watchStream[Resp]) {
	defer close(w.done)
	defer close(w.events)
	for {
		err := w.deliver(ctx, stream)
		stream.close()
		if ctx.Err() != nil {
			w.err = ctx.Err()
			return
		}
		if !errors.Is(err, fence.ErrUnavailable) {
			w.err = err
			return
		}
		if stream, _, err = w.open(ctx); err != nil {
			w.err = err
			return
		}
	}
}

// deliver passes the stream's events on until it ends, and returns why.
func (w *resumingWatch[Resp, Ev]) deliver(ctx context.Context, stream *watchStream[Resp]) error {
	for stream.receive() {
		msg := stream.Msg()
		for _, ev := range w.kind.events(msg) {
			select {
			case w.events <- ev:
				w.next = w.kind.revision(ev) + 1
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if rev := w.kind.reached(msg); rev >= w.next {
			w.next = rev + 1
		}
	}
	if err := stream.err(); err != nil {
		return err
	}
	// The server ended the stream without an error: as good as a break.
	return fmt.Errorf("%w: the watch stream ended", fence.ErrUnavailable)
}

// Err returns why the watch ended, once its events' channel is closed.
func (w *resumingWatch[Resp, Ev]) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Close ends the watch and waits for its goroutine to exit.
func (w *resumingWatch[Resp, Ev]) Close() {
	w.cancel()
	<-w.done
}
