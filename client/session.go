package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/rpcerr"
)

// ErrSessionClosed is the cause of a session's end after Close. It wraps
// fence.ErrReleased.
var ErrSessionClosed = fmt.Errorf("%w: session closed", fence.ErrReleased)

// Session is a client's lease on the service. It renews itself in the
// background every third of its TTL. Each successful renewal makes it safe
// until sent + TTL*(1-drift) - margin, counted on this process's monotonic
// clock from before the renewal was sent; when that instant passes without a
// renewal, or the server reports the session gone, the session ends: Done is
// closed, Err says why, and every lock taken through it must be presumed
// lost. A session that ended stays ended; create a new one.
//
// On Linux the count goes on through what the monotonic clock misses: a
// suspend of the machine (CLOCK_BOOTTIME), or a wall clock set forward (as
// when a paused VM resumes and its clock is synced), brings the safe-until
// closer by as much, and a session it passed ends as lost once the process
// runs again (within about 100 ms). Elsewhere the monotonic clock alone
// counts, and a suspend it does not count extends the session's belief by
// its length. A VM paused with all of its clocks, and not set forward on
// resuming, shows nothing to any of them.
//
// This narrows the window in which a paused holder believes it holds a
// lock the server gave away; it does not close it. Fencing tokens do.
// A Session is safe for concurrent use.
type Session struct {
	client *Client
	id     uint64
	// secret is the session's secret, sent with every call that acts as
	// the session; the service answered it to this client alone.
	secret string
	ttl    time.Duration
	safety safety

	ctx    context.Context
	cancel context.CancelCauseFunc

	// safeUntil, and due below, are on the client's suspend-aware
	// timeline (awareNow); SafeUntil answers safeUntil on the monotonic one.
	mu        sync.Mutex
	safeUntil time.Time
	// renewals counts the keepalives sent; grants maps each live grant to
	// the count when it was received (see checkHeld).
	renewals uint64
	grants   map[*Grant]uint64
	// releases are the locks whose release is on its way (Mutex.Unlock),
	// by name: the service's grant is the session's, whichever Mutex took
	// it, so an Acquire of the name waits for them (waitReleased).
	releases map[string]*pendingRelease

	// requests numbers the session's Acquire calls (their request ids).
	requests atomic.Uint64

	// interval is the time between renewals; due (under mu) when the
	// next one is. batch, under the keepAliver's mutex, is the keepalive
	// message the session is in, if any.
	interval time.Duration
	due      time.Time
	batch    *kaBatch

	// The keepalive schedule is two timers, not a goroutine: dueTimer
	// renews the session at due (onDue), lostTimer ends it at safeUntil
	// (onLost). A renewal, the session's own or in another's message,
	// moves them (rearm). Once stopped (under mu) they stay stopped, and
	// wg counts their callbacks running.
	dueTimer, lostTimer clock.Timer
	stopped             bool
	lapsed              bool // its safe-until passed unrenewed: it is being lost
	renewing            atomic.Bool
	renewCtx            context.Context
	stopOnce            sync.Once
	stopRenew           context.CancelFunc // ends a renewal in flight when the session is closed
	wg                  sync.WaitGroup
}

type sessionOptions struct {
	ttl    time.Duration
	owner  string
	safety safety
}

// SessionOption configures a Session.
type SessionOption func(*sessionOptions)

// WithTTL sets the session's time to live (default 10s; the server allows 1s to 1h).
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// WithOwner labels the session in listings, such as "worker-3 pid 4121".
func WithOwner(owner string) SessionOption {
	return func(o *sessionOptions) { o.owner = owner }
}

// WithSafety sets the bound on clock drift between client and leader
// (default 0.01, 1%) and the safety margin (default 100ms) that shorten
// the client's "safe until" deadline.
func WithSafety(drift float64, margin time.Duration) SessionOption {
	return func(o *sessionOptions) { o.safety = safety{drift: drift, margin: margin} }
}

// NewSession creates a session on the service and starts keeping it alive.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: 10 * time.Second, safety: defaultSafety}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.safety.check(); err != nil {
		return nil, err
	}
	var resp *fencev1.CreateSessionResponse
	var sent time.Time
	// No idempotency key: the service answers a session's secret once, so
	// a retry creates a session of its own, and one whose answer was lost
	// expires after its TTL.
	req := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_CreateSession{CreateSession: &fencev1.CreateSessionRequest{
		Ttl:   durationpb.New(o.ttl),
		Owner: o.owner,
	}}}
	err := c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		sent = c.awareNow()
		r, err := c.op(ctx, ep, req)
		if err == nil {
			resp = r.GetCreateSession()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	s := &Session{
		client: c,
		id:     resp.GetSessionId(),
		secret: resp.GetSessionSecret(),
		ttl:    resp.GetTtl().AsDuration(),
		safety: o.safety,
	}
	s.interval = s.ttl / 3
	s.due = sent.Add(s.interval)
	s.safeUntil = s.deadlineFrom(sent)
	s.startKeepAlive()
	return s, nil
}

// startKeepAlive starts the session's life on the client: its context
// and its keepalive schedule, from due and safeUntil.
func (s *Session) startKeepAlive() {
	c := s.client
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.renewCtx, s.stopRenew = context.WithCancel(s.ctx)
	if !c.opts.noStream {
		c.keepAlives.add(s)
	}
	clk := c.opts.clock
	now := c.awareNow()
	s.mu.Lock()
	s.dueTimer = clk.AfterFunc(s.due.Sub(now), s.onDue)
	s.lostTimer = clk.AfterFunc(s.safeUntil.Sub(now), s.onLost)
	s.mu.Unlock()
	c.wake.add(s)
	context.AfterFunc(s.ctx, s.stopKeepAlive)
}

// ID returns the session's id on the service. The id is public (listings
// show it); acting as the session also takes its secret, which the
// Session keeps to itself and sends with each of its calls.
func (s *Session) ID() uint64 { return s.id }

// TTL returns the session's time to live.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session ends: closed, expired, or no longer known
// to be alive.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the session lives, and then why it ended:
// ErrSessionClosed, fence.ErrSessionLost or fence.ErrSessionNotFound.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Context returns a context that is cancelled when the session ends. Do
// protected work under it (or under a grant's context).
func (s *Session) Context() context.Context { return s.ctx }

// SafeUntil returns the instant, on this process's monotonic clock (compare
// it with time.Now), until which the session is known to be alive. On
// Linux it is brought closer by what that clock missed since (see
// Session): a suspend moves it earlier by the suspend's length at once,
// before any timer of the session has run.
func (s *Session) SafeUntil() time.Time {
	return s.deadline().Add(-s.client.opts.clock.Missed())
}

// deadline returns the safe-until on the suspend-aware timeline (awareNow).
func (s *Session) deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.safeUntil
}

func (s *Session) deadlineFrom(sent time.Time) time.Time {
	return s.safety.safeUntil(sent, s.ttl)
}

// Close ends the session and releases everything it holds. After a failed
// Close the session still ends locally and expires on the server after its
// TTL. Close is safe to call concurrently; calls after the first do nothing.
func (s *Session) Close(ctx context.Context) error {
	first := false
	s.stopOnce.Do(func() {
		first = true
		s.stopRenew()
	})
	if !first {
		return nil
	}
	s.stopKeepAlive()
	s.wg.Wait()
	if s.Err() != nil {
		// Lost or ended already: the service has expired or closed it, or
		// lose has asked every node to abandon it. Do not wait on a service
		// that did not answer in time just now.
		return nil
	}
	s.end(ErrSessionClosed)
	req := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_CloseSession{CloseSession: &fencev1.CloseSessionRequest{SessionId: s.id, SessionSecret: s.secret}}}
	return s.client.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := s.client.op(ctx, ep, req)
		return err
	})
}

func (s *Session) end(cause error) { s.cancel(cause) }

// lose ends a session that may have expired on the server, then abandons
// it there, best effort, so that locks the client has given up on are
// released now rather than at expiry: as at expiry, each after the
// lock-delay its holder asked for, since the holder learns only now that
// it may have lost its locks and may still be writing. The call goes to
// every node the client knows at once, for a second: the node that
// answered last may be the one that hangs, and any node names the leader.
func (s *Session) lose(cause error) {
	s.end(cause)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range s.client.numEndpoints() {
		wg.Go(func() { s.abandonAt(ctx, s.client.endpointAt(i)) })
	}
	wg.Wait()
}

// abandonAt asks one node to abandon the session, and the leader it names
// if it is not the leader. A node known to be of another group is not
// asked: the request carries the session's secret.
func (s *Session) abandonAt(ctx context.Context, ep *endpoint) {
	if ep.foreign.Load() {
		return
	}
	req := &fencev1.CloseSessionRequest{SessionId: s.id, SessionSecret: s.secret, Abandon: true}
	_, err := ep.sessions.CloseSession(ctx, connect.NewRequest(req))
	if leader := leaderHint(rpcerr.FromConnect(err)); leader != "" {
		if ep = s.client.endpointAt(s.client.endpointFor(leader)); !ep.foreign.Load() {
			_, _ = ep.sessions.CloseSession(ctx, connect.NewRequest(req))
		}
	}
}

// onDue renews the session, every TTL/3 (its interval); a failed
// renewal is retried sooner. A renewal that went in another session's
// keepalive message (keepAliver) moved the schedule on before this ran.
func (s *Session) onDue() {
	if !s.enter() {
		return
	}
	defer s.wg.Done()
	if !s.renewing.CompareAndSwap(false, true) {
		return // a renewal is under way; it rearms when done
	}
	defer s.renewing.Store(false)
	now := s.client.awareNow()
	safe := s.SafeUntil()
	if s.dueAt().After(now) {
		s.rearm() // renewed meanwhile in another session's message
		return
	}
	// A process that was paused (SIGSTOP, GC, or on Linux the machine
	// suspended: see Session for the VM whose clocks all stopped) must
	// not renew a session whose deadline passed while it slept.
	if s.lapse(now) {
		s.lose(fmt.Errorf("%w: session %d was not renewed before its safe-until deadline", fence.ErrSessionLost, s.id))
		return
	}
	err := s.renew(s.renewCtx, safe)
	switch {
	case err == nil:
	case errors.Is(err, fence.ErrSessionNotFound):
		s.end(err)
		return
	default:
		s.setDue(s.client.awareNow().Add(min(s.interval, 250*time.Millisecond)))
	}
	s.rearm()
}

// onLost ends the session when its safe-until deadline passed without a
// renewal (one in flight included: it was not answered in time).
func (s *Session) onLost() {
	if !s.enter() {
		return
	}
	defer s.wg.Done()
	if !s.lapse(s.client.awareNow()) {
		s.rearm() // renewed as this fired, or moved by a suspend
		return
	}
	s.lose(fmt.Errorf("%w: no renewal of session %d reached the service in time; its locks may be held by others", fence.ErrSessionLost, s.id))
}

// lapse reports whether the session's safe-until is not after now, and
// then marks it lapsed: no renewal answered later extends it, as the
// session is about to end as lost.
func (s *Session) lapse(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Before(s.safeUntil) {
		return false
	}
	s.lapsed = true
	return true
}

// checkSafe returns nil while s lives and its safe-until has not passed,
// and otherwise why s ended. A safe-until that passed unnoticed (the
// process was paused, and s's timers have not run since) ends s as lost
// here, as its lost timer would have: the service may have expired s and
// granted its locks to others.
func (s *Session) checkSafe() error {
	if err := s.Err(); err != nil {
		return err
	}
	if s.lapse(s.client.awareNow()) {
		s.lose(fmt.Errorf("%w: session %d passed its safe-until deadline unrenewed (the process was paused, or the machine suspended); its locks may be held by others", fence.ErrSessionLost, s.id))
	}
	return s.Err()
}

// enter counts a timer's callback in wg, unless the schedule stopped.
func (s *Session) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Add(1)
	return true
}

// rearm sets the timers to the schedule: the next renewal at due, the
// end at safeUntil. The timers run on the monotonic clock: after it
// missed time, the wake watch rearms them.
func (s *Session) rearm() {
	now := s.client.awareNow()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.dueTimer.Reset(s.due.Sub(now))
	s.lostTimer.Reset(s.safeUntil.Sub(now))
}

// stopKeepAlive stops the schedule for good: the session is closed or
// ended.
func (s *Session) stopKeepAlive() {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		s.dueTimer.Stop()
		s.lostTimer.Stop()
	}
	s.mu.Unlock()
	s.client.keepAlives.remove(s)
	s.client.wake.remove(s)
}

// dueAt returns when the next renewal is due.
func (s *Session) dueAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.due
}

func (s *Session) setDue(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.due = t
}

// nextRound counts a keepalive about to be sent and returns its number.
func (s *Session) nextRound() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewals++
	return s.renewals
}

// renewed takes in a keepalive's success: the keepalive number round, sent
// at sent (awareNow, as the session's deadlines are), answered that the
// session holds held. The next renewal falls
// due an interval, and lag, after sent. A keepalive sent at or after the
// safe-until renews nothing here, whatever the answer: by then the service
// may have expired the session and granted its locks to others while this
// process, paused, believed it held them. The session ends as lost at its
// safe-until. Nor does an answer that comes after the session ended (lost
// as it waited): its safe-until stays where the session ended.
func (s *Session) renewed(sent time.Time, lag time.Duration, round uint64, held *fencev1.HeldGrants) {
	s.mu.Lock()
	if !sent.Before(s.safeUntil) || s.lapsed || s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	if d := s.deadlineFrom(sent); d.After(s.safeUntil) {
		s.safeUntil = d
	}
	if next := sent.Add(s.interval + lag); next.After(s.due) {
		s.due = next
	}
	s.mu.Unlock()
	if held != nil {
		s.checkHeld(round, held.GetTokens())
	}
}

// renew sends one keepalive; the call may not outlive the session's safe
// deadline, and an attempt on one node may not outlive a quarter of the
// TTL. On the stream the keepalive goes in one message with those of the
// client's other sessions that are due soon; the wait for that message is
// bounded by this session's own safe deadline too, whichever session's
// message it rides in (one begun by a session with a longer TTL runs on
// past it): the renewal gives up when the session's lost timer ends the
// session, at its safe-until.
func (s *Session) renew(ctx context.Context, safe time.Time) error {
	clk := s.client.opts.clock
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := clk.AfterFunc(safe.Sub(clk.Now()), cancel)
	defer timer.Stop()
	if !s.client.opts.noStream {
		return s.client.keepAlives.renew(ctx, s)
	}
	var (
		sent time.Time
		held *fencev1.HeldGrants
	)
	round := s.nextRound()
	// A node that hangs gets a quarter of the TTL, so that the other nodes
	// are tried well before the safe-until deadline.
	attempt := s.ttl / 4
	err := s.client.call(ctx, func(ctx context.Context, ep *endpoint) error {
		sent = s.client.awareNow()
		return withAttemptDeadline(ctx, clk, attempt, ep, func(ctx context.Context) error {
			resp, err := ep.sessions.KeepAlive(ctx, connect.NewRequest(&fencev1.KeepAliveRequest{SessionId: s.id, SessionSecret: s.secret}))
			if err == nil {
				held = resp.Msg.GetHeld()
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	s.renewed(sent, 0, round, held)
	return nil
}

// track counts g among the session's live grants.
func (s *Session) track(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grants == nil {
		s.grants = map[*Grant]uint64{}
	}
	s.grants[g] = s.renewals
}

// pendingRelease counts the releases of one lock name on their way; done
// is closed when the last of them is over.
type pendingRelease struct {
	n    int
	done chan struct{}
}

// beginRelease records a release of the lock name on its way, until the
// function it returns is called.
func (s *Session) beginRelease(name string) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.releases == nil {
		s.releases = map[string]*pendingRelease{}
	}
	p := s.releases[name]
	if p == nil {
		p = &pendingRelease{done: make(chan struct{})}
		s.releases[name] = p
	}
	p.n++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if p.n--; p.n == 0 {
			delete(s.releases, name)
			close(p.done)
		}
	}
}

// waitReleased waits until no release of the lock name is on its way, so
// that an Acquire is not handed the grant being released, to see it
// released under it.
func (s *Session) waitReleased(ctx context.Context, name string) error {
	s.mu.Lock()
	p := s.releases[name]
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.ctx.Done():
		return context.Cause(s.ctx)
	}
}

// untrack forgets a grant that ended.
func (s *Session) untrack(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.grants, g)
}

// checkHeld ends the grants that someone else released: those received
// before keepalive number round was sent (so the service had granted them
// before it answered) whose tokens the answer no longer lists as held.
func (s *Session) checkHeld(round uint64, held []uint64) {
	s.mu.Lock()
	var lost []*Grant
	for g, since := range s.grants {
		if since < round && g.ctx.Err() == nil {
			if _, ok := slices.BinarySearch(held, g.token); !ok {
				lost = append(lost, g)
				delete(s.grants, g)
			}
		}
	}
	s.mu.Unlock()
	for _, g := range lost {
		g.cancel(fmt.Errorf("%w (%s, token %d)", ErrLockRevoked, g.lock, g.token))
	}
}
