package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Leases (docs/leases.md) are a lock in one call for callers that cannot
// keep a session alive. A lease is a session and a grant, made by the
// handlers below from the session and lock operations themselves, so that
// everything those check (validation, limits, quotas, rate, secrets, auth)
// holds for a lease as it does for them. No command is a lease's own: the
// state machine and the log know only the session and the grant.

// Lease implements fencev1connect.LockServiceHandler.
func (s handlers) Lease(ctx context.Context, req *connect.Request[fencev1.LeaseRequest]) (*connect.Response[fencev1.LeaseResponse], error) {
	return respond(s.lease(withClientAddr(ctx, req.Peer().Addr, req.Header()), req.Msg))
}

// lease creates a session and takes the lock for it with try. A lock that
// cannot be granted at once is refused before the session is created when
// the leader's state shows it so (lockedNow), and otherwise the session is
// closed in the same call once the grant failed: a failed Lease leaves
// nothing behind. Only a node that stops between the two commits, or
// cannot commit the close, leaves a session; it holds nothing, and the
// leader expires it after its TTL.
//
// A Lease whose caller drew the secret is safe to retry. Its session is
// committed under a key derived from the secret, and a retry is answered
// the lease its first attempt took (leaseAgain): found by that key, or, if
// the state no longer remembers it (it keeps the newest keys only) or the
// first attempt committed meanwhile, as the holder that refuses the lock
// and whose secret the caller's is. Such a Lease goes on when its caller
// goes away: the caller knows the secret and will ask again.
func (s *Server) lease(ctx context.Context, m *fencev1.LeaseRequest) (*fencev1.LeaseResponse, error) {
	if err := s.checkLockName(m.GetLock()); err != nil {
		return nil, err
	}
	ttl, err := s.sessionTTL(m.GetTtl())
	if err != nil {
		return nil, err
	}
	if _, err := s.lockDelay(m.GetLockDelay()); err != nil {
		return nil, err
	}
	if err := checkText("owner", m.GetOwner(), s.cfg.MaxOwnerBytes, false); err != nil {
		return nil, err
	}
	secret, key := m.GetLeaseSecret(), ""
	if secret != "" {
		if err := checkLeaseSecret(secret); err != nil {
			return nil, err
		}
		key = leaseKey(secret)
		ctx = context.WithoutCancel(ctx)
		var first fsm.Repeat
		var retry bool
		s.fsm.Read(func(st *fsm.State) { first, retry = st.Repeated(key) })
		if retry {
			return s.leaseAgain(ctx, m, first.SessionID, secret)
		}
	} else {
		secret = newSecret()
	}
	if err := s.lockedNow(ctx, m.GetLock()); err != nil {
		if holder, ok := s.heldWithSecret(err, key, secret); ok {
			return s.leaseAgain(ctx, m, holder, secret)
		}
		return nil, err
	}
	if err := s.allowSession(ctx); err != nil {
		return nil, err
	}
	id, repeated, err := s.commitSession(ctx, ttl, m.GetOwner(), secret, key)
	if err != nil {
		return nil, err
	}
	if repeated { // an attempt of the same call, at once with this one
		return s.leaseAgain(ctx, m, id, secret)
	}
	if err := ctx.Err(); err != nil {
		s.closeFailedLease(id, m.GetLock(), err)
		return nil, err
	}
	resp, err := s.takeLeaseLock(ctx, m, id, secret, durationpb.New(ttl))
	if err != nil {
		s.closeFailedLease(id, m.GetLock(), err)
	}
	return resp, err
}

// takeLeaseLock takes the Lease m's lock, with try, for its session id,
// and answers the lease with ttl.
func (s *Server) takeLeaseLock(ctx context.Context, m *fencev1.LeaseRequest, id uint64, secret string, ttl *durationpb.Duration) (*fencev1.LeaseResponse, error) {
	grant, err := s.acquire(ctx, &fencev1.AcquireRequest{
		SessionId:     id,
		SessionSecret: secret,
		Lock:          m.GetLock(),
		Try:           true,
		LockDelay:     m.GetLockDelay(),
	})
	if err != nil {
		return nil, err
	}
	return &fencev1.LeaseResponse{Lock: grant.GetLock(), Token: grant.GetToken(), LeaseId: id, LeaseSecret: secret, Ttl: ttl}, nil
}

// heldWithSecret reports the session that refused a Lease (err is its
// ErrLocked) when the Lease's caller drew the secret (key is set) and the
// holder's secret is the caller's: the lease an earlier attempt took.
func (s *Server) heldWithSecret(err error, key, secret string) (uint64, bool) {
	var locked *fence.LockedError
	if key == "" || !errors.As(err, &locked) || locked.HolderSession == 0 {
		return 0, false
	}
	return locked.HolderSession, s.authorizeSession(locked.HolderSession, secret) == nil
}

// leaseAgain answers a retry of a Lease whose first attempt made session
// id: it renews the session, as RenewLease does, so that the TTL answered
// counts from now, and answers the grant that attempt took, which a try by
// its holder is answered again. A session that holds another lock is not
// this Lease's (the same secret, another lock name) and is refused as it
// is. One that has ended (the lease was released, or expired) is refused
// as the lock stands: locked, or ended. One whose grant was never
// committed (its first attempt stopped in between) takes the lock now, or
// is closed if it cannot, as a first attempt's would be.
func (s *Server) leaseAgain(ctx context.Context, m *fencev1.LeaseRequest, id uint64, secret string) (*fencev1.LeaseResponse, error) {
	var held []fsm.SessionGrant
	s.fsm.Read(func(st *fsm.State) { held = st.HeldGrants(id) })
	for _, g := range held {
		if g.Lock != m.GetLock() {
			return nil, invalid("this lease_secret is the secret of lease %d, which holds lock %q, not %q: draw a new secret for each lease", id, g.Lock, m.GetLock())
		}
	}
	renewed := s.keepAlive(ctx, []*fencev1.KeepAliveRequest{{SessionId: id, SessionSecret: secret}})[0]
	if errors.Is(renewed.err, fence.ErrSessionNotFound) {
		if err := s.lockedNow(ctx, m.GetLock()); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: the lease taken with this secret has ended (it was released, it expired, or its first attempt was refused); take a new lease with a new secret", fence.ErrSessionNotFound)
	}
	if renewed.err != nil {
		return nil, renewed.err
	}
	resp, err := s.takeLeaseLock(ctx, m, id, secret, renewed.resp.GetTtl())
	if len(held) == 0 && errors.Is(err, fence.ErrLocked) {
		s.closeFailedLease(id, m.GetLock(), err)
	}
	return resp, err
}

// leaseSecretChars are the characters of a secret a Lease's caller draws
// (base64url's), and leaseSecretMin and leaseSecretMax bound its length:
// 22 characters carry 132 bits.
const (
	leaseSecretChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	leaseSecretMin   = 22
	leaseSecretMax   = 128
)

// checkLeaseSecret refuses a caller's lease secret too short to be drawn
// at random, too long, or of other characters than base64url's.
func checkLeaseSecret(secret string) error {
	if n := len(secret); n < leaseSecretMin || n > leaseSecretMax {
		return invalid("lease_secret is %d characters; want %d to %d, drawn at random (base64url of 16 to 96 random bytes)", n, leaseSecretMin, leaseSecretMax)
	}
	if i := strings.IndexFunc(secret, func(r rune) bool { return !strings.ContainsRune(leaseSecretChars, r) }); i >= 0 {
		return invalid("lease_secret has %q at byte %d; want only A-Z, a-z, 0-9, - and _", secret[i], i)
	}
	return nil
}

// leaseKey is the idempotency key of the session a Lease with the caller's
// secret commits. It starts with a control character, which no caller's
// key may hold (checkIdempotencyKey), so no other command can take it, and
// it is a hash: the state keeps it, and it must not give the secret away.
func leaseKey(secret string) string {
	sum := sha256.Sum256([]byte("fence lease\x00" + secret))
	return "\x00lease " + base64.RawURLEncoding.EncodeToString(sum[:])
}

// lockedNow refuses a Lease of a lock that a try could not take: held,
// under lock-delay, waited for, or a semaphore. It reads this node's state
// first, which costs nothing; a refusal is answered only once a
// linearizable read (a confirmation that this node still leads, begun
// after the call arrived) finds the same, so that a deposed leader never
// answers a lock held that has been released since. A lock that looks
// free is left to the acquire, which decides in its commit.
func (s *Server) lockedNow(ctx context.Context, name string) error {
	var err error
	s.fsm.Read(func(st *fsm.State) { err = st.TryRefusal(name) })
	if err == nil {
		return nil
	}
	if err := s.read(ctx, false); err != nil {
		return err
	}
	s.fsm.Read(func(st *fsm.State) { err = st.TryRefusal(name) })
	return err
}

// closeFailedLease closes the session of a Lease whose grant failed (why),
// as its own client's close: it holds nothing that anyone was told of, so
// there is nothing a lock-delay would protect. A grant made while the
// caller went away was already given up by the acquire. If the close
// cannot be committed, the session expires after its TTL.
func (s *Server) closeFailedLease(id uint64, lock string, why error) {
	if _, err := s.apply(endSession(s.fsm.Protocol(), id, fsmpb.SessionEnd_SESSION_END_CLOSED)); err != nil {
		s.logger.Warn("closing the session of a lease that was not granted failed; it expires after its TTL",
			"session", id, "lock", lock, "lease_err", why, "err", err)
	}
}

// RenewLease implements fencev1connect.LockServiceHandler.
func (s handlers) RenewLease(ctx context.Context, req *connect.Request[fencev1.RenewLeaseRequest]) (*connect.Response[fencev1.RenewLeaseResponse], error) {
	return respond(s.renewLease(ctx, req.Msg))
}

// renewLease is a keepalive of the lease's session (renewed by a leader
// confirmed current after the call arrived), answered with the grant the
// session holds: its oldest, should the lease's id have been used as a
// session to take more.
func (s *Server) renewLease(ctx context.Context, m *fencev1.RenewLeaseRequest) (*fencev1.RenewLeaseResponse, error) {
	id := m.GetLeaseId()
	if err := checkLeaseID(id); err != nil {
		return nil, err
	}
	res := s.keepAlive(ctx, []*fencev1.KeepAliveRequest{{SessionId: id, SessionSecret: m.GetLeaseSecret()}})[0]
	if res.err != nil {
		return nil, leaseError(id, res.err)
	}
	var (
		grants []fsm.SessionGrant
		live   bool
	)
	s.fsm.Read(func(st *fsm.State) {
		_, live = st.Session(id)
		grants = st.HeldGrants(id)
	})
	if !live {
		return nil, leaseError(id, notFound(id))
	}
	if len(grants) == 0 {
		return nil, fmt.Errorf("%w: lease %d holds no lock: its grant was released, though the lease was not; take a new lease", fence.ErrNotHolder, id)
	}
	oldest := grants[0]
	for _, g := range grants[1:] {
		if g.Token < oldest.Token {
			oldest = g
		}
	}
	return &fencev1.RenewLeaseResponse{Ttl: res.resp.GetTtl(), Lock: oldest.Lock, Token: oldest.Token}, nil
}

// ReleaseLease implements fencev1connect.LockServiceHandler.
func (s handlers) ReleaseLease(ctx context.Context, req *connect.Request[fencev1.ReleaseLeaseRequest]) (*connect.Response[fencev1.ReleaseLeaseResponse], error) {
	return respond(s.releaseLease(ctx, req.Msg))
}

// releaseLease closes the lease's session, as its own client does: its
// lock goes to the next waiter at once, with no lock-delay.
func (s *Server) releaseLease(_ context.Context, m *fencev1.ReleaseLeaseRequest) (*fencev1.ReleaseLeaseResponse, error) {
	id := m.GetLeaseId()
	if err := checkLeaseID(id); err != nil {
		return nil, err
	}
	err := s.authorizeSession(id, m.GetLeaseSecret())
	if errors.Is(err, fence.ErrSessionNotFound) {
		return &fencev1.ReleaseLeaseResponse{}, nil
	}
	if err != nil {
		return nil, leaseError(id, err)
	}
	res, err := s.apply(endSession(s.fsm.Protocol(), id, fsmpb.SessionEnd_SESSION_END_CLOSED))
	if err != nil {
		return nil, err
	}
	return &fencev1.ReleaseLeaseResponse{Released: len(res.Effects.Ended) > 0}, nil
}

func checkLeaseID(id uint64) error {
	if id == 0 {
		return invalid("lease_id is missing; pass the lease_id that Lease answered")
	}
	return nil
}

// leaseError says a session's error in a lease's words: a caller of the
// lease calls knows of no session, and sent lease_secret, not
// session_secret. The sentinel, and so the code and reason, stay.
func leaseError(id uint64, err error) error {
	switch {
	case errors.Is(err, fence.ErrSessionNotFound):
		return fmt.Errorf("%w: lease %d has expired or was released; its lock may be another's by now: take a new lease", fence.ErrSessionNotFound, id)
	case errors.Is(err, fence.ErrSessionSecret):
		return fmt.Errorf("%w: lease_secret is missing or not lease %d's; only the caller Lease answered may renew or release it", fence.ErrSessionSecret, id)
	}
	return err
}
