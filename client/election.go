package client

import (
	"context"
	"fmt"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// Election elects one leader among the sessions that campaign on a name,
// like etcd's concurrency.Election: the leader holds the lock "election/"
// + name, and its value is kept in the fenced KV store under the same key,
// written with the leadership's token in strict mode, so a deposed leader
// cannot overwrite its successor's record, and bound to the leader's
// session, so it goes when the session ends. The token is the leadership's
// fencing token: pass it with the leader's writes.
type Election struct {
	s    *Session
	name string
	m    *Mutex
}

// NewElection returns an election on name, campaigned through s.
func NewElection(s *Session, name string) *Election {
	key := electionKey(name)
	return &Election{s: s, name: key, m: NewMutex(s, key)}
}

// Leadership is a won election: the leader's grant and value.
type Leadership struct {
	*Grant
	Value string
}

// Campaign waits until this session leads, then records value as the
// leader's. It fails when ctx ends or the session ends, or when the value
// cannot be recorded (too long, no kv permission on "election/" + name, a
// quota). A Campaign that failed after it was elected gives leadership up
// again, on a context of its own bounded by the session's TTL, so that the
// next campaigner is elected: it deletes the record if the failed write
// may have made it, then releases the lock; if the service cannot be
// told, it gives up the session instead (fence.ErrSessionLost), whose end
// releases both. Campaigning while leading is Proclaim: a failure then
// keeps leadership and the value recorded before.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	held := e.m.Grant()
	g, err := e.m.Lock(ctx)
	if err != nil {
		return nil, err
	}
	if err := e.Proclaim(ctx, value); err != nil {
		if g != held {
			e.m.giveUp(g, e.name, err)
		}
		return nil, err
	}
	return &Leadership{Grant: g, Value: value}, nil
}

// Proclaim changes the leader's value without giving up leadership. It
// fails with fence.ErrNotHolder when this session no longer leads.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	g := e.m.Grant()
	if g == nil {
		return fmt.Errorf("%w: not the leader of %s", fence.ErrNotHolder, e.name)
	}
	_, err := e.s.client.KV().Put(ctx, e.name, []byte(value), WithGrant(g), Strict(), BoundTo(e.s))
	return err
}

// Resign gives up leadership: the record is deleted and the lock released,
// so the next campaigner is elected at once.
func (e *Election) Resign(ctx context.Context) error {
	g := e.m.Grant()
	if g == nil {
		return nil
	}
	if _, err := e.s.client.KV().Delete(ctx, e.name, WithGrant(g), Strict()); err != nil {
		return err
	}
	return e.m.Unlock(ctx)
}

// Leader returns the election's leader, linearizably, as ObserveLeader
// reports it: Elected is false when nobody leads (no record, or one whose
// leader has lost the lock, its session ended, and not yet been succeeded).
func (c *Client) Leader(ctx context.Context, name string) (LeaderState, error) {
	key := electionKey(name)
	kv, err := c.KV().Get(ctx, key)
	if err != nil {
		return LeaderState{}, err
	}
	return c.leaderOf(ctx, key, kv)
}

// electionKey is the lock, and the KV key, of the election name.
func electionKey(name string) string { return "election/" + name }

// leaderOf is the state an election's record kv (nil: none) stands for:
// its leader leads while the record's token is the lock's current grant.
func (c *Client) leaderOf(ctx context.Context, key string, kv *KeyValue) (LeaderState, error) {
	if !leaderRecord(key, kv) {
		return LeaderState{}, nil
	}
	res, err := c.Check(ctx, key, kv.GetToken())
	if err != nil || !res.Current {
		return LeaderState{}, err
	}
	return LeaderState{Elected: true, Value: string(kv.GetValue()), Token: kv.GetToken()}, nil
}

// leaderRecord reports whether kv, the election key's value, is a leader's
// record: written under the election's lock (Campaign, Proclaim), and so,
// strictly fenced, by its holder at the time. A write no leader made (no
// fence, or another lock's) elects nobody.
func leaderRecord(key string, kv *KeyValue) bool {
	return kv != nil && kv.GetLock() == key && kv.GetToken() != 0
}

// LeaderState is an election's leader as Leader and ObserveLeader report it.
type LeaderState struct {
	// Elected is false while nobody leads.
	Elected bool
	// Value and Token are the leader's value and leadership token.
	Value string
	Token uint64
}

// ObserveLeader reports the leader of the election name as it changes,
// like etcd's Election.Observe: first the current state, then each new
// leader, each Proclaim and each loss of leadership (a resignation, or the
// end of the leader's session). It follows the service's own leader
// changes (see KV.Watch). The channel is closed when ctx ends or the watch
// cannot go on; call again to go on observing.
func (c *Client) ObserveLeader(ctx context.Context, name string) (<-chan LeaderState, error) {
	key := electionKey(name)
	// Read, then watch from the revision after the read: every change is
	// seen once, in order, and none older than the state first reported.
	l, err := c.KV().List(ctx, key)
	if err != nil {
		return nil, err
	}
	var record *KeyValue
	for _, kv := range l.KVs {
		if kv.GetKey() == key { // not another election whose name starts with this one
			record = kv
		}
	}
	last, err := c.leaderOf(ctx, key, record)
	if err != nil {
		return nil, err
	}
	w, err := c.KV().Watch(ctx, key, FromRevision(l.Revision+1))
	if err != nil {
		return nil, err
	}
	out := make(chan LeaderState)
	go func() {
		defer close(out)
		defer w.Close()
		if !send(ctx, out, last) {
			return
		}
		for ev := range w.Events() {
			kv := ev.GetKv()
			if kv.GetKey() != key { // another election whose name starts with this one
				continue
			}
			var st LeaderState
			if ev.GetType() == fencev1.EventType_EVENT_TYPE_PUT && leaderRecord(key, kv) {
				st = LeaderState{Elected: true, Value: string(kv.GetValue()), Token: kv.GetToken()}
			}
			if st == last { // nothing an observer can see changed
				continue
			}
			last = st
			if !send(ctx, out, st) {
				return
			}
		}
	}()
	return out, nil
}

func send[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}
