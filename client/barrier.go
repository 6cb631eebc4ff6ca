package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// Barrier holds back any number of waiters until it is lifted, like etcd's
// recipe Barrier or Curator's DistributedBarrier: one party Holds it,
// others Wait, and Release lets them all through at once. It is a key of
// the KV store ("barrier/" + name) that exists while the barrier is held.
// The key is not bound to a session: a holder that dies leaves the
// barrier held, so that nobody goes past a gate whose holder did not open
// it (Release it by hand, or from another process, to go on).
//
// A Barrier is safe for concurrent use.
type Barrier struct {
	c   *Client
	key string
}

// NewBarrier returns the barrier name.
func NewBarrier(c *Client, name string) *Barrier {
	return &Barrier{c: c, key: "barrier/" + name}
}

// Hold raises the barrier. Holding a barrier already held does nothing.
func (b *Barrier) Hold(ctx context.Context) error {
	_, err := b.c.KV().Put(ctx, b.key, []byte("held"), IfRevision(0))
	if errors.Is(err, fence.ErrRevisionMismatch) {
		return nil
	}
	return err
}

// Release lifts the barrier: every Wait returns. Releasing a barrier that
// is not held does nothing.
func (b *Barrier) Release(ctx context.Context) error {
	_, err := b.c.KV().Delete(ctx, b.key)
	return err
}

// Held reports whether the barrier is held, linearizably.
func (b *Barrier) Held(ctx context.Context) (bool, error) {
	kv, err := b.c.KV().Get(ctx, b.key)
	return kv != nil, err
}

// Wait returns once the barrier is not held: at once if it is not, or when
// it is released. It fails when ctx ends or the watch cannot go on.
func (b *Barrier) Wait(ctx context.Context) error {
	return b.c.waitKey(ctx, b.key, func(kv *KeyValue) bool { return kv == nil })
}

// getAt reads key linearizably with the store's revision at the read, so
// that a watch from that revision plus one sees every later change.
func (c *Client) getAt(ctx context.Context, key string) (*KeyValue, uint64, error) {
	var (
		kv  *KeyValue
		rev uint64
	)
	err := c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Key: key}))
		if err == nil {
			rev = resp.Msg.GetRevision()
			if resp.Msg.GetFound() {
				kv = resp.Msg.GetKv()
			}
		}
		return err
	})
	return kv, rev, err
}

// waitKey returns once done holds of key's value (nil when the key does
// not exist): now, or after a change.
func (c *Client) waitKey(ctx context.Context, key string, done func(*KeyValue) bool) error {
	kv, rev, err := c.getAt(ctx, key)
	if err != nil || done(kv) {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.KV().Watch(ctx, key, FromRevision(rev+1))
	if err != nil {
		return err
	}
	defer w.Close()
	for ev := range w.Events() {
		if ev.GetKv().GetKey() != key { // a longer key with this prefix
			continue
		}
		kv = nil
		if ev.GetType() == fencev1.EventType_EVENT_TYPE_PUT {
			kv = ev.GetKv()
		}
		if done(kv) {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.Err()
}

// DoubleBarrier lets a fixed number of parties start a computation
// together and finish it together, like etcd's recipe DoubleBarrier or
// Curator's DistributedDoubleBarrier. Enter waits until count parties have
// entered; Leave waits until every party that entered has left.
//
// Each party is a session: its arrival is a key bound to the session, so
// a party whose session ends (it crashed, or paused past its TTL) is
// counted out. One that dies before count have arrived no longer counts
// towards them; one that dies after entering no longer holds back Leave.
// Parties beyond count that enter while the barrier is open go in too.
// A DoubleBarrier is one party: use one session and one DoubleBarrier per
// party.
type DoubleBarrier struct {
	s      *Session
	prefix string
	count  int

	entered  uint64 // revision of this party's arrival, 0 when not entered
	readyRev uint64 // revision of the "ready" mark this party saw or made
}

// NewDoubleBarrier returns the double barrier name for count parties, as
// the party of session s.
func NewDoubleBarrier(s *Session, name string, count int) *DoubleBarrier {
	return &DoubleBarrier{s: s, prefix: "dbarrier/" + name + "/", count: count}
}

func (b *DoubleBarrier) readyKey() string { return b.prefix + "ready" }
func (b *DoubleBarrier) memberKey() string {
	return b.prefix + "members/" + strconv.FormatUint(b.s.ID(), 10)
}

// isMember reports whether key is a party's arrival key of this barrier.
func (b *DoubleBarrier) isMember(key string) bool {
	id, ok := strings.CutPrefix(key, b.prefix+"members/")
	if !ok {
		return false
	}
	_, err := strconv.ParseUint(id, 10, 64)
	return err == nil
}

// Enter registers this party and waits until count parties have arrived
// (counting the parties whose sessions still live). It fails when ctx ends
// or the session ends. A failed Enter takes the party's arrival back, on
// a context of its own bounded by the session's TTL, so that it is neither
// counted towards count nor waited for by the others' Leave; if the
// service cannot be told, the session is given up instead
// (fence.ErrSessionLost), whose end deletes the arrival.
func (b *DoubleBarrier) Enter(ctx context.Context) error {
	if b.count < 1 {
		return fmt.Errorf("%w: double barrier %q: count %d must be at least 1", fence.ErrInvalidArgument, b.prefix, b.count)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(b.s.ctx, func() { cancel(context.Cause(b.s.ctx)) })
	defer stop()

	rev, err := b.s.client.KV().Put(ctx, b.memberKey(), nil, BoundTo(b.s))
	if err != nil {
		if mayHaveApplied(err) {
			b.withdraw()
		}
		return b.fail(ctx, err)
	}
	b.entered = rev
	if err := b.await(ctx); err != nil {
		b.withdraw()
		return b.fail(ctx, err)
	}
	return nil
}

// await waits, once this party arrived, until count parties have, and
// opens the barrier if it is the one that sees them all.
func (b *DoubleBarrier) await(ctx context.Context) error {
	kv := b.s.client.KV()
	l, err := kv.List(ctx, b.prefix)
	if err != nil {
		return err
	}
	members := map[string]bool{}
	for _, m := range l.KVs {
		switch {
		case m.GetKey() == b.readyKey() && m.GetModRevision() > b.entered:
			b.readyRev = m.GetModRevision()
			return nil // opened after this party arrived
		case b.isMember(m.GetKey()):
			members[m.GetKey()] = true
		}
	}
	if len(members) >= b.count {
		return b.open(ctx)
	}
	w, err := kv.Watch(ctx, b.prefix, FromRevision(l.Revision+1))
	if err != nil {
		return err
	}
	defer w.Close()
	for ev := range w.Events() {
		key, put := ev.GetKv().GetKey(), ev.GetType() == fencev1.EventType_EVENT_TYPE_PUT
		switch {
		case key == b.readyKey() && put && ev.GetKv().GetModRevision() > b.entered:
			b.readyRev = ev.GetKv().GetModRevision()
			return nil
		case b.isMember(key) && put:
			members[key] = true
		case b.isMember(key):
			delete(members, key)
		}
		if len(members) >= b.count {
			return b.open(ctx)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.Err()
}

// open marks the barrier open, for the parties waiting in Enter.
func (b *DoubleBarrier) open(ctx context.Context) error {
	rev, err := b.s.client.KV().Put(ctx, b.readyKey(), nil)
	if err != nil {
		return err
	}
	b.readyRev = rev
	return nil
}

// withdraw takes back this party's arrival after a failed Enter (see
// Enter), unless the session ended, which deleted it.
func (b *DoubleBarrier) withdraw() {
	s := b.s
	b.entered = 0
	if s.Err() != nil {
		return
	}
	ctx, cancel := s.undoContext()
	defer cancel()
	if _, err := s.client.KV().Delete(ctx, b.memberKey()); err != nil {
		s.giveUp("the arrival "+strconv.Quote(b.memberKey())+" of a failed Enter", err)
	}
}

// fail returns why a call under ctx failed: the session's end if that was
// the cause.
func (b *DoubleBarrier) fail(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && b.s.Err() != nil {
		return cause
	}
	return err
}

// Leave withdraws this party and waits until every party present when it
// left has left too (or its session ended). Parties that arrive after it
// left are a next round's and are not waited for. The parties clear the
// barrier's open mark for the next round as they go.
func (b *DoubleBarrier) Leave(ctx context.Context) error {
	kv := b.s.client.KV()
	if _, err := kv.Delete(ctx, b.memberKey()); err != nil {
		return err
	}
	b.entered = 0
	l, err := kv.List(ctx, b.prefix+"members/")
	if err != nil {
		return err
	}
	members := map[string]bool{}
	for _, m := range l.KVs {
		if b.isMember(m.GetKey()) {
			members[m.GetKey()] = true
		}
	}
	if len(members) > 0 {
		if err := b.waitEmpty(ctx, members, l.Revision); err != nil {
			return err
		}
	}
	// Clear the mark this round made, not one a next round made since.
	if b.readyRev != 0 {
		_, err := kv.Delete(ctx, b.readyKey(), IfRevision(b.readyRev))
		if err != nil && !errors.Is(err, fence.ErrRevisionMismatch) {
			return err
		}
		b.readyRev = 0
	}
	return nil
}

// waitEmpty waits, from revision rev on, until every party in members has
// left. Parties arriving later belong to a next round and do not hold this
// one back.
func (b *DoubleBarrier) waitEmpty(ctx context.Context, members map[string]bool, rev uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := b.s.client.KV().Watch(ctx, b.prefix+"members/", FromRevision(rev+1))
	if err != nil {
		return err
	}
	defer w.Close()
	for ev := range w.Events() {
		key := ev.GetKv().GetKey()
		if ev.GetType() != fencev1.EventType_EVENT_TYPE_DELETE || !members[key] {
			continue
		}
		delete(members, key)
		if len(members) == 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return w.Err()
}
