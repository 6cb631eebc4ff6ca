package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/fencelock/fence"
)

// A composite operation (Campaign, a queue's hand-out, a double barrier's
// Enter) takes something through a session (a lock, a key bound to the
// session) and then makes another call. When a later step fails, it gives
// back what it took, as a failed Acquire gives up its request (abandon):
// otherwise the session would hold it for as long as it lives, and the
// next campaigner, consumer or party would wait for ever. Giving back runs
// on a context of its own (undoContext), since the caller's may be what
// ended; and when the service cannot be told, the session itself is given
// up (giveUp), whose end releases its locks and deletes its keys.

// undoContext returns the context in which s gives back what a failed
// operation took: bounded by the session's TTL (past which the session
// may have expired, and released it all) and by the session's life.
func (s *Session) undoContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, s.ttl)
}

// giveUp ends s, unless it ended already, because what could not be given
// back (err says why) would otherwise stay held for as long as s lives:
// s is lost, so that the service releases it all, at once or at expiry.
func (s *Session) giveUp(what string, err error) {
	switch {
	case s.Err() != nil:
	case errors.Is(err, fence.ErrSessionNotFound):
		s.end(err)
	default:
		s.lose(fmt.Errorf("%w: could not give up %s (%v), so the session is given up instead", fence.ErrSessionLost, what, err))
	}
}

// mayHaveApplied reports whether a write that failed with err may have
// been applied: it was not refused outright (an unanswered call, one the
// caller's context ended, fence.ErrUnavailable).
func mayHaveApplied(err error) bool {
	for _, refused := range []error{fence.ErrInvalidArgument, fence.ErrLimit, fence.ErrPermissionDenied, fence.ErrUnauthenticated, fence.ErrNotHolder, fence.ErrStaleToken, fence.ErrRevisionMismatch, fence.ErrSessionNotFound, fence.ErrWrongCluster} {
		if errors.Is(err, refused) {
			return false
		}
	}
	return true
}

// giveUp undoes grant g of m, taken by a composite operation before a
// later step of it failed: it deletes key, which that step may have
// written under g, unless written is a refusal that wrote nothing (key
// "": no write), then releases the lock.
func (m *Mutex) giveUp(g *Grant, key string, written error) {
	s := m.s
	if s.Err() != nil {
		return // the session's end releases everything
	}
	ctx, cancel := s.undoContext()
	defer cancel()
	if key != "" && mayHaveApplied(written) {
		_, err := s.client.KV().Delete(ctx, key, WithGrant(g), Strict())
		if err != nil && !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
			s.giveUp(strconv.Quote(key)+", written by a failed operation", err)
			return
		}
	}
	if err := m.Unlock(ctx); err != nil && !errors.Is(err, fence.ErrNotHolder) {
		s.giveUp(strconv.Quote(m.name)+" after a failed operation", err)
	}
}
