package server

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
)

// The rate of creating sessions (docs/design.md, Auth: Quotas). Each
// identity has a token bucket on the leader, at the edge, on the leader's
// clock: the state machine reads no clock, so the decision cannot be
// replicated, and need not be (a refused CreateSession proposes nothing).
// The identity is the authenticated user with auth on, whose quota
// (session_rate, session_burst) gives the bucket's size, or else the
// server's default (Config.SessionRate, SessionBurst); with auth off it
// is the client's address, as the follower that forwarded the call
// reports it, with the server's default. Buckets live in the leader's
// memory: a new leader starts every one full.

// maxIdleBuckets is how many buckets the limiter keeps before it drops
// those that have refilled (which then start full again, as they were).
const maxIdleBuckets = 10_000

// bucket is one identity's: tokens at last, filled at rate per second
// up to burst (the rate and burst of its last call).
type bucket struct {
	tokens float64
	last   time.Time
	rate   float64
	burst  uint64
}

// sessionLimiter keeps the token buckets. It is safe for concurrent use.
type sessionLimiter struct {
	clock   clock.Clock
	mu      sync.Mutex
	buckets map[string]*bucket
}

func newSessionLimiter(c clock.Clock) *sessionLimiter {
	return &sessionLimiter{clock: c, buckets: map[string]*bucket{}}
}

// take takes a token from key's bucket of the given rate (per second) and
// burst, and returns 0; or, when the bucket is empty, takes nothing and
// returns how long until it holds a token.
func (l *sessionLimiter) take(key string, rate float64, burst uint64) time.Duration {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= maxIdleBuckets {
			l.dropFullLocked(now)
		}
		b = &bucket{tokens: float64(burst), last: now, rate: rate, burst: burst}
		l.buckets[key] = b
	}
	b.tokens = b.at(now)
	b.last, b.rate, b.burst = now, rate, burst // a changed quota applies from now
	b.tokens = min(b.tokens, float64(burst))
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration(math.Ceil((1 - b.tokens) / rate * float64(time.Second)))
}

// at returns b's tokens at now.
func (b *bucket) at(now time.Time) float64 {
	elapsed := max(now.Sub(b.last), 0).Seconds()
	return min(float64(b.burst), b.tokens+elapsed*b.rate)
}

// dropFullLocked forgets the buckets that are full at now: one made
// again starts full, as they are.
func (l *sessionLimiter) dropFullLocked(now time.Time) {
	for key, b := range l.buckets {
		if b.at(now) >= float64(b.burst) {
			delete(l.buckets, key)
		}
	}
}

// allowSession takes a token for a CreateSession from its caller's
// bucket (its user's, or for a call without a user its host's, as
// withClientAddr recorded it in ctx), or refuses it with ErrLimit naming
// the quota. Only a ready
// leader decides: a node that is not answers the call Unavailable anyway.
func (s *Server) allowSession(ctx context.Context) error {
	if !s.leaderReady.Load() {
		return nil
	}
	user := s.callerUser(ctx)
	rate, burst := s.cfg.SessionRate, uint64(s.cfg.SessionBurst)
	source := "the server's --session-rate"
	if user != "" {
		s.fsm.Read(func(st *fsm.State) {
			if u, ok := st.User(user); ok && u.Quota.SessionRate > 0 {
				rate, burst, source = u.Quota.SessionRate, u.Quota.SessionBurst, "quota"
			}
		})
	}
	if rate <= 0 || burst == 0 {
		return nil
	}
	who, key := "user "+user, "user\x00"+user
	if user == "" {
		addr, _ := ctx.Value(clientAddrKey{}).(string)
		who, key = "client "+addr, "addr\x00"+addr
	}
	wait := s.limiter.take(key, rate, burst)
	if wait == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: session rate quota %s/s (burst %d, %s) reached; retry in %v, or reuse sessions",
		fence.ErrLimit, who, strconv.FormatFloat(rate, 'g', -1, 64), burst, source, wait.Round(time.Millisecond))
}

// clientAddrKey is the context key of the host a call came from, for the
// session rate of clients without a user.
type clientAddrKey struct{}

// withClientAddr records in ctx the host a call came from (clientAddr).
func withClientAddr(ctx context.Context, peer string, h http.Header) context.Context {
	return context.WithValue(ctx, clientAddrKey{}, clientAddr(peer, h))
}

// clientAddr is the host a call came from: for a call a follower
// forwarded, the address the follower saw (the last X-Forwarded-For
// entry, which the follower appended); else the connection's peer. With
// auth off nothing is verified, so this names well-behaved clients, not
// an attacker, who could send the headers himself.
func clientAddr(peer string, h http.Header) string {
	if h.Get(fencev1.ForwardedByHeader) != "" {
		if xff := h.Values("X-Forwarded-For"); len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			if last := strings.TrimSpace(parts[len(parts)-1]); last != "" {
				return last
			}
		}
	}
	if host, _, err := net.SplitHostPort(peer); err == nil {
		return host
	}
	return peer
}
