package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/rpcerr"
)

// Grant is a held lock: its name, its fencing token, and a context that
// ends when the lock may be lost (the session ended) or was released. Send
// the token with every write to a fenced resource.
type Grant struct {
	lock   string
	token  uint64
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Lock returns the lock's name.
func (g *Grant) Lock() string { return g.lock }

// Token returns the grant's fencing token. Tokens strictly increase across
// all grants of the service.
func (g *Grant) Token() uint64 { return g.token }

// Context is cancelled when the grant ends: released (context.Cause is
// ErrLockReleased), released by someone else (ErrLockRevoked), or its
// session ended (the session's Err).
func (g *Grant) Context() context.Context { return g.ctx }

// Done is closed when the grant ends.
func (g *Grant) Done() <-chan struct{} { return g.ctx.Done() }

// Err returns nil while the grant holds, then why it ended.
func (g *Grant) Err() error {
	if g.ctx.Err() == nil {
		return nil
	}
	return context.Cause(g.ctx)
}

// ErrLockReleased is the cause of a grant's end after Unlock (or Release).
// It wraps fence.ErrReleased.
var ErrLockReleased = fmt.Errorf("%w: lock released", fence.ErrReleased)

// ErrLockRevoked is the cause of a grant's end when someone else (another
// client, an operator) released it while its session lived on. The session
// learns of it from its next keepalive, within a third of the TTL. It wraps
// fence.ErrRevoked.
var ErrLockRevoked = fmt.Errorf("%w: the session no longer holds the lock", fence.ErrRevoked)

// LockOption configures a Mutex.
type LockOption func(*lockOptions)

type lockOptions struct {
	lockDelay   time.Duration
	waitTimeout time.Duration
}

// WithLockDelay asks that, if this grant ends otherwise than by its
// holder's Unlock or Session.Close (the session expires, an operator
// revokes it, or the client gives it up when it cannot renew it), the
// lock is not granted to anyone else until d has passed, so that writes of
// the lost holder still in flight can drain.
func WithLockDelay(d time.Duration) LockOption {
	return func(o *lockOptions) { o.lockDelay = d }
}

// WithWaitTimeout makes Lock give up with fence.ErrWaitTimeout after waiting d.
func WithWaitTimeout(d time.Duration) LockOption {
	return func(o *lockOptions) { o.waitTimeout = d }
}

// Mutex is an exclusive lock held through a session. Waiters are granted in
// FIFO order. A Mutex is safe for concurrent use, but it is one holder: to
// contend for a lock, use one session per contender.
type Mutex struct {
	s    *Session
	name string
	opts lockOptions

	mode    fencev1.Mode
	permits int // of a semaphore

	mu    sync.Mutex
	grant *Grant
}

// NewMutex returns a mutex on the named lock, held through s.
func NewMutex(s *Session, name string, opts ...LockOption) *Mutex {
	m := &Mutex{s: s, name: name, mode: fencev1.Mode_MODE_EXCLUSIVE}
	for _, opt := range opts {
		opt(&m.opts)
	}
	return m
}

// Lock waits until the lock is granted and returns the grant. It fails when
// ctx ends, the wait timeout passes (fence.ErrWaitTimeout) or the session
// ends. A grant is returned only while ctx lives: one whose answer arrives
// as ctx ends is given up (CancelAcquire) before Lock returns ctx's error,
// so Lock returns within about one round trip to the service of ctx's end,
// and leaves nothing held. Locking a mutex already held returns the same grant. A grant is
// returned only while the session's safe-until has not passed: once it
// has (the process was paused past it), Lock fails with
// fence.ErrSessionLost and the session ends as lost, which gives up
// whatever the service granted.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) { return m.acquire(ctx, false) }

// TryLock takes the lock if it is free and nobody waits for it, and fails
// with fence.ErrLocked otherwise, without waiting; it fails as Lock does
// when the session ends or its safe-until passed.
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) { return m.acquire(ctx, true) }

// Grant returns the current grant, or nil when the mutex is not held.
func (m *Mutex) Grant() *Grant {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.grant
}

func (m *Mutex) acquire(ctx context.Context, try bool) (*Grant, error) {
	s := m.s
	if err := s.checkSafe(); err != nil {
		return nil, err
	}
	if m.permits < 0 || uint64(m.permits) > math.MaxUint32 || (m.mode == fencev1.Mode_MODE_SEMAPHORE) != (m.permits > 0) {
		return nil, fmt.Errorf("%w: semaphore %q: permits %d must be at least 1", fence.ErrInvalidArgument, m.name, m.permits)
	}
	if g := m.Grant(); g != nil && g.Err() == nil {
		return g, nil
	}
	if err := s.waitReleased(ctx, m.name); err != nil {
		return nil, err
	}
	// Give up the wait as soon as the session ends.
	caller := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	defer stop()

	req := m.request(try)
	resp, attempts, err := m.send(ctx, req)
	if err != nil {
		if !leftNothing(err, attempts) {
			m.abandon(req.RequestId)
		}
		if cause := context.Cause(ctx); cause != nil && s.Err() != nil {
			return nil, cause
		}
		return nil, err
	}
	return m.take(caller, req.RequestId, resp.GetToken())
}

// request is the Acquire of one call of Lock or TryLock: a new request id,
// which every attempt of the call carries.
func (m *Mutex) request(try bool) *fencev1.AcquireRequest {
	s := m.s
	req := &fencev1.AcquireRequest{
		SessionId:     s.id,
		SessionSecret: s.secret,
		Lock:          m.name,
		Try:           try,
		Mode:          m.mode,
		Permits:       uint32(m.permits),
		RequestId:     s.requests.Add(1),
	}
	if m.opts.lockDelay > 0 {
		req.LockDelay = durationpb.New(m.opts.lockDelay)
	}
	return req
}

// send sends req until it is answered with a grant or a refusal, and
// returns the grant and how many attempts it took. Each attempt is
// bounded, so that a node that stops answering is left for the next: a
// wait answers "still waiting" after poll and is taken up again where it
// stands. The first poll is short, so that a lock free at once is as quick
// to move on from a hung node as any call; the slack after a poll is for
// the answer to arrive.
func (m *Mutex) send(ctx context.Context, req *fencev1.AcquireRequest) (*fencev1.AcquireResponse, int, error) {
	s := m.s
	attempt := s.client.opts.attempt
	limit := attempt
	if !req.GetTry() {
		req.Poll = durationpb.New(attempt / 2)
	}
	clk := s.client.opts.clock
	var waitUntil time.Time
	if m.opts.waitTimeout > 0 {
		waitUntil = clk.Now().Add(m.opts.waitTimeout)
	}
	var resp *fencev1.AcquireResponse
	attempts := 0
	err := s.client.call(ctx, func(ctx context.Context, ep *endpoint) error {
		// After a failed attempt the next one commits a takeover rather
		// than resume a wait that attempt may have changed.
		req.ResumeAttempt = 0
		for {
			attempts++
			if !waitUntil.IsZero() {
				req.WaitTimeout = durationpb.New(max(waitUntil.Sub(clk.Now()), time.Millisecond))
			}
			var r *fencev1.AcquireResponse
			err := withAttemptDeadline(ctx, clock.Real, limit, ep, func(ctx context.Context) error {
				got, err := s.client.op(ctx, ep, &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Acquire{Acquire: proto.Clone(req).(*fencev1.AcquireRequest)}})
				r = got.GetAcquire()
				return err
			})
			if err != nil {
				return err
			}
			if !r.GetWaiting() {
				resp = r
				return nil
			}
			req.ResumeAttempt = r.GetAttempt()
			req.Poll, limit = durationpb.New(attempt), attempt+attempt/2
		}
	})
	return resp, attempts, err
}

// take makes the grant of token, answered to request id, the mutex's.
func (m *Mutex) take(caller context.Context, id, token uint64) (*Grant, error) {
	s := m.s
	// A grant whose answer came as the caller's context ended is given up,
	// not returned: the caller gave up on the lock, and would not release
	// it. So a grant is returned only while the caller's context lives.
	if err := caller.Err(); err != nil {
		m.abandon(id)
		return nil, fmt.Errorf("%s %q was granted as the context ended, and given up again: %w", m.kind(), m.name, context.Cause(caller))
	}
	// A grant answered after the session's safe-until (the process was
	// paused meanwhile) is no grant: the service may have expired the
	// session since, and granted the lock to another. Losing the session
	// gives the lock up, at once or at expiry.
	if err := s.checkSafe(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.grant != nil && m.grant.token == token && m.grant.Err() == nil {
		return m.grant, nil
	}
	g := &Grant{lock: m.name, token: token}
	g.ctx, g.cancel = context.WithCancelCause(s.ctx)
	m.grant = g
	s.track(g)
	return g, nil
}

// leftNothing reports whether a failed Acquire certainly left nothing held
// or queued: its only attempt was refused. Any other failure (the call was
// cancelled, an answer was lost, a retry was needed) may have left a wait
// or a grant that nobody would learn of.
func leftNothing(err error, attempts int) bool {
	if attempts != 1 {
		return false
	}
	for _, refused := range []error{fence.ErrInvalidArgument, fence.ErrLocked, fence.ErrLimit, fence.ErrSessionNotFound, fence.ErrWaitTimeout, fence.ErrCancelled, fence.ErrPermissionDenied, fence.ErrAuthFailed} {
		if errors.Is(err, refused) {
			return true
		}
	}
	return false
}

// abandon gives up the Acquire request id after it failed, so that it
// leaves nothing held or queued, and no retry of it still on its way can
// take the lock later (as etcd's Mutex deletes its key on a failed Lock).
// If the service cannot be told within the session's TTL, the session
// itself is given up: its end releases everything it holds.
func (m *Mutex) abandon(id uint64) {
	s := m.s
	if s.Err() != nil {
		return // the session's end releases everything
	}
	ctx, cancel := s.undoContext()
	defer cancel()
	req := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_CancelAcquire{CancelAcquire: &fencev1.CancelAcquireRequest{SessionId: s.id, SessionSecret: s.secret, Lock: m.name, RequestId: id}}}
	err := s.client.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := s.client.op(ctx, ep, req)
		return err
	})
	if err != nil {
		s.giveUp("a failed acquire of "+strconv.Quote(m.name), err)
	}
}

// Unlock releases the lock. The grant's context is cancelled first, so
// work under it stops before the lock is handed on. If the release cannot
// be sent before ctx ends (no node reachable), Unlock returns the error,
// and the client goes on sending it, within the session's TTL and the
// client's retry budget; if the service still cannot be told, the session
// is given up, and its end releases the lock. A release is not left
// undone for as long as the session lives (etcd's Mutex leaves it to the
// caller to try again). Meanwhile an Acquire of the same lock name through
// the session (this Mutex, another made for it, the other half of an
// RWMutex) waits for the release: the service's grant is the session's,
// and would be handed back as it is released. A ctx that ends only because
// the grant does (the grant's Context, or one made from it) does not cut
// the release short; a deadline of its own still does.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	g := m.grant
	m.grant = nil
	var end func()
	if g != nil {
		end = m.s.beginRelease(m.name) // before m.mu is let go: a Lock that finds no grant waits
	}
	m.mu.Unlock()
	if g == nil {
		return fmt.Errorf("%w: %s %q is not held", fence.ErrNotHolder, m.kind(), m.name)
	}
	gaveUp := ctx.Err() != nil
	g.cancel(ErrLockReleased)
	if ctx.Err() != nil && !gaveUp {
		// The grant's own context, or one made from it, ended because the
		// grant did: that is not the caller giving up. The release goes on
		// within the client's retry budget, or a deadline ctx carries.
		deadline, hasDeadline := ctx.Deadline()
		ctx = context.WithoutCancel(ctx)
		if hasDeadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
	m.s.untrack(g)
	req := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Release{Release: &fencev1.ReleaseRequest{SessionId: m.s.id, SessionSecret: m.s.secret, Lock: m.name, Token: g.token}}}
	err := m.release(ctx, req, false)
	if err != nil && !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrSessionNotFound) && m.s.Err() == nil {
		go func() {
			defer end()
			m.finishRelease(req, err)
		}()
		return err
	}
	end()
	return err
}

// release sends req until a node answers it or ctx ends. A release refused
// as not held after an attempt that may have been applied (sent, its
// answer lost) succeeds: that attempt released it.
func (m *Mutex) release(ctx context.Context, req *fencev1.StreamRequest, sentBefore bool) error {
	return m.s.client.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := m.s.client.op(ctx, ep, req)
		if sentBefore && errors.Is(rpcerr.FromConnect(err), fence.ErrNotHolder) {
			return nil
		}
		if err != nil && !dialFailed(err) {
			sentBefore = true
		}
		return err
	})
}

// finishRelease sends again, within the session's TTL, a release whose
// Unlock failed with err, or gives the session up when it cannot: the
// lock is held until one or the other. A release refused outright
// (permission denied, say) will not pass on a second try: the session is
// given up at once.
func (m *Mutex) finishRelease(req *fencev1.StreamRequest, err error) {
	s := m.s
	if mayHaveApplied(err) {
		ctx, cancel := s.undoContext()
		defer cancel()
		if err = m.release(ctx, req, true); err == nil || errors.Is(err, fence.ErrSessionNotFound) {
			return
		}
	}
	s.giveUp("the release of "+strconv.Quote(m.name), err)
}

// RWMutex is a lock held through a session either by one writer (Lock) or
// by any number of readers (RLock), like sync.RWMutex. Waiters are granted
// in FIFO order: a waiting writer holds back readers that come after it,
// so writers do not starve. Each grant, shared ones included, has its own
// fencing token. One session holds the lock in one mode at a time.
type RWMutex struct {
	w, r *Mutex
}

// NewRWMutex returns a read-write mutex on the named lock, held through s.
func NewRWMutex(s *Session, name string, opts ...LockOption) *RWMutex {
	rw := &RWMutex{w: NewMutex(s, name, opts...), r: NewMutex(s, name, opts...)}
	rw.r.mode = fencev1.Mode_MODE_SHARED
	return rw
}

// Lock waits for the lock in exclusive mode; see Mutex.Lock.
func (rw *RWMutex) Lock(ctx context.Context) (*Grant, error) { return rw.w.Lock(ctx) }

// TryLock takes the lock in exclusive mode without waiting, or fails with
// fence.ErrLocked.
func (rw *RWMutex) TryLock(ctx context.Context) (*Grant, error) { return rw.w.TryLock(ctx) }

// Unlock releases an exclusive grant.
func (rw *RWMutex) Unlock(ctx context.Context) error { return rw.w.Unlock(ctx) }

// RLock waits for the lock in shared mode.
func (rw *RWMutex) RLock(ctx context.Context) (*Grant, error) { return rw.r.Lock(ctx) }

// TryRLock takes the lock in shared mode without waiting, or fails with
// fence.ErrLocked.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Grant, error) { return rw.r.TryLock(ctx) }

// RUnlock releases a shared grant.
func (rw *RWMutex) RUnlock(ctx context.Context) error { return rw.r.Unlock(ctx) }

// kind names what m is, for errors.
func (m *Mutex) kind() string {
	switch m.mode {
	case fencev1.Mode_MODE_SHARED:
		return "read lock"
	case fencev1.Mode_MODE_SEMAPHORE:
		return "semaphore"
	}
	return "mutex"
}

// Semaphore admits up to a fixed number of holders at once, like Curator's
// InterProcessSemaphoreV2 or a Consul semaphore: each holder takes one
// permit through its own session, and waiters are granted in FIFO order as
// permits free up. Every holder and waiter must name the same number of
// permits; a name is a semaphore for as long as anyone holds or waits for
// it. A session holds at most one permit of a semaphore.
//
// Each permit comes with a fencing token of its own. Permit holders run at
// the same time, so a resource they all write must not apply the
// highest-token rule to all of them together: fence each holder's own
// keys, or ask Check whether a token is still a current grant.
type Semaphore struct{ m *Mutex }

// NewSemaphore returns a semaphore of the given number of permits on the
// named lock, held through s. permits must be at least 1 and at most the
// server's limit (--max-permits, default 10,000).
func NewSemaphore(s *Session, name string, permits int, opts ...LockOption) *Semaphore {
	m := NewMutex(s, name, opts...)
	m.mode = fencev1.Mode_MODE_SEMAPHORE
	m.permits = permits
	return &Semaphore{m: m}
}

// Acquire waits for a permit and returns its grant; see Mutex.Lock.
// Acquiring a permit already held returns the same grant.
func (sm *Semaphore) Acquire(ctx context.Context) (*Grant, error) { return sm.m.Lock(ctx) }

// TryAcquire takes a permit if one is free and nobody waits, and fails
// with fence.ErrLocked otherwise, without waiting.
func (sm *Semaphore) TryAcquire(ctx context.Context) (*Grant, error) { return sm.m.TryLock(ctx) }

// Release gives the permit back; the next waiter gets it in the same commit.
func (sm *Semaphore) Release(ctx context.Context) error { return sm.m.Unlock(ctx) }

// Grant returns the current grant, or nil when no permit is held.
func (sm *Semaphore) Grant() *Grant { return sm.m.Grant() }
