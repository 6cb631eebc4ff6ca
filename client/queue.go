package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// Queue is a FIFO queue in the KV store that hands each item to one
// consumer at a time, like etcd's recipe Queue, with the hand-out fenced:
// a consumer takes an item by taking the item's lock, so it gets the
// item with a fencing token, and the item is removed (Ack) only with the
// current holder's token. A consumer whose session ends (it crashed, or
// paused past its TTL) loses its items to the next consumers, and its late
// Ack fails with fence.ErrNotHolder. So every item is handed out until one
// consumer acknowledges it, and only one consumer holds it at any time: to
// make the item's effect happen exactly once, the consumer writes it to a
// resource that checks Delivery.Token, like any lock holder (a consumer
// that paused past its TTL holds an older token than the next one).
//
// Items are kept under "queue/" + name + "/": "items/<seq>" holds an item,
// "claims/<seq>" is bound to the session of the consumer that holds it.
// Items are handed out in the order their sequence numbers were taken.
// A Queue is safe for concurrent use.
type Queue struct {
	c      *Client
	prefix string
	// Rescan bounds how long Dequeue waits before it looks at the queue
	// again without having seen a change: a consumer that died between
	// taking an item's lock and recording its claim frees the item
	// without any change to the KV store.
	Rescan time.Duration
}

// NewQueue returns the queue name.
func NewQueue(c *Client, name string) *Queue {
	return &Queue{c: c, prefix: "queue/" + name + "/", Rescan: time.Second}
}

func (q *Queue) seqKey() string             { return q.prefix + "seq" }
func (q *Queue) itemKey(seq uint64) string  { return fmt.Sprintf("%sitems/%020d", q.prefix, seq) }
func (q *Queue) claimKey(seq uint64) string { return fmt.Sprintf("%sclaims/%020d", q.prefix, seq) }
func (q *Queue) lockName(seq uint64) string { return q.itemKey(seq) }
func (q *Queue) parse(key, kind string) (uint64, bool) {
	rest, ok := strings.CutPrefix(key, q.prefix+kind+"/")
	if !ok || len(rest) != 20 {
		return 0, false
	}
	seq, err := strconv.ParseUint(rest, 10, 64)
	return seq, err == nil
}

// Enqueue appends value to the queue and returns its sequence number. A
// call that fails may or may not have appended it.
func (q *Queue) Enqueue(ctx context.Context, value []byte) (uint64, error) {
	seq, err := q.nextSeq(ctx)
	if err != nil {
		return 0, err
	}
	_, err = q.c.KV().Put(ctx, q.itemKey(seq), value)
	return seq, err
}

// nextSeq takes the next sequence number: a compare-and-swap on a counter.
func (q *Queue) nextSeq(ctx context.Context) (uint64, error) {
	kv := q.c.KV()
	for {
		cur, err := kv.Get(ctx, q.seqKey())
		if err != nil {
			return 0, err
		}
		var n, rev uint64
		if cur != nil {
			rev = cur.GetModRevision()
			if n, err = strconv.ParseUint(string(cur.GetValue()), 10, 64); err != nil {
				return 0, fmt.Errorf("queue %s: counter %q: %w", q.prefix, cur.GetValue(), err)
			}
		}
		n++
		_, err = kv.Put(ctx, q.seqKey(), []byte(strconv.FormatUint(n, 10)), IfRevision(rev))
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, fence.ErrRevisionMismatch) {
			return 0, err
		}
	}
}

// Delivery is an item handed out to one consumer. Its grant ends, and
// another consumer may be handed the item, when the consumer's session
// ends; the grant's context says so.
type Delivery struct {
	// Seq is the item's sequence number, Value its value.
	Seq   uint64
	Value []byte

	q *Queue
	m *Mutex
	g *Grant
}

// Token is the hand-out's fencing token: pass it with the item's effect.
func (d *Delivery) Token() uint64 { return d.g.Token() }

// Grant is the hand-out's grant: its lock, its token, and a context that
// ends when the item may have been handed to someone else.
func (d *Delivery) Grant() *Grant { return d.g }

// Ack removes the item from the queue, if this is still its current
// hand-out; otherwise it fails with fence.ErrNotHolder (or
// fence.ErrStaleToken) and the item stays with whoever holds it now.
func (d *Delivery) Ack(ctx context.Context) error {
	kv := d.q.c.KV()
	if _, err := kv.Delete(ctx, d.q.itemKey(d.Seq), WithGrant(d.g), Strict()); err != nil {
		return err
	}
	return d.end(ctx)
}

// Return gives the item back to the queue, for the next consumer.
func (d *Delivery) Return(ctx context.Context) error { return d.end(ctx) }

// end removes the claim and releases the item's lock.
func (d *Delivery) end(ctx context.Context) error {
	_, err := d.q.c.KV().Delete(ctx, d.q.claimKey(d.Seq), WithGrant(d.g), Strict())
	if err != nil && !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
		return err
	}
	return d.m.Unlock(ctx)
}

// Dequeue waits for the oldest item nobody holds and hands it to the
// consumer of session s. It fails when ctx ends or the session ends. The
// item stays in the queue until Ack; a consumer whose session ends gives
// it back.
func (q *Queue) Dequeue(ctx context.Context, s *Session) (*Delivery, error) {
	for {
		if err := s.Err(); err != nil {
			return nil, err
		}
		l, err := q.c.KV().List(ctx, q.prefix)
		if err != nil {
			return nil, err
		}
		d, err := q.take(ctx, s, l)
		if d != nil || err != nil {
			return d, err
		}
		if err := q.waitChange(ctx, s, l.Revision); err != nil {
			return nil, err
		}
	}
}

// take tries the unclaimed items of listing l in order and returns the
// first it could take, or nil.
func (q *Queue) take(ctx context.Context, s *Session, l *Listing) (*Delivery, error) {
	claimed := map[uint64]bool{}
	for _, kv := range l.KVs {
		if seq, ok := q.parse(kv.GetKey(), "claims"); ok {
			claimed[seq] = true
		}
	}
	for _, kv := range l.KVs {
		seq, ok := q.parse(kv.GetKey(), "items")
		if !ok || claimed[seq] {
			continue
		}
		d, err := q.takeItem(ctx, s, seq)
		if d != nil || err != nil {
			return d, err
		}
	}
	return nil, nil
}

// takeItem takes item seq's lock, checks that the item is still there (a
// consumer may have acknowledged it since the listing), and records the
// claim. It returns nil when someone else holds the item or it is gone.
// When it does not hand the item out, it gives back what it took (the
// lock, and the claim if a failed put may have made it) within a bound
// of its own (Mutex.giveUp): a claim or a lock left behind would keep
// every consumer off the item for as long as the session lives.
func (q *Queue) takeItem(ctx context.Context, s *Session, seq uint64) (*Delivery, error) {
	m := NewMutex(s, q.lockName(seq))
	g, err := m.TryLock(ctx)
	if errors.Is(err, fence.ErrLocked) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	kv := q.c.KV()
	item, err := kv.Get(ctx, q.itemKey(seq))
	if err != nil || item == nil {
		m.giveUp(g, "", nil)
		return nil, err
	}
	_, err = kv.Put(ctx, q.claimKey(seq), []byte(strconv.FormatUint(s.ID(), 10)), WithGrant(g), Strict(), BoundTo(s))
	if err != nil {
		m.giveUp(g, q.claimKey(seq), err)
		return nil, err
	}
	return &Delivery{Seq: seq, Value: item.GetValue(), q: q, m: m, g: g}, nil
}

// waitChange waits from revision rev on for a change that may free an
// item (a new item, a claim given up), or for Rescan to pass. The watch
// only shortens the wait: when it cannot be opened or breaks (the node
// at its watch limit, a leader change, a stream open that timed out),
// the consumer waits out the Rescan and lists again, as it would have
// without it.
func (q *Queue) waitChange(ctx context.Context, s *Session, rev uint64) error {
	wctx, cancel := context.WithTimeout(ctx, q.Rescan)
	defer cancel()
	w, err := q.c.KV().Watch(wctx, q.prefix, FromRevision(rev+1))
	if err != nil {
		return waitRescan(ctx, wctx, s)
	}
	defer w.Close()
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return waitRescan(ctx, wctx, s)
			}
			key, put := ev.GetKv().GetKey(), ev.GetType() == fencev1.EventType_EVENT_TYPE_PUT
			if _, item := q.parse(key, "items"); item && put {
				return nil
			}
			if _, claim := q.parse(key, "claims"); claim && !put {
				return nil
			}
		case <-s.Done():
			return s.Err()
		}
	}
}

// waitRescan waits for wctx, the Rescan's, to end, and returns nil then,
// or the error of ctx or of session s when either ends first.
func waitRescan(ctx, wctx context.Context, s *Session) error {
	select {
	case <-wctx.Done():
		return ctx.Err()
	case <-s.Done():
		return s.Err()
	}
}
