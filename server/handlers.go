package server

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// The handlers validate every field at the edge, so that what reaches the
// state machine is well-formed, and return errors that wrap fence sentinels;
// the error interceptor turns those into codes and details.

// The unary handlers are thin wrappers: each operation's logic takes the
// request message and the call's context (which carries the caller's
// checked identity, see callerUser), and, for writes, the idempotency key,
// so that the stream (stream.go) runs exactly what the unary calls run.

// respond wraps an operation's answer for a unary call.
func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}

func (s *Server) createSession(ctx context.Context, m *fencev1.CreateSessionRequest) (*fencev1.CreateSessionResponse, error) {
	ttl, err := s.sessionTTL(m.GetTtl())
	if err != nil {
		return nil, err
	}
	if err := checkText("owner", m.GetOwner(), s.cfg.MaxOwnerBytes, false); err != nil {
		return nil, err
	}
	if err := s.allowSession(ctx); err != nil {
		return nil, err
	}
	// No idempotency key: the secret is answered once and kept only as a
	// hash, so a repeat could not answer it again. A session whose answer
	// was lost holds nothing and expires after its TTL.
	secret := newSecret()
	id, _, err := s.commitSession(ctx, ttl, m.GetOwner(), secret, "")
	if err != nil {
		return nil, err
	}
	return &fencev1.CreateSessionResponse{SessionId: id, Ttl: durationpb.New(ttl), SessionSecret: secret}, nil
}

// commitSession commits a new session of ttl and owner whose secret is
// secret, checked and allowed by the caller. With an idempotency key (a
// lease whose caller drew its secret), a retry answers the session the
// first commit made, and repeated is true.
func (s *Server) commitSession(ctx context.Context, ttl time.Duration, owner, secret, key string) (id uint64, repeated bool, err error) {
	res, err := s.apply(&fsmpb.Command{IdempotencyKey: key, Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{
		TtlNs:        int64(ttl),
		Owner:        owner,
		MaxSessions:  uint64(s.cfg.MaxSessions),
		SecretSha256: fsm.SecretHash(secret),
		User:         s.callerUser(ctx),
	}}})
	if err != nil {
		return 0, false, err
	}
	if r, ok := res.Repeat(); ok {
		return r.SessionID, true, nil
	}
	return res.CreateSession().SessionID, false, nil
}

// KeepAlive implements fencev1connect.SessionServiceHandler. The leader
// renews the session in memory, then confirms that it still leads (one
// confirmation serves every keepalive and read that arrived before it).
func (s handlers) KeepAlive(ctx context.Context, req *connect.Request[fencev1.KeepAliveRequest]) (*connect.Response[fencev1.KeepAliveResponse], error) {
	res := s.keepAlive(ctx, []*fencev1.KeepAliveRequest{req.Msg})[0]
	return respond(res.resp, res.err)
}

// keepAliveResult is one session's answer to a keepalive.
type keepAliveResult struct {
	resp *fencev1.KeepAliveResponse
	err  error
}

// keepAlive renews sessions: a unary KeepAlive's one, or a stream's many.
// Each is renewed in the leader's memory, then one leadership confirmation
// that began after all of them arrived serves them all. The FSM and the
// tracker are each locked once per renewalChunk sessions, not once per
// session: a client holding thousands of sessions renews them in one
// message every few seconds.
func (s *Server) keepAlive(ctx context.Context, reqs []*fencev1.KeepAliveRequest) []keepAliveResult {
	rs := make([]renewal, len(reqs))
	for i, m := range reqs {
		rs[i] = renewal{id: m.GetSessionId(), secret: m.GetSessionSecret()}
		rs[i].err = checkSessionID(rs[i].id)
	}
	s.authorizeSessions(rs)
	s.tracker.keepAliveAll(rs)
	out := make([]keepAliveResult, len(reqs))
	if !slices.ContainsFunc(rs, func(r renewal) bool { return r.err == nil }) {
		for i := range rs {
			out[i].err = rs[i].err
		}
		return out
	}
	// The renewal counts only if this node still led after it: a leader
	// replaced while it was paused must not move the client's safe-until
	// past the new leader's expiry of the session. The confirmation also
	// applies every earlier entry, so an expiry committed by another leader
	// in between has ended the session by the time stillAlive looks.
	if err := s.confirmer.wait(ctx); err != nil {
		for i := range rs {
			out[i].err = cmp.Or(rs[i].err, err)
		}
		return out
	}
	s.tracker.stillAlive(rs)
	for chunk := range slices.Chunk(rs, renewalChunk) {
		s.fsm.Read(func(st *fsm.State) {
			for i := range chunk {
				if r := &chunk[i]; r.err == nil {
					r.held = st.HeldTokens(r.id)
				}
			}
		})
	}
	for i, r := range rs {
		if out[i].err = r.err; r.err == nil {
			out[i].resp = &fencev1.KeepAliveResponse{Ttl: durationpb.New(r.ttl), Held: &fencev1.HeldGrants{Tokens: r.held}}
		}
	}
	return out
}

// closeSession serves CloseSession. Closing a session that does not exist
// succeeds: the call is idempotent. A session its client abandons ends as
// an expiry ends it, under lock-delay.
func (s *Server) closeSession(_ context.Context, m *fencev1.CloseSessionRequest) (*fencev1.CloseSessionResponse, error) {
	id := m.GetSessionId()
	err := s.authorizeSession(id, m.GetSessionSecret())
	if errors.Is(err, fence.ErrSessionNotFound) {
		return &fencev1.CloseSessionResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	end := fsmpb.SessionEnd_SESSION_END_CLOSED
	if m.GetAbandon() {
		end = fsmpb.SessionEnd_SESSION_END_ABANDONED
	}
	res, err := s.apply(endSession(s.fsm.Protocol(), id, end))
	if err != nil {
		return nil, err
	}
	if len(res.Effects.Ended) > 0 && m.GetAbandon() {
		s.logger.Info("session abandoned by its client", "session", id, "delayed", len(res.Effects.Delayed))
	}
	return &fencev1.CloseSessionResponse{}, nil
}

// ListSessions implements fencev1connect.SessionServiceHandler.
func (s handlers) ListSessions(ctx context.Context, req *connect.Request[fencev1.ListSessionsRequest]) (*connect.Response[fencev1.ListSessionsResponse], error) {
	if err := s.read(ctx, req.Msg.GetStale()); err != nil {
		return nil, err
	}
	out := &fencev1.ListSessionsResponse{}
	s.fsm.Read(func(st *fsm.State) {
		for _, info := range st.Sessions() {
			si := &fencev1.SessionInfo{SessionId: info.ID, Owner: info.Owner, Ttl: durationpb.New(info.TTL)}
			for _, g := range st.HeldGrants(info.ID) {
				si.Held = append(si.Held, &fencev1.SessionGrant{Lock: g.Lock, Token: g.Token, Mode: apiMode(g.Mode)})
			}
			out.Sessions = append(out.Sessions, si)
		}
	})
	for _, si := range out.Sessions {
		if left, ok := s.tracker.expiresIn(si.GetSessionId()); ok {
			si.ExpiresIn = durationpb.New(left)
		}
	}
	return connect.NewResponse(out), nil
}

func (s *Server) acquire(ctx context.Context, m *fencev1.AcquireRequest) (*fencev1.AcquireResponse, error) {
	if err := checkSessionID(m.GetSessionId()); err != nil {
		return nil, err
	}
	if err := s.checkLockName(m.GetLock()); err != nil {
		return nil, err
	}
	md, err := mode(m.GetMode())
	if err != nil {
		return nil, err
	}
	if err := checkPermits(md, m.GetPermits(), s.cfg.MaxPermits); err != nil {
		return nil, err
	}
	waitTimeout, err := duration("wait_timeout", m.GetWaitTimeout(), 0)
	if err != nil {
		return nil, err
	}
	lockDelay, err := s.lockDelay(m.GetLockDelay())
	if err != nil {
		return nil, err
	}

	poll, err := duration("poll", m.GetPoll(), 0)
	if err != nil {
		return nil, err
	}
	if poll > 0 && (m.GetRequestId() == 0 || m.GetTry()) {
		return nil, invalid("poll needs a request_id, and a call that waits (not try)")
	}
	if err := s.authorizeSession(m.GetSessionId(), m.GetSessionSecret()); err != nil {
		return nil, err
	}

	// Register before proposing, so that a grant handed over by a release
	// committed right after our enqueue is not missed.
	w := s.hub.register(m.GetSessionId(), m.GetLock())
	defer s.hub.unregister(w)
	if g, ok := s.resumeWait(ctx, w, m); ok {
		// w registered before the state was read: whatever it is told
		// came after, so it waits from index 0.
		return s.waitResponse(ctx, w, 0, g, waitTimeout, poll)
	}
	res, index, err := s.applyAt(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{
		SessionId:       m.GetSessionId(),
		Lock:            m.GetLock(),
		Mode:            uint32(md),
		Try:             m.GetTry(),
		LockDelayNs:     int64(lockDelay),
		MaxWaiters:      uint64(s.cfg.MaxWaitersPerLock),
		MaxLocks:        uint64(s.cfg.MaxLocks),
		MaxSessionLocks: uint64(s.cfg.MaxLocksPerSession),
		Permits:         m.GetPermits(),
		RequestId:       m.GetRequestId(),
	}}})
	if err != nil {
		return nil, err
	}
	a := res.Acquire()
	w.req = request{id: m.GetRequestId(), attempt: a.Attempt, polls: poll > 0}
	if a.Grant != nil {
		if ctx.Err() != nil && !w.req.polls {
			// The caller went away while the grant was committed: give
			// up what this call left, unless a retry took it over. A call
			// without a request id gives up only a grant it made itself.
			if w.req.id != 0 || len(res.Effects.Grants) > 0 {
				s.giveUp(w, a.Grant)
			}
			return nil, ctx.Err()
		}
		return grantResponse(*a.Grant), nil
	}
	return s.waitResponse(ctx, w, index, nil, waitTimeout, poll)
}

// errStillWaiting ends a wait whose poll interval passed first.
var errStillWaiting = errors.New("still waiting")

// waitResponse waits for a queued Acquire's grant (g, if it is known
// already) and answers it, or answers waiting once poll passes.
func (s *Server) waitResponse(ctx context.Context, w *waiter, index uint64, g *fsm.Grant, timeout, poll time.Duration) (*fencev1.AcquireResponse, error) {
	if g != nil {
		return grantResponse(*g), nil
	}
	granted, err := s.wait(ctx, w, index, timeout, poll)
	if errors.Is(err, errStillWaiting) {
		return &fencev1.AcquireResponse{Lock: w.key.Lock, Waiting: true, Attempt: w.req.attempt}, nil
	}
	if err != nil {
		return nil, err
	}
	return grantResponse(granted), nil
}

// resumeWait takes up, without a new command, the wait or grant that an
// earlier call of the same request left at resume_attempt after it was
// answered waiting. It returns the grant if the request holds one
// already. ok is false when the request moved on (a retry elsewhere took it
// over, the wait was dropped): the caller then proposes as for any retry.
func (s *Server) resumeWait(ctx context.Context, w *waiter, m *fencev1.AcquireRequest) (g *fsm.Grant, ok bool) {
	if m.GetResumeAttempt() == 0 || m.GetRequestId() == 0 {
		return nil, false
	}
	// The state is read as a linearizable read is: only once this node is
	// confirmed to lead after the call arrived. A leader paused and replaced
	// would otherwise answer from its old state a grant that has since been
	// expired and handed on.
	if err := s.read(ctx, false); err != nil {
		return nil, false
	}
	var (
		attempt uint64
		waiting bool
	)
	s.fsm.Read(func(st *fsm.State) {
		attempt, waiting, g = st.RequestState(m.GetSessionId(), m.GetLock(), m.GetRequestId())
	})
	if attempt != m.GetResumeAttempt() || (!waiting && g == nil) {
		return nil, false
	}
	w.req = request{id: m.GetRequestId(), attempt: attempt, polls: true}
	return g, true
}

// request is the client's id of an Acquire call and the attempt number the
// state gave this try of it; a zero id when the client sent none. polls is
// set when the call polls: its caller retries until answered and gives up
// the request itself (CancelAcquire) when it stops, so the server does not
// give up what the call left when the caller goes away, which could race
// with a retry of it elsewhere; a caller that dies ends with its session.
type request struct {
	id, attempt uint64
	polls       bool
}

// giveUp drops the wait or releases the grant (g, if known) that an Acquire
// whose caller went away left behind. With a request id it acts only on
// that request at this attempt, so a retry of the call that took them over
// keeps them. Without one, a grant is released only if no other call of
// the session waits on the same lock to report it.
func (s *Server) giveUp(w *waiter, g *fsm.Grant) {
	if w.req.id != 0 {
		_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_CancelAcquire{CancelAcquire: &fsmpb.CancelAcquire{
			SessionId: w.key.Session, Lock: w.key.Lock, RequestId: w.req.id, Attempt: w.req.attempt,
		}}})
		if err != nil {
			s.logger.Warn("giving up an acquire whose caller went away", "lock", w.key.Lock, "session", w.key.Session, "request", w.req.id, "err", err)
		}
		return
	}
	if g == nil {
		granted, ok, err := s.cancelWait(w, false)
		if err != nil || !ok {
			return
		}
		g = &granted
	}
	if !s.hub.unregister(w) {
		s.releaseQuietly(*g)
	}
}

// wait blocks a queued Acquire until its grant is committed, its session
// ends, the wait times out or the call is cancelled. Only a grant is ever
// reported as one, and no grant is left behind that the caller never learns of.
func (s *Server) wait(ctx context.Context, w *waiter, index uint64, timeout, poll time.Duration) (fsm.Grant, error) {
	var expired, polled <-chan time.Time
	if timeout > 0 {
		t := s.cfg.Clock.NewTimer(timeout)
		defer t.Stop()
		expired = t.C()
	}
	if poll > 0 {
		t := s.cfg.Clock.NewTimer(poll)
		defer t.Stop()
		polled = t.C()
	}
	// A wait lasts only as long as its caller may take the lock.
	auth := s.watchAuth(ctx)
	defer auth.Stop()
	for {
		select {
		case <-auth.Lost():
			s.giveUp(w, nil)
			return fsm.Grant{}, fmt.Errorf("the wait for lock %q ended: %w", w.key.Lock, auth.Err())
		case <-polled:
			return fsm.Grant{}, errStillWaiting
		case <-w.notify:
			if o, ok := w.take(index); ok {
				return o.grant, o.err
			}
		case <-expired:
			g, granted, err := s.cancelWait(w, true)
			if err != nil {
				return fsm.Grant{}, err
			}
			if granted {
				return g, nil // granted just as the wait timed out: the caller is still there
			}
			return fsm.Grant{}, fmt.Errorf("%w: lock %q was not granted within %v", fence.ErrWaitTimeout, w.key.Lock, timeout)
		case <-ctx.Done():
			// A polling caller keeps its place for its next poll, unless
			// its call ended because it may no longer take the lock.
			if !w.req.polls || auth.Check() != nil {
				s.giveUp(w, nil)
			}
			return fsm.Grant{}, ctx.Err()
		case <-s.done:
			return fsm.Grant{}, fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
		}
	}
}

// cancelWait takes a wait out of the lock's queue, because its timeout
// passed or its caller went away. If the lock had already been granted, it
// returns that grant instead. With a request id it acts only on that
// request at w's attempt.
func (s *Server) cancelWait(w *waiter, timedOut bool) (fsm.Grant, bool, error) {
	res, err := s.apply(cancelWaitCommand(s.fsm.Protocol(), w, timedOut))
	if err != nil {
		return fsm.Grant{}, false, err
	}
	if g := res.CancelWait().Grant; g != nil {
		return *g, true, nil
	}
	return fsm.Grant{}, false, nil
}

// cancelWaitCommand is the CancelWait of w for a group at protocol: that
// it timed out goes in the log only from Protocol4 on, which every member
// knows (below it, its lock event says cancelled).
func cancelWaitCommand(protocol uint32, w *waiter, timedOut bool) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CancelWait{CancelWait: &fsmpb.CancelWait{
		SessionId: w.key.Session, Lock: w.key.Lock, RequestId: w.req.id, Attempt: w.req.attempt,
		TimedOut: timedOut && protocol >= fsm.Protocol4,
	}}}
}

func (s *Server) releaseQuietly(g fsm.Grant) {
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{SessionId: g.Session, Lock: g.Lock, Token: g.Token}}})
	if err != nil {
		s.logger.Warn("releasing a grant whose caller went away", "lock", g.Lock, "session", g.Session, "token", g.Token, "err", err)
	}
}

func grantResponse(g fsm.Grant) *fencev1.AcquireResponse {
	return &fencev1.AcquireResponse{Lock: g.Lock, Token: g.Token, Mode: apiMode(g.Mode)}
}

func (s *Server) release(_ context.Context, m *fencev1.ReleaseRequest) (*fencev1.ReleaseResponse, error) {
	if err := checkSessionID(m.GetSessionId()); err != nil {
		return nil, err
	}
	if err := s.checkLockName(m.GetLock()); err != nil {
		return nil, err
	}
	if m.GetToken() == 0 {
		return nil, invalid("token is missing; pass the token of the grant to release")
	}
	if err := s.authorizeSession(m.GetSessionId(), m.GetSessionSecret()); err != nil {
		return nil, err
	}
	if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{
		SessionId: m.GetSessionId(), Lock: m.GetLock(), Token: m.GetToken(),
	}}}); err != nil {
		return nil, err
	}
	return &fencev1.ReleaseResponse{}, nil
}

func (s *Server) cancelAcquire(_ context.Context, m *fencev1.CancelAcquireRequest) (*fencev1.CancelAcquireResponse, error) {
	if err := checkSessionID(m.GetSessionId()); err != nil {
		return nil, err
	}
	if err := s.checkLockName(m.GetLock()); err != nil {
		return nil, err
	}
	if m.GetRequestId() == 0 {
		return nil, invalid("request_id is missing; pass the request_id of the Acquire to cancel")
	}
	if err := s.authorizeSession(m.GetSessionId(), m.GetSessionSecret()); err != nil {
		return nil, err
	}
	res, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_CancelAcquire{CancelAcquire: &fsmpb.CancelAcquire{
		SessionId: m.GetSessionId(), Lock: m.GetLock(), RequestId: m.GetRequestId(),
	}}})
	if err != nil {
		return nil, err
	}
	a := res.CancelAcquire()
	return &fencev1.CancelAcquireResponse{Released: a.Released, Dequeued: a.Dequeued}, nil
}

func (s *Server) check(ctx context.Context, m *fencev1.CheckRequest) (*fencev1.CheckResponse, error) {
	if err := s.checkLockName(m.GetLock()); err != nil {
		return nil, err
	}
	if err := s.read(ctx, m.GetStale()); err != nil {
		return nil, err
	}
	out := &fencev1.CheckResponse{}
	s.fsm.Read(func(st *fsm.State) {
		info, _ := st.Lock(m.GetLock())
		for _, h := range info.Holders {
			out.Held = true
			out.CurrentToken = max(out.CurrentToken, h.Token)
			if h.Token == m.GetToken() {
				out.Current = true
			}
		}
	})
	return out, nil
}

// maxLocksPage bounds one ListLocks answer.
const maxLocksPage = 10_000

// ListLocks implements fencev1connect.LockServiceHandler, a page at a time.
func (s handlers) ListLocks(ctx context.Context, req *connect.Request[fencev1.ListLocksRequest]) (*connect.Response[fencev1.ListLocksResponse], error) {
	m := req.Msg
	if err := checkText("prefix", m.GetPrefix(), s.cfg.MaxNameBytes, false); err != nil {
		return nil, err
	}
	after, err := base64.RawURLEncoding.DecodeString(m.GetPageToken())
	if err != nil {
		return nil, invalid("page_token %q is not one this service gave", m.GetPageToken())
	}
	size := int(m.GetPageSize())
	if size == 0 || size > maxLocksPage {
		size = maxLocksPage
	}
	if err := s.read(ctx, m.GetStale()); err != nil {
		return nil, err
	}
	out := &fencev1.ListLocksResponse{}
	s.fsm.Read(func(st *fsm.State) {
		session := func(id uint64) fsm.SessionInfo {
			info, _ := st.Session(id)
			return info
		}
		page, more := st.LocksPage(m.GetPrefix(), string(after), size)
		if more {
			out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(page[len(page)-1].Name))
		}
		for _, l := range page {
			li := &fencev1.LockInfo{Name: l.Name, Delayed: l.Delay > 0, Permits: l.Permits}
			for _, h := range l.Holders {
				sess := session(h.Session)
				li.Holders = append(li.Holders, &fencev1.Holder{SessionId: h.Session, Token: h.Token, Mode: apiMode(h.Mode), Owner: sess.Owner, LegacySession: sess.Legacy})
			}
			for _, w := range l.Waiters {
				sess := session(w.Session)
				li.Waiters = append(li.Waiters, &fencev1.Waiter{SessionId: w.Session, Mode: apiMode(w.Mode), Owner: sess.Owner, LegacySession: sess.Legacy})
			}
			out.Locks = append(out.Locks, li)
		}
	})
	return connect.NewResponse(out), nil
}

// Status implements fencev1connect.ClusterServiceHandler. It answers from
// this node's view and needs no leader.
func (s handlers) Status(ctx context.Context, req *connect.Request[fencev1.StatusRequest]) (*connect.Response[fencev1.StatusResponse], error) {
	r := s.node.raft
	stats := r.Stats()
	leaderAddr, leaderID := r.LeaderWithID()
	out := &fencev1.StatusResponse{
		NodeId:            s.cfg.NodeID,
		State:             r.State().String(),
		LeaderId:          string(leaderID),
		LeaderRaftAddress: string(leaderAddr),
		Term:              parseUint(stats["term"]),
		LastIndex:         r.LastIndex(),
		CommitIndex:       parseUint(stats["commit_index"]),
		AppliedIndex:      r.AppliedIndex(),
		Version:           s.cfg.Version,
		Problems:          s.problems(),
		ClusterId:         s.clusterID(),
		Protocol:          s.fsm.Protocol(),
		NodeProtocol:      fsm.Protocol,
	}
	s.fsm.Read(func(st *fsm.State) {
		out.LastToken = st.LastToken()
		out.Sessions = uint64(st.NumSessions())
		out.Locks = uint64(st.NumLocks())
	})
	apis := map[string]string{}
	s.fsm.Read(func(st *fsm.State) {
		for _, n := range st.Nodes() {
			apis[n[0]] = n[1]
		}
	})
	out.LeaderAddress = apis[out.LeaderId] // the API's, as the leader registered it
	for _, srv := range s.members() {
		out.Members = append(out.Members, &fencev1.Member{Id: string(srv.ID), RaftAddress: string(srv.Address), Voter: srv.Suffrage == raft.Voter, ApiAddress: apis[string(srv.ID)]})
	}
	return connect.NewResponse(out), nil
}

func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}

// apply proposes a command and returns its result, with the command's own
// failure (Result.Err) as the error.
func (s *Server) apply(cmd *fsmpb.Command) (fsm.Result, error) {
	res, _, err := s.applyAt(cmd)
	return res, err
}

// applyAt is apply that also returns the command's log index. Only a ready
// leader proposes: one that has applied every entry of earlier terms, so
// that nothing it replays can be mistaken for an effect of a new command.
func (s *Server) applyAt(cmd *fsmpb.Command) (fsm.Result, uint64, error) {
	select {
	case <-s.done:
		return fsm.Result{}, 0, fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
	default:
	}
	if !s.leaderReady.Load() {
		return fsm.Result{}, 0, s.notReady()
	}
	res, index, err := s.node.propose(cmd)
	if err != nil {
		return fsm.Result{}, 0, err
	}
	if n := len(res.Effects.Grants); n > 0 && res.Effects.Grants[n-1].Token > s.reserve.Floor() {
		// Only when the node shut down before its token reserve was written.
		return fsm.Result{}, 0, fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
	}
	return res, index, res.Err
}

func (s *Server) notReady() error {
	if s.node.isLeader() {
		return fmt.Errorf("%w: the leader is still applying its log; retry shortly", fence.ErrUnavailable)
	}
	return s.node.raftError(raft.ErrNotLeader)
}

// read prepares a read of the FSM: linearizable unless stale is set.
//
// A write is acknowledged only after the leader applied it, and a new
// leader applies every entry of earlier terms (the barrier in becomeLeader)
// before it is ready; so once this node is a ready leader and confirms it
// still led after the read arrived (leaseConfirmer), its FSM reflects every
// write acknowledged before the read arrived.
func (s *Server) read(ctx context.Context, stale bool) error {
	if stale {
		return nil
	}
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	return s.confirmer.wait(ctx)
}
