package k8sleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing"
)

// ErrLeaseLost means that the fence lease of this Lock's term ended other
// than by its own release: it expired (this process was paused, or could
// not reach fence, past its TTL) or an operator revoked it. The term is
// over: its Context is done, and its token may be refused by now.
var ErrLeaseLost = errors.New("k8sleader: the term's fence lease was lost")

// ErrNotLeading is the cause of the Context of a Lock that holds no term
// (none began yet, or the last one was released), and the error of a
// release when there is nothing to release.
var ErrNotLeading = errors.New("k8sleader: not leading")

// recordResource names the election record in the Kubernetes errors that
// client-go tells apart (NotFound, Conflict, AlreadyExists).
var recordResource = schema.GroupResource{Group: "fence", Resource: "leaderelectionrecords"}

// Lock is a resourcelock.Interface whose record lives in fence's fenced KV
// store and whose leadership is a fence lease (see the package doc). Give
// each LeaderElector a Lock of its own. Its methods are safe for
// concurrent use: the elector calls Get, Create and Update while the
// controller reads Token, SafeUntil and Context.
type Lock struct {
	client    *client.Client
	name      string
	key       string
	identity  string
	recorder  resourcelock.EventRecorder
	eventObj  runtime.Object
	leaseOpts []client.LeaseOption
	now       func() time.Time // when a lost lease may be followed by a new one

	op sync.Mutex // held through each Get, Create and Update: one at a time

	mu        sync.Mutex
	rev       uint64    // the record's mod revision as last read or written; 0: absent
	known     bool      // rev was read or written
	term      *term     // nil: not leading
	lostUntil time.Time // after a lost lease, no new one before this
}

// term is one run of leadership: one fence lease, from its grant to its
// release or loss.
type term struct {
	lease  *client.Lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer // ends ctx once the lease's SafeUntil passes; guarded by Lock.mu
}

// over reports whether the term has ended or its SafeUntil has passed
// (on the client's clock, as SafeUntil is), whether or not the timer that
// ends its context has fired yet.
func (t *term) over() bool {
	return t.ctx.Err() != nil || !time.Now().Before(t.lease.SafeUntil())
}

// Option configures a Lock.
type Option func(*Lock)

// WithRecordKey keeps the election record under key in fence's KV store,
// instead of "k8sleader/" + the lock's name. No other writer may use it.
func WithRecordKey(key string) Option { return func(l *Lock) { l.key = key } }

// WithEventRecorder has RecordEvent record client-go's leadership events
// ("became leader", "stopped leading") on obj, such as the controller's
// Pod or Deployment, as client-go's own locks record them on their Lease.
func WithEventRecorder(rec resourcelock.EventRecorder, obj runtime.Object) Option {
	return func(l *Lock) { l.recorder, l.eventObj = rec, obj }
}

// WithLeaseOptions passes opts to every fence lease the Lock takes
// (client.WithLeaseLockDelay, client.WithLeaseSafety). The lease's owner
// is the Lock's identity unless opts name another.
func WithLeaseOptions(opts ...client.LeaseOption) Option {
	return func(l *Lock) { l.leaseOpts = append(l.leaseOpts, opts...) }
}

// New returns a Lock for the election name, held as identity (unique
// among the candidates, such as the Pod's name), through c. The fence
// lock name is name; the record's key is "k8sleader/" + name unless
// WithRecordKey says otherwise. New makes no call.
func New(c *client.Client, name, identity string, opts ...Option) (*Lock, error) {
	switch {
	case c == nil:
		return nil, fmt.Errorf("%w: k8sleader.New needs a fence client", fence.ErrInvalidArgument)
	case name == "":
		return nil, fmt.Errorf("%w: k8sleader.New needs the election's name", fence.ErrInvalidArgument)
	case identity == "":
		return nil, fmt.Errorf("%w: k8sleader.New needs the candidate's identity", fence.ErrInvalidArgument)
	}
	l := &Lock{client: c, name: name, key: "k8sleader/" + name, identity: identity, now: time.Now}
	for _, opt := range opts {
		opt(l)
	}
	return l, nil
}

var _ resourcelock.Interface = (*Lock)(nil)

// Get reads the election record, linearizably, and remembers its revision
// for the next Update. A missing record is a Kubernetes NotFound error.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.op.Lock()
	defer l.op.Unlock()
	kv, err := l.client.KV().Get(ctx, l.key)
	if err != nil {
		return nil, nil, err
	}
	if kv == nil {
		l.setRevision(0)
		return nil, nil, apierrors.NewNotFound(recordResource, l.name)
	}
	var rec resourcelock.LeaderElectionRecord
	if err := json.Unmarshal(kv.GetValue(), &rec); err != nil {
		return nil, nil, fmt.Errorf("k8sleader: the value of %s is not a leader election record: %w", l.key, err)
	}
	l.setRevision(kv.GetModRevision())
	return &rec, kv.GetValue(), nil
}

// Create writes the record if there is none, with this identity as its
// holder, which takes the fence lease first. It fails with fence.ErrLocked
// while another identity's lease lives, and with a Kubernetes
// AlreadyExists error when the record exists.
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.op.Lock()
	defer l.op.Unlock()
	if ler.HolderIdentity != l.identity {
		return fmt.Errorf("%w: Create of a record held by %q, not this lock's identity %q", fence.ErrInvalidArgument, ler.HolderIdentity, l.identity)
	}
	err := l.lead(ctx, ler, 0)
	if apierrors.IsConflict(err) {
		return apierrors.NewAlreadyExists(recordResource, l.name)
	}
	return err
}

// Update writes the record if it is still at the revision this Lock last
// read or wrote (a Kubernetes Conflict error otherwise). With this
// identity as the holder it takes or renews the fence lease first, and
// fails as Create does while another identity's lease lives, or with
// ErrLeaseLost when this Lock's lease was lost. With no holder (client-go's
// release) it ends the term, writes the record at its latest revision if
// the term's own renewal moved it since, and releases the lease.
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	rev, known := l.rev, l.known
	l.mu.Unlock()
	switch {
	case !known:
		return fmt.Errorf("%w: Update before Get: the record's revision is unknown", fence.ErrInvalidArgument)
	case rev == 0:
		return apierrors.NewNotFound(recordResource, l.name) // Create makes it
	}
	switch ler.HolderIdentity {
	case l.identity:
		return l.lead(ctx, ler, rev)
	case "":
		return l.release(ctx, ler, rev)
	}
	return fmt.Errorf("%w: Update naming %q as the holder, not this lock's identity %q", fence.ErrInvalidArgument, ler.HolderIdentity, l.identity)
}

// lead takes or renews the lease, then writes ler fenced by it if the
// record is at rev. A term begun here ends if the write fails. A term
// whose context ended meanwhile (its SafeUntil passed while the calls were
// on their way) is lost, even though the calls succeeded: its controller
// has been told to stop, so the elector must not go on leading it.
func (l *Lock) lead(ctx context.Context, ler resourcelock.LeaderElectionRecord, rev uint64) error {
	t, fresh, err := l.holdLease(ctx, ler)
	if err != nil {
		return err
	}
	err = l.write(ctx, ler, t, rev)
	if err == nil && t.over() {
		l.lose(ctx, t, "its safe-until passed while it was renewed")
		return fmt.Errorf("%w: lease %d on %q: its safe-until passed while it was renewed", ErrLeaseLost, t.lease.ID(), l.name)
	}
	if err != nil && fresh {
		l.endTerm(t, fmt.Errorf("%w: the record could not be written: %v", ErrNotLeading, err))
		_ = t.lease.Release(ctx) // nobody was told of this term
	}
	return err
}

// holdLease renews the current term's lease, or begins a term with a new
// lease when there is none; fresh reports the latter.
func (l *Lock) holdLease(ctx context.Context, ler resourcelock.LeaderElectionRecord) (t *term, fresh bool, err error) {
	l.mu.Lock()
	t, until := l.term, l.lostUntil
	l.mu.Unlock()
	if t != nil {
		return t, false, l.renew(ctx, t)
	}
	if now := l.now(); now.Before(until) {
		return nil, false, fmt.Errorf("%w: this lock takes no new lease for another %v, so that its elector gives up the lost term first", ErrLeaseLost, until.Sub(now).Round(time.Millisecond))
	}
	ttl := time.Duration(ler.LeaseDurationSeconds) * time.Second
	if ttl < time.Second {
		return nil, false, fmt.Errorf("%w: a lease duration of %ds: fence leases last 1s at least", fence.ErrInvalidArgument, ler.LeaseDurationSeconds)
	}
	opts := append([]client.LeaseOption{client.WithLeaseOwner(l.identity)}, l.leaseOpts...)
	lease, err := l.client.Lease(ctx, l.name, ttl, opts...)
	if err != nil {
		return nil, false, err // fence.ErrLocked: another identity leads
	}
	return l.beginTerm(lease), true, nil
}

// renew renews t's lease. A lease past its SafeUntil, or that the service
// no longer has, is lost.
func (l *Lock) renew(ctx context.Context, t *term) error {
	if t.over() {
		l.lose(ctx, t, "its safe-until passed before it was renewed")
		return fmt.Errorf("%w: lease %d on %q: its safe-until passed before it was renewed", ErrLeaseLost, t.lease.ID(), l.name)
	}
	err := t.lease.Renew(ctx)
	if errors.Is(err, fence.ErrSessionNotFound) {
		l.lose(ctx, t, "it expired or was revoked")
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}

// write puts ler at the record's key, fenced strictly by t's token, if the
// key is at rev (0: absent).
func (l *Lock) write(ctx context.Context, ler resourcelock.LeaderElectionRecord, t *term, rev uint64) error {
	data, err := json.Marshal(ler)
	if err != nil {
		return err
	}
	newRev, err := l.client.KV().Put(ctx, l.key, data,
		client.FencedBy(l.name, t.lease.Token()), client.Strict(), client.IfRevision(rev))
	switch {
	case err == nil:
		l.setRevision(newRev)
		return nil
	case errors.Is(err, fence.ErrRevisionMismatch):
		return apierrors.NewConflict(recordResource, l.name, err)
	case errors.Is(err, fence.ErrStaleToken), errors.Is(err, fence.ErrNotHolder):
		l.lose(ctx, t, "fence refused its token")
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}

// release ends the current term, writes ler (which names no holder) fenced
// by its lease, over the term's own late renewals (writeOver), and
// releases the lease, so that the next candidate takes over at once.
func (l *Lock) release(ctx context.Context, ler resourcelock.LeaderElectionRecord, rev uint64) error {
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	if t == nil {
		return fmt.Errorf("%w: nothing to release; the record is left to its holder", ErrNotLeading)
	}
	l.endTerm(t, fmt.Errorf("%w: the term was released", ErrNotLeading))
	werr := l.writeOver(ctx, ler, t, rev)
	if errors.Is(werr, ErrLeaseLost) {
		return werr
	}
	return errors.Join(werr, t.lease.Release(ctx))
}

// writeOver writes ler, fenced by t's token, at the record's latest
// revision when the record moved since rev. While t's lease lives, strict
// fencing refuses every other candidate's write, so a record that moved is
// this Lock's own earlier write: a renewal whose caller gave up (client-go
// cancels its context while the call is on its way) and that the service
// applied after the release read the record. Failing the release on it
// would leave the record naming this holder for its whole lease duration,
// its term already ended here. A renewal sent before that one names an
// older revision, and is refused once this write lands.
func (l *Lock) writeOver(ctx context.Context, ler resourcelock.LeaderElectionRecord, t *term, rev uint64) error {
	for tries := 1; ; tries++ {
		err := l.write(ctx, ler, t, rev)
		if !apierrors.IsConflict(err) || tries == maxReleaseWrites {
			return err
		}
		kv, gerr := l.client.KV().Get(ctx, l.key)
		if gerr != nil || kv == nil {
			return errors.Join(err, gerr)
		}
		rev = kv.GetModRevision()
	}
}

// maxReleaseWrites bounds writeOver: each conflict is one more renewal
// that client-go abandoned, and it abandons one at a time.
const maxReleaseWrites = 3

// beginTerm makes lease the current term's, and arms the timer that ends
// the term's context when its SafeUntil passes without a renewal.
func (l *Lock) beginTerm(lease *client.Lease) *term {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &term{lease: lease, ctx: ctx, cancel: cancel}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.term = t
	t.timer = time.AfterFunc(time.Until(lease.SafeUntil()), func() { l.checkSafeUntil(t) })
	return t
}

// checkSafeUntil ends t's context if its lease's SafeUntil has passed, or
// looks again when it will have (a renewal moved it on).
func (l *Lock) checkSafeUntil(t *term) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.ctx.Err() != nil {
		return
	}
	if left := time.Until(t.lease.SafeUntil()); left > 0 {
		t.timer.Reset(left)
		return
	}
	t.cancel(fmt.Errorf("%w: lease %d on %q was not renewed before its safe-until", ErrLeaseLost, t.lease.ID(), l.name))
}

// endTerm ends t, with cause as its context's cause, if it is still the
// current term.
func (l *Lock) endTerm(t *term, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == t {
		l.term = nil
	}
	t.timer.Stop()
	t.cancel(cause)
}

// lose ends t as lost, and keeps the Lock from taking a new lease for the
// lease's TTL and a second: longer than the renew deadline of the elector
// that led the term (client-go requires it below the lease duration, which
// is under the TTL's whole seconds plus one), so that the elector gives
// the term up instead of carrying on under a new token. The lease is
// released, in case the service still has it.
func (l *Lock) lose(ctx context.Context, t *term, why string) {
	l.endTerm(t, fmt.Errorf("%w: lease %d on %q: %s", ErrLeaseLost, t.lease.ID(), l.name, why))
	l.mu.Lock()
	l.lostUntil = l.now().Add(t.lease.TTL() + time.Second)
	l.mu.Unlock()
	_ = t.lease.Release(ctx)
}

func (l *Lock) setRevision(rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.known = rev, true
}

// RecordEvent records client-go's event s ("became leader", "stopped
// leading") with the recorder of WithEventRecorder, if any.
func (l *Lock) RecordEvent(s string) {
	if l.recorder == nil {
		return
	}
	l.recorder.Eventf(l.eventObj, "Normal", "LeaderElection", "%v %v", l.identity, s)
}

// Identity returns the candidate's identity, as New was given it.
func (l *Lock) Identity() string { return l.identity }

// Describe names the lock and its record for client-go's log lines.
func (l *Lock) Describe() string {
	return fmt.Sprintf("fence lock %q (record at key %q)", l.name, l.key)
}

// Name returns the fence lock's name, which a strict fence names along
// with the token (client.FencedBy(lock.Name(), token), a fencing.Guard's
// checker).
func (l *Lock) Name() string { return l.name }

// Token returns the fencing token of the current term: send it with every
// write the leader makes. It is 0 when the Lock is not leading. Read it
// once when leadership begins (OnStartedLeading) and use that value for
// the term's writes: a later term has another. A term whose Context has
// ended is over, though Token still returns its token until the elector's
// next call finds the lease lost: a stale token is refused where a
// missing one might pass as an unfenced write.
func (l *Lock) Token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == nil {
		return 0
	}
	return l.term.lease.Token()
}

// SafeUntil returns the instant (compare it with time.Now) until which the
// current term's lease is known to hold: when the last renewal was sent,
// plus the TTL less the client's drift bound and margin. After it the
// service may have given the lock to another. The zero time when the Lock
// is not leading.
func (l *Lock) SafeUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == nil {
		return time.Time{}
	}
	return l.term.lease.SafeUntil()
}

// Context returns the current term's context, which ends, with
// ErrLeaseLost or ErrNotLeading as its cause (context.Cause), when the
// term is lost or released, or when SafeUntil passes without a renewal.
// When the Lock is not leading it returns a context that has ended.
func (l *Lock) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == nil {
		return notLeading
	}
	return l.term.ctx
}

// notLeading is the Context of a Lock with no term.
var notLeading = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotLeading)
	return ctx
}()

// WithTerm returns a context derived from parent that also ends when the
// current term does (with the term's cause), and that carries the lock's
// name and the term's token for package fencing: fencing.Transport sends
// them with each HTTP request made with it (the Fence-Lock and Fence-Token
// headers), and fencing.TokenFrom reads them back. When the Lock is not
// leading the context has ended already, with ErrNotLeading. Call stop
// when done, to release what it holds.
func (l *Lock) WithTerm(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	ctx, cancel := context.WithCancelCause(parent)
	if t == nil {
		cancel(ErrNotLeading)
		return ctx, func() {}
	}
	unhook := context.AfterFunc(t.ctx, func() { cancel(context.Cause(t.ctx)) })
	return fencing.WithToken(ctx, l.name, t.lease.Token()), func() {
		unhook()
		cancel(nil)
	}
}
