package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
)

// maxKeepAliveBatch bounds the sessions one keepalive message renews
// (about 60 bytes each on the wire).
const maxKeepAliveBatch = 1000

// keepAliver coalesces the keepalives of a client's sessions: when one
// session's renewal is due, every other session of the client whose
// renewal is due within a quarter of its interval goes in the same
// message, and its own schedule restarts from that renewal. So renewals
// fall into step: a client whose sessions all have one TTL sends a few
// messages per interval however many sessions it has, not one per session.
// A session renewed early this way is renewed as a keepalive of its own
// would renew it (its safe-until counts from when the message was sent).
// Its next renewal falls due an eighth of its interval after the sending
// session's, inside the quarter: so the sender's timer fires first and
// takes it along again, and a client's thousands of sessions cost one
// timer firing per message, not one each (the others' timers are only
// moved).
type keepAliver struct {
	c *Client

	mu       sync.Mutex
	sessions map[*Session]struct{} // live sessions, to be taken along
}

// kaBatch is one keepalive message in flight and what it answered.
type kaBatch struct {
	done    chan struct{}
	results map[*Session]error
}

func (k *keepAliver) add(s *Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sessions[s] = struct{}{}
}

func (k *keepAliver) remove(s *Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.sessions, s)
}

// renew renews s, with the sessions due soon, in one message, or waits for
// the message s went in already. ctx bounds the wait for s alone (the
// caller ends it at s's safe-until); the message runs on for the other
// sessions in it, within the deadline of the session that sent it.
func (k *keepAliver) renew(ctx context.Context, s *Session) error {
	k.mu.Lock()
	if b := s.batch; b != nil {
		k.mu.Unlock()
		select {
		case <-b.done:
			return b.results[s]
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := &kaBatch{done: make(chan struct{}), results: map[*Session]error{}}
	members := []*Session{s}
	s.batch = b
	now := k.c.awareNow()
	for o := range k.sessions {
		// A session past its safe-until stays out: the service may have
		// expired it (its own timer ends it as lost), and this process,
		// paused, may not have run that timer yet.
		// Due soon first: it rules out most sessions, and reads only the
		// session itself (ctx is another allocation, and a client may
		// hold thousands of sessions).
		if o != s && o.batch == nil && !o.dueAt().After(now.Add(o.interval/4)) && o.ctx.Err() == nil && now.Before(o.deadline()) {
			o.batch = b
			members = append(members, o)
		}
	}
	k.mu.Unlock()

	var wg sync.WaitGroup
	for start := 0; start < len(members); start += maxKeepAliveBatch {
		chunk := members[start:min(start+maxKeepAliveBatch, len(members))]
		wg.Go(func() {
			err := k.send(ctx, chunk, s)
			k.mu.Lock()
			for _, m := range chunk {
				if _, ok := b.results[m]; !ok {
					b.results[m] = err
				}
			}
			k.mu.Unlock()
		})
	}
	wg.Wait()
	k.mu.Lock()
	for _, m := range members {
		m.batch = nil
	}
	k.mu.Unlock()
	close(b.done)
	for _, m := range members[1:] {
		if err := b.results[m]; errors.Is(err, fence.ErrSessionNotFound) {
			m.end(err)
		}
		m.rearm()
	}
	return b.results[s]
}

// send renews sessions in one message that sender sends, retried as any
// keepalive is, until ctx ends. It records each session's own result in
// the batch before returning the message's error (nil once it was
// answered).
func (k *keepAliver) send(ctx context.Context, sessions []*Session, sender *Session) error {
	clk := k.c.opts.clock
	attempt := time.Duration(0)
	req := &fencev1.KeepAliveManyRequest{Sessions: make([]*fencev1.KeepAliveRequest, len(sessions))}
	rounds := make([]uint64, len(sessions))
	for i, s := range sessions {
		req.Sessions[i] = &fencev1.KeepAliveRequest{SessionId: s.id, SessionSecret: s.secret}
		rounds[i] = s.nextRound()
		// A node that hangs gets a quarter of the shortest TTL, so that the
		// other nodes are tried well before any safe-until deadline.
		if a := s.ttl / 4; attempt == 0 || a < attempt {
			attempt = a
		}
	}
	op := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_KeepAlive{KeepAlive: req}}
	var (
		sent time.Time
		resp *fencev1.KeepAliveManyResponse
	)
	err := k.c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		sent = k.c.awareNow()
		return withAttemptDeadline(ctx, clk, attempt, ep, func(ctx context.Context) error {
			r, err := k.c.op(ctx, ep, op)
			if err == nil {
				err = messageError(r.GetKeepAlive(), len(sessions))
			}
			if err == nil {
				resp = r.GetKeepAlive()
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	for i, r := range resp.GetResults() {
		s := sessions[i]
		if err := rpcerr.FromStream(r.GetError()); err != nil {
			k.record(s, err)
			continue
		}
		lag := time.Duration(0)
		if s != sender {
			lag = s.interval / 8
		}
		s.renewed(sent, lag, rounds[i], r.GetOk().GetHeld())
		k.record(s, nil)
	}
	return nil
}

// messageError returns the error of a keepalive message's answer that is
// not one session's own (sessionsOwn): the node is not the leader, or could
// not confirm that it still is. Then the message failed as a whole, as its
// unary keepalives would (unaryKeepAlives), so that call retries it at once
// at the leader the error names, rather than take the answer for a success
// and leave each session to retry on its own later.
func messageError(resp *fencev1.KeepAliveManyResponse, sessions int) error {
	if n := len(resp.GetResults()); n != sessions {
		return fmt.Errorf("%w: a keepalive of %d sessions was answered for %d", fence.ErrUnavailable, sessions, n)
	}
	for _, r := range resp.GetResults() {
		if err := rpcerr.FromStream(r.GetError()); err != nil && !sessionsOwn(err) {
			return err
		}
	}
	return nil
}

// record sets one session's result in the batch it is in.
func (k *keepAliver) record(s *Session, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if b := s.batch; b != nil {
		b.results[s] = err
	}
}
