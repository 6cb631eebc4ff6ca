package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
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
	once := newIdempotencyKey()
	op := &fencev1.StreamRequest{IdempotencyKey: once, Op: &fencev1.StreamRequest_Put{Put: req}}
	return callOp(ctx, k.c, op, func(resp *fencev1.StreamResponse) uint64 { return resp.GetPut().GetRevision() })
}

// Get reads key, linearizably unless Stale is given. It returns nil and no
// error when the key does not exist.
func (k *KV) Get(ctx context.Context, key string, opts ...ReadOption) (*KeyValue, error) {
	stale := readOpts(opts).stale
	op := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Get{Get: &fencev1.GetRequest{Key: key, Stale: stale}}}
	return callOp(ctx, k.c, op, func(resp *fencev1.StreamResponse) *KeyValue {
		if !resp.GetGet().GetFound() {
			return nil
		}
		return resp.GetGet().GetKv()
	})
}

// Delete removes key, fenced like Put, and reports whether it existed.
func (k *KV) Delete(ctx context.Context, key string, opts ...WriteOption) (bool, error) {
	req := &fencev1.DeleteRequest{Key: key, Fence: &writeOpts(opts).fence}
	once := newIdempotencyKey()
	op := &fencev1.StreamRequest{IdempotencyKey: once, Op: &fencev1.StreamRequest_Delete{Delete: req}}
	return callOp(ctx, k.c, op, func(resp *fencev1.StreamResponse) bool { return resp.GetDelete().GetDeleted() })
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
	w *resumingWatch[fencev1.WatchResponse, *Event]
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

// kvWatch is how a KV watch of prefix is opened and read.
func kvWatch(prefix string) watchKind[fencev1.WatchResponse, *Event] {
	return watchKind[fencev1.WatchResponse, *Event]{
		call: func(ctx context.Context, ep *endpoint, start uint64, interval time.Duration) (*connect.ServerStreamForClient[fencev1.WatchResponse], error) {
			return ep.kv.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: prefix, StartRevision: start, ProgressInterval: durationpb.New(interval)}))
		},
		events:   (*fencev1.WatchResponse).GetEvents,
		revision: func(ev *Event) uint64 { return ev.GetKv().GetModRevision() },
		header:   (*fencev1.WatchResponse).GetRevision,
		reached:  func(*fencev1.WatchResponse) uint64 { return 0 },
	}
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
	w, err := startWatch(ctx, k.c, kvWatch(prefix), o.startRevision)
	if err != nil {
		return nil, err
	}
	return &Watch{w: w}, nil
}

// Events delivers the changes; it is closed when the watch ends, after
// which Err says why.
func (w *Watch) Events() <-chan *Event { return w.w.events }

// Err returns why the watch ended, once Events is closed.
func (w *Watch) Err() error { return w.w.Err() }

// Close ends the watch and waits for its goroutine to exit.
func (w *Watch) Close() { w.w.Close() }
