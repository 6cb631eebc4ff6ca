package client

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
)

// KeyValue is one key of the fenced KV store.
type KeyValue = fencev1.KeyValue

// KV is the service's fenced key-value store: it keeps, per key, the highest
// fencing token it accepted and refuses writes with a lower one
// (fence.ErrStaleToken, as a *fence.StaleTokenError). Get it from Client.KV.
// It is safe for concurrent use.
type KV struct{ c *Client }

// KV returns the client's view of the fenced KV store.
func (c *Client) KV() *KV { return &KV{c: c} }

// WriteOption fences a KV write, or binds a put's key to a session.
type WriteOption func(*writeOptions)

type writeOptions struct {
	fence   fencev1.Fence
	session uint64
	secret  string // session's
}

// WithGrant fences the write with a grant's lock and token.
func WithGrant(g *Grant) WriteOption {
	return func(o *writeOptions) { o.fence.Lock, o.fence.Token = g.Lock(), g.Token() }
}

// FencedBy fences the write with a lock name and token, as passed on by
// `fence lock` in FENCE_LOCK and FENCE_TOKEN. (fencing.WithToken, by
// contrast, puts a token in a context for a resource's middleware.)
func FencedBy(lock string, token uint64) WriteOption {
	return func(o *writeOptions) { o.fence.Lock, o.fence.Token = lock, token }
}

// Strict requires the token to be the lock's current grant, not only at
// least the highest the key has seen (fence.ErrNotHolder otherwise).
func Strict() WriteOption {
	return func(o *writeOptions) { o.fence.Strict = true }
}

// IfRevision makes the write a compare-and-swap: it applies only if the
// key's mod revision is rev (0: the key must not exist), and fails with
// fence.ErrRevisionMismatch otherwise.
func IfRevision(rev uint64) WriteOption {
	return func(o *writeOptions) { o.fence.ExpectRevision = &rev }
}

// BoundTo binds the key of a Put to session s: the service deletes the key
// when the session ends, closed or expired, like a key on an etcd lease or
// a ZooKeeper ephemeral node (presence, service registration). Each Put
// binds anew, so a Put without BoundTo unbinds the key. Delete ignores it.
func BoundTo(s *Session) WriteOption {
	return func(o *writeOptions) { o.session, o.secret = s.id, s.secret }
}

func writeOpts(opts []WriteOption) *writeOptions {
	o := &writeOptions{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// Put writes value under key and returns the key's new mod revision. A
// retry after a lost answer is applied once: every attempt carries the
// call's idempotency key. A call that fails with fence.ErrUnavailable may
// or may not have applied.
func (k *KV) Put(ctx context.Context, key string, value []byte, opts ...WriteOption) (uint64, error) {
	o := writeOpts(opts)
	req := &fencev1.PutRequest{Key: key, Value: value, Fence: &o.fence, SessionId: o.session, SessionSecret: o.secret}
	var rev uint64
	once := newIdempotencyKey()
	op := &fencev1.StreamRequest{IdempotencyKey: once, Op: &fencev1.StreamRequest_Put{Put: req}}
	err := k.c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := k.c.op(ctx, ep, op)
		if err == nil {
			rev = resp.GetPut().GetRevision()
		}
		return err
	})
	return rev, err
}

// Get reads key, linearizably unless Stale is given. It returns nil and no
// error when the key does not exist.
func (k *KV) Get(ctx context.Context, key string, opts ...ReadOption) (*KeyValue, error) {
	var kv *KeyValue
	stale := readOpts(opts).stale
	op := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Get{Get: &fencev1.GetRequest{Key: key, Stale: stale}}}
	err := k.c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := k.c.op(ctx, ep, op)
		if err == nil && resp.GetGet().GetFound() {
			kv = resp.GetGet().GetKv()
		}
		return err
	})
	return kv, err
}

// Delete removes key, fenced like Put, and reports whether it existed.
func (k *KV) Delete(ctx context.Context, key string, opts ...WriteOption) (bool, error) {
	req := &fencev1.DeleteRequest{Key: key, Fence: &writeOpts(opts).fence}
	var deleted bool
	once := newIdempotencyKey()
	op := &fencev1.StreamRequest{IdempotencyKey: once, Op: &fencev1.StreamRequest_Delete{Delete: req}}
	err := k.c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := k.c.op(ctx, ep, op)
		if err == nil {
			deleted = resp.GetDelete().GetDeleted()
		}
		return err
	})
	return deleted, err
}

// Listing is what List read.
type Listing struct {
	// KVs are the keys, in key order.
	KVs []*KeyValue
	// More is true when more keys match than were returned.
	More bool
	// Revision is the store's revision when the keys were read: a Watch
	// with FromRevision(Revision+1) delivers every change after the list.
	Revision uint64
}

// List reads up to 1000 keys that start with prefix, in key order;
// linearizably unless Stale is given.
func (k *KV) List(ctx context.Context, prefix string, opts ...ReadOption) (*Listing, error) {
	var l *Listing
	stale := readOpts(opts).stale
	err := k.c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.List(ctx, connect.NewRequest(&fencev1.ListRequest{Prefix: prefix, Stale: stale}))
		if err == nil {
			l = &Listing{KVs: resp.Msg.GetKvs(), More: resp.Msg.GetMore(), Revision: resp.Msg.GetRevision()}
		}
		return err
	})
	return l, err
}

// Event is a change to a watched key.
type Event = fencev1.Event

// Watch streams the changes to keys that start with prefix.
type Watch struct {
	kv     *KV
	req    *fencev1.WatchRequest
	events chan *Event
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

// WatchOption configures a Watch.
type WatchOption func(*watchOptions)

type watchOptions struct{ startRevision uint64 }

// FromRevision starts the watch at revision rev: the changes already made
// from rev on are delivered first, then new ones. Watch from the revision
// of a List plus one to see every change after the list, or from the last
// revision seen plus one to resume. A revision older than the recent
// changes the server keeps (--watch-history) fails with fence.ErrCompacted.
func FromRevision(rev uint64) WatchOption {
	return func(o *watchOptions) { o.startRevision = rev }
}

// Watch starts watching prefix and returns once the watch is in place:
// every change committed after Watch returns is delivered, in commit order
// (and, with FromRevision, those before it from that revision on).
//
// When the stream breaks (the node it is on fails or loses leadership),
// the watch resumes on the leader from the revision after the last one it
// saw, within the client's retry budget, so that no change is missed or
// delivered twice. It ends, with Err saying why, when ctx ends, when it
// cannot resume in time, or when the leader no longer keeps the changes it
// missed (fence.ErrCompacted: List again, and watch from there).
func (k *KV) Watch(ctx context.Context, prefix string, opts ...WatchOption) (*Watch, error) {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &fencev1.WatchRequest{Prefix: prefix, StartRevision: o.startRevision}
	ctx, cancel := context.WithCancel(ctx)
	w := &Watch{kv: k, req: req, events: make(chan *Event), cancel: cancel, done: make(chan struct{})}
	stream, rev, err := w.open(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	// A broken stream resumes at the first change not yet delivered: the
	// one asked for, or the first after the watch was in place.
	if req.StartRevision == 0 {
		req.StartRevision = rev + 1
	}
	go w.run(ctx, stream)
	return w, nil
}

// watchStream is one Watch call on one node, with the watchdog that ends
// it when the node sends nothing (no change, no progress) for too long.
type watchStream struct {
	*connect.ServerStreamForClient[fencev1.WatchResponse]
	ep       *endpoint
	cancel   context.CancelFunc
	watchdog *time.Timer
	limit    time.Duration
	silent   atomic.Bool
}

// close ends the call.
func (s *watchStream) close() {
	s.Close()
	s.cancel()
}

// receive waits for the next message, for at most the stream's limit.
func (s *watchStream) receive() bool {
	s.watchdog.Reset(s.limit)
	ok := s.Receive()
	s.watchdog.Stop()
	return ok
}

// err says why the stream ended; a silent node's end is ErrUnavailable.
func (s *watchStream) err() error {
	if s.silent.Load() {
		s.ep.silentUntil.Store(time.Now().Add(silentFor).UnixNano())
		return fmt.Errorf("%w: %s sent nothing on the watch for %v", fence.ErrUnavailable, s.ep.url, s.limit)
	}
	return rpcerr.FromConnect(s.Err())
}

// open starts the stream at w.req and waits for the server's "in place"
// message, which carries the store's revision. The server sends progress
// every attempt timeout while there is no change; a stream silent for two
// of those and one more is given up for another node.
func (w *Watch) open(ctx context.Context) (*watchStream, uint64, error) {
	var (
		stream *watchStream
		rev    uint64
	)
	interval := w.kv.c.opts.attempt
	w.req.ProgressInterval = durationpb.New(interval)
	err := w.kv.c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		sctx, cancel := context.WithCancel(ctx)
		s := &watchStream{ep: ep, cancel: cancel, limit: 3 * interval}
		s.watchdog = time.AfterFunc(s.limit, func() { s.silent.Store(true); cancel() })
		conn, err := ep.kv.Watch(sctx, connect.NewRequest(w.req))
		if err == nil {
			s.ServerStreamForClient = conn
			if s.receive() {
				stream, rev = s, conn.Msg().GetRevision()
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

func (w *Watch) run(ctx context.Context, stream *watchStream) {
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
func (w *Watch) deliver(ctx context.Context, stream *watchStream) error {
	for stream.receive() {
		for _, ev := range stream.Msg().GetEvents() {
			select {
			case w.events <- ev:
				w.req.StartRevision = ev.GetKv().GetModRevision() + 1
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if err := stream.err(); err != nil {
		return err
	}
	// The server ended the stream without an error: as good as a break.
	return fmt.Errorf("%w: the watch stream ended", fence.ErrUnavailable)
}

// Events delivers the changes; it is closed when the watch ends, after
// which Err says why.
func (w *Watch) Events() <-chan *Event { return w.events }

// Err returns why the watch ended, once Events is closed.
func (w *Watch) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Close ends the watch and waits for its goroutine to exit.
func (w *Watch) Close() {
	w.cancel()
	<-w.done
}
