package fence

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by fence wrap exactly one of them
// (ErrDiskFull is a kind of ErrUnavailable, and wraps it; ErrSessionSecret
// and ErrAuthFailed are kinds of ErrUnauthenticated).
var (
	// ErrInvalidArgument reports a malformed request: a bad lock name, a TTL
	// out of bounds, an oversized value. Retrying the same request fails again.
	ErrInvalidArgument = errors.New("fence: invalid argument")

	// ErrSessionNotFound reports a session that does not exist or has expired;
	// everything it held has been released.
	ErrSessionNotFound = errors.New("fence: session not found or expired")

	// ErrLocked reports that a lock could not be taken without waiting.
	ErrLocked = errors.New("fence: lock is held")

	// ErrNotHolder reports a release or check by a session, or with a token,
	// that does not hold the lock.
	ErrNotHolder = errors.New("fence: not the lock's holder")

	// ErrStaleToken reports a write carrying a fencing token lower than one
	// the resource has already accepted. Nothing of the write was applied.
	ErrStaleToken = errors.New("fence: stale fencing token")

	// ErrCancelled reports an Acquire whose request was given up
	// (CancelAcquire): it was not granted, and will not be.
	ErrCancelled = errors.New("fence: acquire cancelled")

	// ErrWaitTimeout reports that a lock was not granted within the wait timeout.
	ErrWaitTimeout = errors.New("fence: timed out waiting for the lock")

	// ErrUnavailable reports that the node has no leader right now or is
	// shutting down; the request may be retried, here or on another node.
	ErrUnavailable = errors.New("fence: service unavailable")

	// ErrDiskFull is a write that failed because a node's data dir is out
	// of space. It wraps ErrUnavailable: another node of a group may take
	// over as leader and accept the retry.
	ErrDiskFull = fmt.Errorf("%w: disk full", ErrUnavailable)

	// ErrLimit reports that a configured limit (sessions, waiters, request
	// size) was reached.
	ErrLimit = errors.New("fence: limit reached")

	// ErrRevisionMismatch reports a compare-and-swap whose expected revision
	// was not the current one.
	ErrRevisionMismatch = errors.New("fence: revision mismatch")

	// ErrCompacted reports a watch from a revision older than the changes
	// the node still keeps: list again, and watch from the list's revision
	// + 1.
	ErrCompacted = errors.New("fence: revision compacted")

	// ErrUnauthenticated reports that the node did not accept the client's
	// credentials, or the client the node's: a TLS certificate missing,
	// expired or signed by a CA the other side does not trust, TLS on one
	// side only, or a session's secret (ErrSessionSecret). Retrying does
	// not help.
	ErrUnauthenticated = errors.New("fence: not authenticated")

	// ErrWrongCluster reports a node of another group than the one the
	// client talks to: its endpoints mix two groups (a stale address, a
	// port reused by another deployment). The client never acts on such a
	// node's answers; retrying elsewhere helps, retrying there does not.
	ErrWrongCluster = errors.New("fence: node of another cluster")
	// ErrSessionSecret reports a call that acts as a session (a keepalive,
	// an acquire, a release, a close, a put bound to it) without the
	// secret the session was created with, or with another: only the
	// session's creator may act as it. Nothing was changed. It wraps
	// ErrUnauthenticated.
	ErrSessionSecret = fmt.Errorf("%w: wrong or missing session secret", ErrUnauthenticated)

	// ErrAuthFailed reports a call refused because, with auth on, it
	// carried no credential, or one the service does not accept: an
	// unknown, revoked or expired bearer token, or a client certificate
	// naming no user. Nothing was changed. It wraps ErrUnauthenticated.
	ErrAuthFailed = fmt.Errorf("%w: no valid credential", ErrUnauthenticated)

	// ErrPermissionDenied reports a call refused because, with auth on,
	// the caller's roles do not grant the permission it needs; the message
	// names the permission and the prefix. Nothing was changed.
	ErrPermissionDenied = errors.New("fence: permission denied")

	// ErrMembership reports a membership change the leader refused: the
	// node named does not answer at its raft address (or another node
	// does), it did not catch up with the leader's log in time, or the
	// change would leave the group without a quorum of reachable voters.
	// The message says which; nothing changed unless it says a non-voter
	// was added.
	ErrMembership = errors.New("fence: membership change refused")

	// ErrUnsupported reports a call the group cannot serve yet: it needs a
	// newer group protocol than the group runs, because some member runs
	// an older version of fence (a rolling upgrade in progress), or the
	// node answering is of an older version itself. Nothing was changed.
	// The call succeeds once every member runs a version that speaks it.
	ErrUnsupported = errors.New("fence: not supported by the group yet")

	// ErrReleased is the cause of a grant's or a session's end by its own
	// holder: the lock was released, the session closed.
	ErrReleased = errors.New("fence: released by its holder")

	// ErrRevoked is the cause of a grant's end when someone other than its
	// holder released it (another client, an operator) while the holder's
	// session lived on: the holder must stop acting on it.
	ErrRevoked = errors.New("fence: released by someone else")

	// ErrSessionLost is reported by the client when a session's "safe until"
	// deadline passed without a renewal: the server may already have expired
	// the session and given its locks to others.
	ErrSessionLost = errors.New("fence: session may be lost")
)

// StaleTokenError is the ErrStaleToken of a fenced write: it names the token
// presented and the highest one the resource had accepted for the key.
type StaleTokenError struct {
	// Key is the protected resource key, or the lock name.
	Key string
	// Token is the token the write carried.
	Token uint64
	// Highest is the highest token accepted for Key before the write.
	Highest uint64
}

// Error returns a message such as "stale fencing token 33 < 34 for key orders/17".
func (e *StaleTokenError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("stale fencing token %d < %d", e.Token, e.Highest)
	}
	return fmt.Sprintf("stale fencing token %d < %d for key %s", e.Token, e.Highest, e.Key)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// LockedError is the ErrLocked of an acquire that would not wait: it names
// the lock and, when the lock has one, its newest holder, so that a caller
// can say who holds it without reading the message.
type LockedError struct {
	// Lock is the lock's name.
	Lock string
	// HolderSession and HolderToken are the newest holder's session and
	// token; 0 when the lock is under lock-delay, or free with waiters ahead.
	HolderSession, HolderToken uint64
	// Reason says why the lock could not be taken, for people: "lock
	// \"orders\" is held by session 3 with token 7".
	Reason string
}

// Error returns ErrLocked's message and the reason: "fence: lock is held:
// lock \"orders\" is held by session 3 with token 7".
func (e *LockedError) Error() string { return ErrLocked.Error() + ": " + e.Reason }

// Is makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// CheckToken applies the fenced write rule to one write: it returns nil
// if a write carrying token may be accepted where highest is the highest
// token accepted so far (token >= highest), a *StaleTokenError if it may
// not, and ErrInvalidArgument for token 0, which no grant carries. Every
// store and SQL helper of fence uses it, so that every refusal reads the
// same: "stale fencing token 33 < 34 for key orders/17".
func CheckToken(key string, token, highest uint64) error {
	if token == 0 {
		return fmt.Errorf("%w: a fenced write needs a fencing token (tokens start at 1)", ErrInvalidArgument)
	}
	if token < highest {
		return &StaleTokenError{Key: key, Token: token, Highest: highest}
	}
	return nil
}

// TokenStatus is what the lock service says of a token: whether it is a
// current grant of its lock, whether the lock is held at all, and the
// newest current grant's token (0 when the lock is free).
type TokenStatus struct {
	Current      bool
	Held         bool
	CurrentToken uint64
}
