package server

import (
	"container/heap"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
)

// expiryRetry is how long the tracker waits before proposing an expiry
// again after a failed proposal.
const expiryRetry = 100 * time.Millisecond

// maxExpireIDs bounds the sessions one ExpireSessions command ends. A storm
// of expiries is committed as a run of such commands, one after the other,
// so that the commands of clients queued meanwhile are committed between
// them (in the same batches) instead of behind one huge command.
const maxExpireIDs = 128

// sessionTracker keeps each session's deadline on the leader's monotonic
// clock and proposes the expiry of sessions whose deadline passed. Every
// node mirrors the set of sessions from the FSM, but only the leader renews
// deadlines and expires sessions; a node that becomes leader gives every
// session a fresh full TTL, never a shorter one.
//
// The queue holds one entry per session, at a deadline no later than the
// session's: a keepalive only moves the session's deadline, in O(1), and
// when its entry comes due the entry is put back at the deadline the
// session has by then. So idle sessions cost one map entry and one queue
// entry each, and the tracker wakes only when a deadline it queued passes,
// never to scan.
type sessionTracker struct {
	clock  clock.Clock
	expire func(ids []uint64) error
	logger *slog.Logger

	mu       sync.Mutex
	leader   bool
	sessions map[uint64]*trackedSession
	queue    deadlineQueue
	kick     chan struct{}
	done     chan struct{}
	wg       sync.WaitGroup
}

type trackedSession struct {
	ttl      time.Duration
	deadline time.Time
	// expiring is set once the leader has proposed the session's expiry:
	// from then on keepalives fail, so no client is told its session lives
	// while its expiry is being committed.
	expiring bool
	// gone is set when the session leaves sessions, so that a keepalive
	// holding the entry learns it without looking the id up again.
	gone bool
}

func newSessionTracker(c clock.Clock, logger *slog.Logger, expire func(ids []uint64) error) *sessionTracker {
	t := &sessionTracker{
		clock:    c,
		expire:   expire,
		logger:   logger,
		sessions: map[uint64]*trackedSession{},
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	return t
}

// start runs the tracker's expiry loop, until stop.
func (t *sessionTracker) start() {
	t.wg.Add(1)
	go t.run()
}

func (t *sessionTracker) stop() {
	close(t.done)
	t.wg.Wait()
}

func (t *sessionTracker) wake() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// created starts tracking a session committed with the given TTL.
func (t *sessionTracker) created(id uint64, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.sessions[id]; ok {
		s.ttl = ttl // already queued: a restore mirrored it first
		return
	}
	s := &trackedSession{ttl: ttl, deadline: t.clock.Now().Add(ttl)}
	t.sessions[id] = s
	heap.Push(&t.queue, deadlineEntry{id: id, deadline: s.deadline})
	if t.queue[0].id == id {
		t.wake() // the earliest deadline is new: the timer must learn of it
	}
}

// ended stops tracking a session that was closed or expired.
func (t *sessionTracker) ended(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.sessions[id]; ok {
		s.gone = true
		delete(t.sessions, id)
	}
}

// reset mirrors the FSM's sessions after a snapshot restore. Sessions the
// tracker already knew keep their deadlines; new ones get a full TTL.
func (t *sessionTracker) reset(sessions []fsm.SessionInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	next := make(map[uint64]*trackedSession, len(sessions))
	for _, info := range sessions {
		if s, ok := t.sessions[info.ID]; ok {
			next[info.ID] = s
			continue
		}
		next[info.ID] = &trackedSession{ttl: info.TTL, deadline: now.Add(info.TTL)}
	}
	for id, s := range t.sessions {
		if _, ok := next[id]; !ok {
			s.gone = true
		}
	}
	t.sessions = next
	t.rebuildQueueLocked()
}

// becomeLeader gives every session a fresh full TTL and starts expiring.
func (t *sessionTracker) becomeLeader() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	for _, s := range t.sessions {
		s.deadline = now.Add(s.ttl)
		s.expiring = false
	}
	t.rebuildQueueLocked()
	t.leader = true
	t.wake()
}

func (t *sessionTracker) becomeFollower() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leader = false
}

func (t *sessionTracker) rebuildQueueLocked() {
	t.queue = t.queue[:0]
	for id, s := range t.sessions {
		t.queue = append(t.queue, deadlineEntry{id: id, deadline: s.deadline})
	}
	heap.Init(&t.queue)
}

// keepAlive renews a session for a full TTL from now.
func (t *sessionTracker) keepAlive(id uint64) (time.Duration, error) {
	r := []renewal{{id: id}}
	t.keepAliveAll(r)
	return r[0].ttl, r[0].err
}

// renewal is one session's keepalive: what it asks, what the tracker
// made of it, and what it answers.
type renewal struct {
	id     uint64
	secret string
	err    error // why it was not renewed; one set before keepAliveAll is skipped
	ttl    time.Duration
	s      *trackedSession
	held   []uint64 // the tokens the session holds, once it is renewed
}

// renewalChunk is how many sessions a keepalive handles under one hold of
// a lock (the tracker's, the FSM's): a keepalive of thousands of sessions
// takes it in turns with the expiry timer, the sessions being created and
// the commands being applied.
const renewalChunk = 512

// keepAliveAll renews each session of rs that has no error yet for a full
// TTL from now, setting its TTL and entry, or its error.
func (t *sessionTracker) keepAliveAll(rs []renewal) {
	for chunk := range slices.Chunk(rs, renewalChunk) {
		t.mu.Lock()
		now := t.clock.Now()
		for i := range chunk {
			r := &chunk[i]
			switch {
			case r.err != nil:
			case !t.leader:
				r.err = fmt.Errorf("%w: this node is not the leader; keepalives go to the leader", fence.ErrUnavailable)
			default:
				r.s, r.err = t.liveLocked(r.id)
				if r.err == nil {
					// Only later: the session's queue entry, at its old
					// deadline or earlier, is put back at this one when it
					// comes due.
					r.s.deadline = now.Add(r.s.ttl)
					r.ttl = r.s.ttl
				}
			}
		}
		t.mu.Unlock()
	}
}

// stillAlive sets the error of each renewal of rs whose session ended, or
// began to be expired, since keepAliveAll renewed it.
func (t *sessionTracker) stillAlive(rs []renewal) {
	for chunk := range slices.Chunk(rs, renewalChunk) {
		t.mu.Lock()
		for i := range chunk {
			if r := &chunk[i]; r.err == nil && (r.s.gone || r.s.expiring) {
				r.err = notFound(r.id)
			}
		}
		t.mu.Unlock()
	}
}

// expiresIn returns how long session id lives without a keepalive, on the
// leader's clock; false on a node that does not lead, or for a session it
// does not track.
func (t *sessionTracker) expiresIn(id uint64) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[id]
	if !t.leader || !ok {
		return 0, false
	}
	return max(s.deadline.Sub(t.clock.Now()), 0), true
}

// liveLocked returns the tracked session id, unless it is gone or its
// expiry is being committed.
func (t *sessionTracker) liveLocked(id uint64) (*trackedSession, error) {
	s, ok := t.sessions[id]
	if !ok || s.expiring {
		return nil, notFound(id)
	}
	return s, nil
}

// run sleeps until the earliest deadline and expires what is due.
func (t *sessionTracker) run() {
	defer t.wg.Done()
	timer := t.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		timer.Reset(t.nextWake())
		select {
		case <-t.done:
			return
		case <-t.kick:
		case <-timer.C():
			t.expireDue()
		}
	}
}

// nextWake returns how long until the earliest queued deadline, dropping
// the entries of sessions that ended and putting those of sessions renewed
// since back at their deadlines. On a follower it sleeps: becomeLeader
// wakes it.
func (t *sessionTracker) nextWake() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.leader {
		return time.Hour
	}
	t.settleLocked(time.Time{})
	if len(t.queue) == 0 {
		return time.Hour
	}
	return max(t.queue[0].deadline.Sub(t.clock.Now()), 0)
}

// settleLocked brings the queue's head up to date: it drops the entries of
// sessions that ended or are being expired, and puts back the entry of a
// session renewed since it was queued at the session's deadline. With a
// non-zero now, it also takes every session whose deadline has passed by
// now off the queue, marks it expiring and returns its id.
func (t *sessionTracker) settleLocked(now time.Time) (due []uint64) {
	for len(t.queue) > 0 {
		e := &t.queue[0]
		s, ok := t.sessions[e.id]
		switch {
		case !ok || s.expiring:
			heap.Pop(&t.queue)
		case s.deadline.After(e.deadline):
			e.deadline = s.deadline
			heap.Fix(&t.queue, 0)
		case !now.IsZero() && !e.deadline.After(now):
			due = append(due, e.id) // before Pop moves another entry to e
			heap.Pop(&t.queue)
			s.expiring = true
		default:
			return due
		}
	}
	return due
}

// expireDue proposes the expiry of every session whose deadline passed, in
// commands of at most maxExpireIDs sessions, one after the other.
func (t *sessionTracker) expireDue() {
	t.mu.Lock()
	if !t.leader {
		t.mu.Unlock()
		return
	}
	due := t.settleLocked(t.clock.Now())
	t.mu.Unlock()
	if len(due) == 0 {
		return
	}
	slices.Sort(due)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for len(due) > 0 {
			n := min(len(due), maxExpireIDs)
			if err := t.expire(due[:n]); err != nil {
				t.logger.Warn("expiring sessions failed; will retry", "sessions", len(due), "first", due[0], "err", err)
				t.retry(due)
				return
			}
			due = due[n:]
		}
	}()
}

// retry makes sessions whose expiry failed to commit due again shortly.
func (t *sessionTracker) retry(ids []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	deadline := t.clock.Now().Add(expiryRetry)
	for _, id := range ids {
		if s, ok := t.sessions[id]; ok && s.expiring {
			s.expiring = false
			s.deadline = deadline
			heap.Push(&t.queue, deadlineEntry{id: id, deadline: deadline})
		}
	}
	t.wake()
}

type deadlineEntry struct {
	id       uint64
	deadline time.Time
}

// deadlineQueue is a min-heap of deadlines, one entry per tracked session
// at or before its deadline (see settleLocked).
type deadlineQueue []deadlineEntry

func (q deadlineQueue) Len() int { return len(q) }
func (q deadlineQueue) Less(i, j int) bool {
	if q[i].deadline.Equal(q[j].deadline) {
		return q[i].id < q[j].id
	}
	return q[i].deadline.Before(q[j].deadline)
}
func (q deadlineQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *deadlineQueue) Push(x any)   { *q = append(*q, x.(deadlineEntry)) }
func (q *deadlineQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Bounds of the wait before a LiftDelay that failed to commit is proposed
// again: the first retry waits liftRetryMin, each one after twice as long
// as the one before, up to liftRetryMax.
const (
	liftRetryMin = 100 * time.Millisecond
	liftRetryMax = 5 * time.Second
)

// delayScheduler lifts lock-delays on the leader: when a lock is put under
// a delay, it commits a LiftDelay of that delay once it has passed on the
// leader's clock. Each delay has its own timer, so a delay added while
// another is pending holds in full. A LiftDelay that fails to commit is
// proposed again after a backoff (liftRetryMin to liftRetryMax) while this
// node leads; otherwise the lock would stay delayed until the next leader
// change. A new leader restarts every pending delay in full.
type delayScheduler struct {
	clock  clock.Clock
	lift   func(lock string, id uint64) error
	logger *slog.Logger

	mu     sync.Mutex
	leader bool
	timers map[uint64]clock.Timer // by delay id: its delay, or a retry's backoff
}

func newDelayScheduler(c clock.Clock, logger *slog.Logger, lift func(lock string, id uint64) error) *delayScheduler {
	return &delayScheduler{clock: c, lift: lift, logger: logger, timers: map[uint64]clock.Timer{}}
}

func (d *delayScheduler) schedule(delays []fsm.Delay) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.leader {
		return
	}
	for _, delay := range delays {
		d.scheduleLocked(delay)
	}
}

func (d *delayScheduler) scheduleLocked(delay fsm.Delay) {
	d.armLocked(delay, delay.Delay, liftRetryMin)
}

// armLocked lifts delay after wait, and if that fails, tries again after
// backoff.
func (d *delayScheduler) armLocked(delay fsm.Delay, wait, backoff time.Duration) {
	if t, ok := d.timers[delay.ID]; ok {
		t.Stop()
	}
	var t clock.Timer
	t = d.clock.AfterFunc(wait, func() {
		d.mu.Lock()
		// A timer stopped as it fired must not drop its successor.
		mine := d.timers[delay.ID] == t
		if mine {
			delete(d.timers, delay.ID)
		}
		leader := d.leader
		d.mu.Unlock()
		if mine && leader {
			if err := d.lift(delay.Lock, delay.ID); err != nil {
				d.retry(delay, backoff, err)
			}
		}
	})
	d.timers[delay.ID] = t
}

// retry proposes delay's LiftDelay again after backoff, doubling the
// backoff of the next retry, while this node leads and nothing armed the
// delay meanwhile (a new term of this node restarts it in full). A
// LiftDelay of a delay lifted already lifts nothing.
func (d *delayScheduler) retry(delay fsm.Delay, backoff time.Duration, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, armed := d.timers[delay.ID]; armed || !d.leader {
		d.logger.Warn("lifting lock-delay failed; the next term restarts it", "lock", delay.Lock, "delay", delay.ID, "err", err)
		return
	}
	d.logger.Warn("lifting lock-delay failed; will retry", "lock", delay.Lock, "delay", delay.ID, "retry_in", backoff, "err", err)
	d.armLocked(delay, backoff, min(2*backoff, liftRetryMax))
}

func (d *delayScheduler) becomeLeader(pending []fsm.Delay) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.leader = true
	for _, delay := range pending {
		d.scheduleLocked(delay)
	}
}

func (d *delayScheduler) becomeFollower() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.leader = false
	for id, t := range d.timers {
		t.Stop()
		delete(d.timers, id)
	}
}

// notFound is the error of a keepalive of a session that is gone or being
// expired.
func notFound(id uint64) error {
	return fmt.Errorf("%w: session %d does not exist or has expired; create a new session", fence.ErrSessionNotFound, id)
}
