package fencing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fence"
)

// TokenChecker asks the lock service whether a token is a lock's current
// grant. *client.Client implements it; fencing itself does not depend on
// the client.
type TokenChecker interface {
	TokenStatus(ctx context.Context, lock string, token uint64) (fence.TokenStatus, error)
}

// Guard admits writes to a Store, optionally in strict mode. It is what the
// HTTP and Connect middleware use. A Guard is safe for concurrent use.
// The highest-token rule is atomic with the write (Store.Admit); strict
// mode's check with the service is not (see WithChecker).
type Guard struct {
	store   Store
	checker TokenChecker
	ttl     time.Duration
	max     int

	mu    sync.Mutex
	cache map[checkKey]checkEntry
}

type checkKey struct {
	lock  string
	token uint64
}

type checkEntry struct {
	res     fence.TokenStatus
	expires time.Time
}

// GuardOption configures a Guard.
type GuardOption func(*Guard)

// WithChecker turns on strict mode: besides the highest-token rule, a
// write's token must be its lock's current grant, as the service answers.
// Answers are cached for ttl (at most 1s; default 100ms when ttl is 0), for
// at most 4096 lock-token pairs; writes without a lock name are rejected.
//
// Strict mode is not atomic, as the fenced KV's strict writes are: Admit
// asks the service (or takes an answer up to ttl old) and then admits the
// write, and nothing keeps the lock where it was between the two. A holder
// whose lock moved on after that answer (its session expired, the lock was
// released and granted to another) can still write, until the new holder
// has written with its higher token, from when the highest-token rule
// refuses it. Strict mode narrows the window in which the highest-token
// rule alone admits a stale holder to the check's round trip plus ttl; it
// does not close it. Where it must be closed, write through the fenced KV
// with strict writes (client.Strict, fence kv put --strict), which check
// the grant in the same commit as the write; or make each new holder
// write its token to the resource (an Admit of its own, even of an empty
// write) before it acts, so that the store's atomic highest-token rule
// refuses every older token from then on.
func WithChecker(c TokenChecker, ttl time.Duration) GuardOption {
	return func(g *Guard) {
		g.checker = c
		g.ttl = min(max(ttl, 0), time.Second)
		if g.ttl == 0 {
			g.ttl = 100 * time.Millisecond
		}
	}
}

// NewGuard returns a guard over store.
func NewGuard(store Store, opts ...GuardOption) *Guard {
	g := &Guard{store: store, max: 4096, cache: map[checkKey]checkEntry{}}
	for _, opt := range opts {
		opt(g)
	}
	return g
}

// Store returns the guard's store.
func (g *Guard) Store() Store { return g.store }

// Admit applies the fenced write rule for key (and, in strict mode, checks
// that token is lock's current grant), then runs write, atomically with
// recording token (see Store.Admit).
func (g *Guard) Admit(ctx context.Context, key, lock string, token uint64, write func(ctx context.Context) error) error {
	if key == "" {
		return fmt.Errorf("%w: the resource key is empty", fence.ErrInvalidArgument)
	}
	if g.checker != nil {
		if err := g.checkCurrent(ctx, lock, token); err != nil {
			return err
		}
	}
	return g.store.Admit(ctx, key, token, write)
}

func (g *Guard) checkCurrent(ctx context.Context, lock string, token uint64) error {
	if lock == "" {
		return fmt.Errorf("%w: strict fencing needs the lock name with the token", fence.ErrInvalidArgument)
	}
	res, err := g.check(ctx, lock, token)
	if err != nil {
		return fmt.Errorf("checking token %d of lock %q with the fence service: %w", token, lock, err)
	}
	switch {
	case res.Current:
		return nil
	case !res.Held:
		return fmt.Errorf("%w: token %d is not a current grant: lock %q is not held", fence.ErrNotHolder, token, lock)
	}
	return fmt.Errorf("%w: token %d is not the current grant of lock %q (the current token is %d)", fence.ErrNotHolder, token, lock, res.CurrentToken)
}

func (g *Guard) check(ctx context.Context, lock string, token uint64) (fence.TokenStatus, error) {
	key := checkKey{lock, token}
	now := time.Now()
	g.mu.Lock()
	e, ok := g.cache[key]
	g.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.res, nil
	}
	res, err := g.checker.TokenStatus(ctx, lock, token)
	if err != nil {
		return res, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.cache) >= g.max {
		for k, e := range g.cache {
			if !now.Before(e.expires) {
				delete(g.cache, k)
			}
		}
		if len(g.cache) >= g.max {
			g.cache = map[checkKey]checkEntry{}
		}
	}
	g.cache[key] = checkEntry{res: res, expires: now.Add(g.ttl)}
	return res, nil
}
