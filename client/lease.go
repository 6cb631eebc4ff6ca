package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
)

// Lease is a lock taken in one call, for a program that cannot keep a
// session alive: a cron job, a serverless function, a step of a script.
// It is Redis's SET key value NX PX ttl with a fencing token: Client.Lease
// answers the token and the lease's ID and Secret, or fails at once with
// fence.ErrLocked when the lock is held. On the service a lease is a
// session holding the lock (its ID is the session's), so it is bound by
// everything a session and a grant are: the leader expires it when its
// TTL passes without a Renew, and its lock then goes to the next holder
// (after the lease's lock-delay, if it was taken with one).
//
// Nothing renews a Lease in the background, and nothing tells its holder
// that it lapsed: its holder renews it before SafeUntil passes, and stops
// acting on the lock once it has. Send Token with every write, so that the
// resource refuses a write made after the lease was lost (package
// fencing): a holder paused past its lease does not know it was.
//
// A program that runs again later (a serverless function's next
// invocation) keeps ID and Secret, and rebuilds the Lease with
// Client.ResumeLease. The secret lets anyone renew and release the lease:
// keep it as you would a password.
//
// A Lease is safe for concurrent use.
type Lease struct {
	client *Client
	id     uint64
	secret string
	safety safety

	mu        sync.Mutex
	lock      string
	token     uint64
	ttl       time.Duration
	safeUntil time.Time // on the client's suspend-aware timeline (awareNow); zero: unknown
}

type leaseOptions struct {
	lockDelay time.Duration
	owner     string
	safety    safety
}

// LeaseOption configures a Lease.
type LeaseOption func(*leaseOptions)

// WithLeaseLockDelay asks that, if the lease expires (or an operator
// revokes it) instead of being released, its lock be granted to nobody
// else for d, so that writes of the lost holder still in flight drain
// (at most 1 minute). Release hands the lock on at once.
func WithLeaseLockDelay(d time.Duration) LeaseOption {
	return func(o *leaseOptions) { o.lockDelay = d }
}

// WithLeaseOwner labels the lease in listings, such as "backup.sh on db-2".
func WithLeaseOwner(owner string) LeaseOption {
	return func(o *leaseOptions) { o.owner = owner }
}

// WithLeaseSafety sets the bound on clock drift between client and leader
// (default 0.01, 1%) and the safety margin (default 100ms) that shorten
// the lease's SafeUntil, as WithSafety does a session's.
func WithLeaseSafety(drift float64, margin time.Duration) LeaseOption {
	return func(o *leaseOptions) { o.safety = safety{drift: drift, margin: margin} }
}

func leaseOpts(opts []LeaseOption) (leaseOptions, error) {
	o := leaseOptions{safety: defaultSafety}
	for _, opt := range opts {
		opt(&o)
	}
	return o, o.safety.check()
}

// Lease takes the lock name, exclusively, for ttl (the service allows 1s
// to 1h), in one call: it does not wait. When the lock is held (or under
// lock-delay, or others wait for it) it fails at once with an error that
// is fence.ErrLocked and a *fence.LockedError naming the holder, and
// leaves nothing on the service.
//
// The lease is safe until the time the call was sent plus ttl, less the
// drift and margin (SafeUntil): the service counts the TTL from when it
// received the call, later. The client draws the lease's secret and sends
// it with the call, so that a retry after an attempt whose answer was lost
// is answered the lease that attempt took (a service from before
// caller-drawn secrets refuses that retry with fence.ErrLocked instead).
func (c *Client) Lease(ctx context.Context, name string, ttl time.Duration, opts ...LeaseOption) (*Lease, error) {
	o, err := leaseOpts(opts)
	if err != nil {
		return nil, err
	}
	req := &fencev1.LeaseRequest{Lock: name, Ttl: durationpb.New(ttl), Owner: o.owner, LeaseSecret: rand.Text() + rand.Text()}
	if o.lockDelay > 0 {
		req.LockDelay = durationpb.New(o.lockDelay)
	}
	var (
		resp    *fencev1.LeaseResponse
		sent    time.Time
		earlier error // an earlier attempt's failure, which may have taken the lease
	)
	err = c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		sent = c.awareNow()
		r, err := ep.locks.Lease(ctx, connect.NewRequest(req))
		if err == nil {
			resp = r.Msg
		} else if earlier == nil && !dialFailed(err) && errors.Is(rpcerr.FromConnect(err), fence.ErrUnavailable) {
			earlier = rpcerr.FromConnect(err)
		}
		return err
	})
	if err != nil {
		if earlier != nil && errors.Is(err, fence.ErrLocked) {
			return nil, fmt.Errorf("%w (an earlier attempt of this call failed: %v; if it took the lease on a node from before caller-drawn lease secrets, nobody can renew or release it, and it holds the lock until its TTL passes)", err, earlier)
		}
		return nil, err
	}
	l := &Lease{
		client: c,
		id:     resp.GetLeaseId(),
		secret: resp.GetLeaseSecret(),
		safety: o.safety,
		lock:   resp.GetLock(),
		token:  resp.GetToken(),
	}
	l.renewed(sent, resp.GetTtl().AsDuration())
	return l, nil
}

// ResumeLease rebuilds a lease from the ID and Secret of one taken
// earlier, by this process or another (a serverless function stores them
// between invocations). It makes no call: the lease may have expired
// meanwhile. Until its first Renew, Lock, Token and TTL are unknown (zero)
// and SafeUntil is the zero time, which has always passed: nothing here
// knows when the lease was last renewed. Renew finds out whether the lease
// lives, and fills them in. opts take WithLeaseSafety; the others are the
// lease's own, set when it was taken.
func (c *Client) ResumeLease(id uint64, secret string, opts ...LeaseOption) (*Lease, error) {
	o, err := leaseOpts(opts)
	if err != nil {
		return nil, err
	}
	if id == 0 || secret == "" {
		return nil, fmt.Errorf("%w: a lease needs its id and secret, as Lease answered them", fence.ErrInvalidArgument)
	}
	return &Lease{client: c, id: id, secret: secret, safety: o.safety}, nil
}

// ID returns the lease's id: its session's id on the service, public (the
// lock's listing shows it as the holder's session).
func (l *Lease) ID() uint64 { return l.id }

// Secret returns the lease's secret, which renews and releases it. Keep
// it to its holder: anyone who has it can act as the lease.
func (l *Lease) Secret() string { return l.secret }

// Lock returns the name of the lock the lease holds ("" for a resumed
// lease until its first Renew).
func (l *Lease) Lock() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lock
}

// Token returns the lease's fencing token: send it with every write to
// the resource. 0 for a resumed lease until its first Renew.
func (l *Lease) Token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// lockName names the lease's lock for a message.
func (l *Lease) lockName() string {
	if name := l.Lock(); name != "" {
		return fmt.Sprintf("its lock %q", name)
	}
	return "its lock"
}

// TTL returns the lease's time to live, which each Renew restarts.
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// SafeUntil returns the instant, on this process's monotonic clock
// (compare it with time.Now), until which the lease is known to hold its
// lock: the time the last successful Lease or Renew call was sent, plus
// the TTL less the drift and margin (WithLeaseSafety). After it the
// service may have expired the lease and given the lock to another; only
// a Renew that succeeds (the lease had not expired) moves it on. On Linux
// it is brought closer by what the monotonic clock missed (a suspend), as
// a Session's is. The zero time for a resumed lease until its first Renew.
func (l *Lease) SafeUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.safeUntil.IsZero() {
		return time.Time{}
	}
	return l.safeUntil.Add(-l.client.opts.clock.Missed())
}

// renewed takes in a Lease or Renew answered with ttl for a call sent at
// sent (awareNow): the safe-until moves to sent + ttl*(1-drift) - margin,
// never back.
func (l *Lease) renewed(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ttl = ttl
	if d := l.safety.safeUntil(sent, ttl); d.After(l.safeUntil) {
		l.safeUntil = d
	}
}

// Renew renews the lease for a full TTL and moves SafeUntil on, counted
// from when the call was sent. A lease that expired or was released fails
// with fence.ErrSessionNotFound: its lock may be another's by now, so stop
// acting on it and take a new lease. A wrong secret fails with
// fence.ErrSessionSecret. A failed Renew changes nothing here: SafeUntil
// stays where the last success put it.
func (l *Lease) Renew(ctx context.Context) error {
	req := &fencev1.RenewLeaseRequest{LeaseId: l.id, LeaseSecret: l.secret}
	var (
		resp *fencev1.RenewLeaseResponse
		sent time.Time
	)
	err := l.client.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		sent = l.client.awareNow()
		r, err := ep.locks.RenewLease(ctx, connect.NewRequest(req))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.lock, l.token = resp.GetLock(), resp.GetToken()
	l.mu.Unlock()
	l.renewed(sent, resp.GetTtl().AsDuration())
	return nil
}

// Release ends the lease and hands its lock to the next waiter at once,
// with no lock-delay. A lease that had ended before (it expired, or an
// operator revoked it) fails with fence.ErrSessionNotFound: its lock may
// have been another's while its holder worked, and writes fenced by its
// token tell which were refused. A Release retried after an attempt whose
// answer was lost cannot tell its own first attempt from such an end, and
// succeeds. A wrong secret fails with fence.ErrSessionSecret and releases
// nothing.
func (l *Lease) Release(ctx context.Context) error {
	req := &fencev1.ReleaseLeaseRequest{LeaseId: l.id, LeaseSecret: l.secret}
	// released answers the last attempt; retried is set once an attempt
	// failed after it may have reached a node, and so may have released.
	var released, retried bool
	err := l.client.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		r, err := ep.locks.ReleaseLease(ctx, connect.NewRequest(req))
		if err == nil {
			released = r.Msg.GetReleased()
		} else if !dialFailed(err) {
			retried = true
		}
		return err
	})
	switch {
	case err != nil:
		return err
	case !released && !retried:
		return fmt.Errorf("%w: lease %d had ended (it expired, or was revoked) before it was released; %s may have been another's meanwhile", fence.ErrSessionNotFound, l.id, l.lockName())
	}
	l.mu.Lock()
	l.safeUntil = time.Time{}
	l.mu.Unlock()
	return nil
}
