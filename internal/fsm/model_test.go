// Model-based checking of the state machine on command streams. A
// modelChecker follows a State through any stream, keeping its own model of
// each lock's holders and FIFO queue (built only from the Results it sees)
// and each name's kind, and after every step checks docs/design.md invariants:
//
//  1. every token in Result.Effects.Grants is above every token issued before, none
//     is issued twice, and LastToken moves only by reported grants;
//  2. an exclusive lock has at most one holder, and a semaphore no more
//     holders than permits (CheckInvariants and a scan of Locks(""));
//  4. every grant to a waiter goes to the head of the queue as ordered by the
//     Queued answers, and a new request is never granted past a waiter;
//  5. a session that a CloseSession/ExpireSessions ended holds and waits for
//     nothing, is never granted (not even by the command that ends it), and
//     every later command for it fails with ErrSessionNotFound (a KV put
//     bound to it included); the command deletes every KV key bound to it,
//     with the exact events and revision that kvModel.endSession predicts,
//     and no live key is ever bound to a session that is not live.
//
// It also checks invariant 6 on the fenced KV store (see kvModel in
// model_kv_test.go), and the exact answers to acquire requests, their
// cancels (CancelAcquire, CancelWait by request) and idempotency keys (see
// requestModel in model_request_test.go).
//
// A name in use (held, waited for or delayed) is either a lock, whose
// holders and waiters are exclusive or shared, or a semaphore of N permits,
// whose holders and waiters are all in semaphore mode. The model sets a
// name's kind (its permits, 0 for a lock) at the first acquire that
// succeeds while the name is idle, drops it when the name becomes idle, and
// checks LockInfo.Permits against it. From it and the holders and queue,
// acquireVerdict says exactly how each Acquire must end: which failures
// are allowed (an unknown mode, permits that do not fit the mode, another
// kind or number of permits than the name's, a holder or waiter asking in
// another mode, a try that cannot be granted at once, a full queue) and
// when a request must be granted at once (no delay, nobody waiting, every
// holder compatible and, on a semaphore, a permit free) or queued.
//
// It also checks that a failed command changes nothing, that a queued
// request could not have been granted, that no waiter is left at a head it
// could be granted from (so that a command hands free permits to as many
// head waiters as they allow), that lock-delays appear only when sessions
// end otherwise than by their own close, and that a command that ends
// sessions says how (Result.Effects.EndedBy).
// runStream adds invariant 7 (determinism): the same stream applied to a
// second fresh State and to a third State rebuilt from Snapshot/Restore at
// intervals must give identical Results and identical snapshot bytes.
// TestRandomCommandStreams runs it on seeded random streams and
// FuzzStateMachine on fuzzer-made ones.
package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// modelChecker is the model that observe checks a State against.
type modelChecker struct {
	clusterID   string
	maxToken    uint64
	issued      map[uint64]bool
	holders     map[string][]fsm.HolderInfo
	queues      map[string][]fsm.WaiterInfo
	live        map[uint64]bool
	ended       map[uint64]bool
	lastSession uint64
	// before is the state's locks as of the end of the previous step.
	before map[string]fsm.LockInfo
	kv     *kvModel
	auth   *authModel
	// kinds holds, for each name in use, its number of permits: 0 for a
	// lock, N for a semaphore of N permits. A name not in it is idle.
	kinds map[string]uint32
	// nodes is the node registry: node id -> API address.
	nodes map[string]string
	// req follows acquire requests, their attempts, cancelled request
	// ids and idempotency keys (see model_request_test.go).
	req *requestModel
	// users are the live sessions' creating users (quotas).
	users map[uint64]string
	// protocol is the highest SetProtocol applied (0: none).
	protocol uint32
}

func newModelChecker() *modelChecker {
	m := &modelChecker{
		issued:  map[uint64]bool{},
		holders: map[string][]fsm.HolderInfo{},
		queues:  map[string][]fsm.WaiterInfo{},
		kinds:   map[string]uint32{},
		nodes:   map[string]string{},
		live:    map[uint64]bool{},
		ended:   map[uint64]bool{},
		before:  map[string]fsm.LockInfo{},
		kv:      newKVModel(),
		req:     newRequestModel(),
		auth:    newAuthModel(),
		users:   map[uint64]string{},
	}
	m.kv.quota, m.kv.note = m.kvQuota, m.req.note
	return m
}

// observe checks the step that applied cmd to s and answered res; before is
// the state's snapshot encoding from just before the step.
func (m *modelChecker) observe(tb testing.TB, cmd *fsmpb.Command, res fsm.Result, s *fsm.State, before []byte) error {
	if err := s.CheckInvariants(); err != nil {
		return fmt.Errorf("CheckInvariants: %w", err)
	}
	if b, ok := cmd.GetOp().(*fsmpb.Command_Batch); ok {
		return m.observeBatch(tb, cmd, b.Batch.GetCommands(), res, s, before)
	}
	if answered, err := m.req.checkKeyed(tb, cmd, res, s, before); answered {
		if err != nil {
			return err
		}
		// The command was not applied: the state is as before it.
		return m.compare(s, nil, fsm.Result{})
	}
	if r, ok := res.Repeat(); ok {
		return fmt.Errorf("%v answered Repeat %+v, but its key was not applied before", cmd, r)
	}
	if err := m.check(tb, cmd, res, s, before); err != nil {
		return err
	}
	m.req.keyApplied(cmd, res)
	return m.compare(s, cmd, res)
}

// observeBatch checks a Batch against its commands applied one at a time:
// a copy of the state before the batch applies them in order, the model
// observes each, and each must answer what the batch answered for it, and
// leave the state the batch left. A batch with an idempotency key or too
// many commands must be refused whole, changing nothing; a batch inside
// one fails alone.
func (m *modelChecker) observeBatch(tb testing.TB, cmd *fsmpb.Command, cmds []*fsmpb.Command, res fsm.Result, s *fsm.State, before []byte) error {
	refused := cmd.GetIdempotencyKey() != "" || len(cmds) > fsm.MaxBatchCommands
	rest := res
	rest.Err = nil
	if _, ok := rest.Answer.(fsm.BatchAnswer); ok {
		rest.Answer = nil
	}
	switch {
	case !sameAnswer(rest, fsm.Result{}):
		return fmt.Errorf("batch answered %s for itself", describe(res))
	case refused && !errors.Is(res.Err, fence.ErrInvalidArgument):
		return fmt.Errorf("batch with key %q and %d commands answered %s, want ErrInvalidArgument", cmd.GetIdempotencyKey(), len(cmds), describe(res))
	case refused && res.Answer != nil:
		return fmt.Errorf("refused batch answered its commands: %s", describe(res))
	case refused && !bytes.Equal(snapshotBytes(tb, s), before):
		return fmt.Errorf("refused batch changed the state")
	case refused:
		m.req.note("batch: refused whole")
		return nil
	case res.Err != nil:
		return fmt.Errorf("batch failed whole: %v", res.Err)
	case len(res.Batch()) != len(cmds):
		return fmt.Errorf("batch of %d commands answered %d results", len(cmds), len(res.Batch()))
	}
	var snap fsmpb.Snapshot
	if err := proto.Unmarshal(before, &snap); err != nil {
		return err
	}
	one, err := fsm.Restore(&snap)
	if err != nil {
		return err
	}
	for i, sub := range cmds {
		if _, nested := sub.GetOp().(*fsmpb.Command_Batch); nested {
			if !sameResult(res.Batch()[i], fsm.Result{Err: fence.ErrInvalidArgument}) {
				return fmt.Errorf("batch inside a batch answered %s, want ErrInvalidArgument alone", describe(res.Batch()[i]))
			}
			m.req.note("batch: a batch inside refused")
			continue
		}
		at := snapshotBytes(tb, one)
		got := one.Apply(sub)
		if !sameAnswer(got, res.Batch()[i]) {
			return fmt.Errorf("command %d of a batch (%v) answered %s, alone %s", i, sub, describe(res.Batch()[i]), describe(got))
		}
		if err := m.observe(tb, sub, got, one, at); err != nil {
			return fmt.Errorf("command %d of a batch: %w", i, err)
		}
	}
	if !bytes.Equal(snapshotBytes(tb, one), snapshotBytes(tb, s)) {
		return fmt.Errorf("a batch left another state than its commands applied one at a time")
	}
	if len(cmds) > 1 {
		m.req.note("batch: applied")
	}
	return nil
}

// check checks a command that was applied (not answered by its
// idempotency key alone) and updates the model.
func (m *modelChecker) check(tb testing.TB, cmd *fsmpb.Command, res fsm.Result, s *fsm.State, before []byte) error {
	if a, ok := cmd.GetOp().(*fsmpb.Command_Auth); ok {
		if res.Err != nil {
			if err := m.checkUnchanged(tb, cmd, res.Err, s, before); err != nil {
				return err
			}
		}
		return m.auth.observe(cmd, a.Auth, res, s)
	}
	if res.Err != nil {
		if err := m.checkUnchanged(tb, cmd, res.Err, s, before); err != nil {
			return err
		}
		rest := res
		rest.Err = nil
		if !sameAnswer(rest, fsm.Result{}) {
			return fmt.Errorf("failed command (%v) reported effects: %s", res.Err, describe(res))
		}
		return m.checkFailure(cmd, res.Err)
	}
	if err := m.checkTokens(cmd, res, s); err != nil {
		return err
	}
	if isKVWrite(cmd) {
		if !answerFits(cmd, res.Answer) {
			return fmt.Errorf("%v answered %s", cmd, describe(res))
		}
		if err := m.kv.observe(cmd, res, m.holders, m.maxToken, m.live); err != nil {
			return err
		}
		return eventsOwnValues(tb, s, res)
	}
	immediate, err := m.checkSuccess(cmd, res)
	if err != nil {
		return err
	}
	if !immediate {
		return m.handOut(res.Effects.Grants)
	}
	return nil
}

// checkUnchanged checks that a failed command left the state as it was.
func (m *modelChecker) checkUnchanged(tb testing.TB, cmd *fsmpb.Command, err error, s *fsm.State, before []byte) error {
	if bytes.Equal(before, snapshotBytes(tb, s)) {
		return nil
	}
	return fmt.Errorf("failed command %v (%v) changed the state", cmd, err)
}

// targetSession returns the session a per-session command acts for.
func targetSession(cmd *fsmpb.Command) (uint64, bool) {
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_Acquire:
		return op.Acquire.GetSessionId(), true
	case *fsmpb.Command_Release:
		return op.Release.GetSessionId(), true
	case *fsmpb.Command_CancelWait:
		return op.CancelWait.GetSessionId(), true
	case *fsmpb.Command_CancelAcquire:
		return op.CancelAcquire.GetSessionId(), true
	}
	return 0, false
}

func validMode(m uint32) bool {
	switch fsm.Mode(m) {
	case fsm.Exclusive, fsm.Shared, fsm.Semaphore:
		return true
	}
	return false
}

// fitsKind reports whether a holder or waiter in mode belongs on a name of
// the given permits: semaphore mode on a semaphore, exclusive or shared on
// a lock.
func fitsKind(mode fsm.Mode, permits uint32) bool {
	if permits > 0 {
		return mode == fsm.Semaphore
	}
	return mode == fsm.Exclusive || mode == fsm.Shared
}

// checkFailure checks that a failed command had a reason to fail, and the
// right sentinel for it.
func (m *modelChecker) checkFailure(cmd *fsmpb.Command, err error) error {
	if sid, ok := targetSession(cmd); ok {
		if !m.live[sid] {
			if !errors.Is(err, fence.ErrSessionNotFound) {
				return fmt.Errorf("command for session %d that is not live failed with %v, want ErrSessionNotFound", sid, err)
			}
			return nil
		}
		if errors.Is(err, fence.ErrSessionNotFound) {
			return fmt.Errorf("command for live session %d failed with %v", sid, err)
		}
	}
	if isKVWrite(cmd) {
		return m.kv.observe(cmd, fsm.Result{Err: err}, m.holders, m.maxToken, m.live)
	}
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_CreateSession:
		max := op.CreateSession.GetMaxSessions()
		if n := len(op.CreateSession.GetSecretSha256()); n != 0 && n != fsm.SecretHashBytes && (max == 0 || uint64(len(m.live)) < max) {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				return fmt.Errorf("create session with a secret hash of %d bytes failed with %v, want ErrInvalidArgument", n, err)
			}
			return nil
		}
		overQuota := m.sessionQuotaReached(op.CreateSession.GetUser())
		if !errors.Is(err, fence.ErrLimit) || (!overQuota && (max == 0 || uint64(len(m.live)) < max)) {
			return fmt.Errorf("create session with %d of max %d sessions (user %q, over quota %v) failed with %v", len(m.live), max, op.CreateSession.GetUser(), overQuota, err)
		}
		if overQuota {
			m.req.note("quota: sessions quota refused a session")
		}
	case *fsmpb.Command_Acquire:
		return m.checkAcquireFailure(op.Acquire, err)
	case *fsmpb.Command_SetClusterId:
		if !errors.Is(err, fence.ErrInvalidArgument) || op.SetClusterId.GetId() != "" {
			return fmt.Errorf("%v failed with %v; only an empty id may, with ErrInvalidArgument", cmd, err)
		}
	case *fsmpb.Command_CancelAcquire:
		if !errors.Is(err, fence.ErrInvalidArgument) || op.CancelAcquire.GetRequestId() != 0 {
			return fmt.Errorf("%v failed with %v; only one without a request id may, with ErrInvalidArgument", cmd, err)
		}
		m.req.note("request: cancel without a request id refused")
	case *fsmpb.Command_Release:
		r := op.Release
		if !errors.Is(err, fence.ErrNotHolder) {
			return fmt.Errorf("release failed with %v, want ErrNotHolder", err)
		}
		if m.holderIndex(r.GetLock(), r.GetSessionId(), r.GetToken()) >= 0 {
			return fmt.Errorf("release by holder %d of %q with its token %d failed: %v", r.GetSessionId(), r.GetLock(), r.GetToken(), err)
		}
	case nil:
		if !errors.Is(err, fence.ErrInvalidArgument) {
			return fmt.Errorf("empty command failed with %v, want ErrInvalidArgument", err)
		}
	case *fsmpb.Command_RegisterNode:
		if !errors.Is(err, fence.ErrInvalidArgument) || op.RegisterNode.GetNodeId() != "" {
			return fmt.Errorf("%v failed with %v; only an empty node id may, with ErrInvalidArgument", cmd, err)
		}
	case *fsmpb.Command_CloseSession:
		if !errors.Is(err, fence.ErrInvalidArgument) || endOf(cmd) != 0 {
			return fmt.Errorf("%v failed with %v; only one with an unknown end may, with ErrInvalidArgument", cmd, err)
		}
	case *fsmpb.Command_SetProtocol:
		if !errors.Is(err, fence.ErrInvalidArgument) || op.SetProtocol.GetVersion() <= fsm.Protocol {
			return fmt.Errorf("%v failed with %v; only a move past protocol %d may, with ErrInvalidArgument", cmd, err, fsm.Protocol)
		}
	default:
		return fmt.Errorf("%T cannot fail, but failed with %v", op, err)
	}
	return nil
}

func (m *modelChecker) checkAcquireFailure(a *fsmpb.Acquire, err error) error {
	want, why := m.acquireVerdict(a)
	if want == nil {
		return fmt.Errorf("acquire(%s) failed with %v, but the model says it succeeds: %s", describeAcquire(a), err, why)
	}
	if !errors.Is(err, want) {
		return fmt.Errorf("acquire(%s) failed with %v, want %v: %s", describeAcquire(a), err, want, why)
	}
	if errors.Is(err, fence.ErrCancelled) {
		m.req.note("request: acquire of a cancelled request refused")
	}
	return nil
}

// acquireVerdict is the model's answer to an Acquire: want is the sentinel
// it must fail with, or nil when it must succeed (granted, granted again,
// or queued); why says which rule applies.
func (m *modelChecker) acquireVerdict(a *fsmpb.Acquire) (want error, why string) {
	sid, name, mode, n := a.GetSessionId(), a.GetLock(), fsm.Mode(a.GetMode()), a.GetPermits()
	switch {
	case !m.live[sid]:
		return fence.ErrSessionNotFound, "the session is not live"
	case !validMode(a.GetMode()):
		return fence.ErrInvalidArgument, "unknown mode"
	case (mode == fsm.Semaphore) != (n > 0):
		return fence.ErrInvalidArgument, fmt.Sprintf("%d permits do not fit %s mode", n, mode)
	case m.req.wasCancelled(sid, a.GetRequestId()):
		return fence.ErrCancelled, fmt.Sprintf("request %d was cancelled", a.GetRequestId())
	}
	if k, inUse := m.kinds[name]; inUse && k != n {
		return fence.ErrInvalidArgument, fmt.Sprintf("%q is in use with %d permits (0: a lock)", name, k)
	}
	held, waits := m.holdsIn(name, sid), m.waitsIn(name, sid)
	switch {
	case held != 0 && held != mode:
		return fence.ErrInvalidArgument, fmt.Sprintf("the session holds it in %s", held)
	case held != 0:
		return nil, "the session holds it: granted again"
	case waits != 0 && waits != mode:
		return fence.ErrInvalidArgument, fmt.Sprintf("the session waits for it in %s", waits)
	case waits != 0:
		return nil, "the session waits for it: still queued"
	case m.grantableNow(name, mode, n) && m.lockQuotaReached(sid):
		return fence.ErrLimit, fmt.Sprintf("grantable, but user %q of session %d is at the locks quota", m.users[sid], sid)
	case m.grantableNow(name, mode, n):
		return nil, "grantable now"
	case a.GetTry():
		return fence.ErrLocked, fmt.Sprintf("a try that cannot be granted now: %s", m.describeName(name))
	case a.GetMaxWaiters() > 0 && uint64(len(m.queues[name])) >= a.GetMaxWaiters():
		return fence.ErrLimit, fmt.Sprintf("%d waiters of max %d", len(m.queues[name]), a.GetMaxWaiters())
	case m.lockQuotaReached(sid):
		return fence.ErrLimit, fmt.Sprintf("user %q of session %d is at the locks quota", m.users[sid], sid)
	case m.waitQuotaReached(sid):
		return fence.ErrLimit, fmt.Sprintf("user %q of session %d would wait beyond the waits quota", m.users[sid], sid)
	}
	return nil, "queued"
}

func describeAcquire(a *fsmpb.Acquire) string {
	return fmt.Sprintf("%d, %q, %s, permits=%d, try=%v, request=%d", a.GetSessionId(), a.GetLock(), fsm.Mode(a.GetMode()), a.GetPermits(), a.GetTry(), a.GetRequestId())
}

// describeName describes the model of one name for a failure message.
func (m *modelChecker) describeName(name string) string {
	k, inUse := m.kinds[name]
	return fmt.Sprintf("name %q in use %v with %d permits, holders %+v, waiters %+v, delay %v", name, inUse, k, m.holders[name], m.queues[name], m.before[name].Delay)
}

// checkTokens checks invariant 1 on the grants of one successful command;
// a raised floor counts as the highest token.
func (m *modelChecker) checkTokens(cmd *fsmpb.Command, res fsm.Result, s *fsm.State) error {
	if r, ok := cmd.GetOp().(*fsmpb.Command_RaiseTokens); ok {
		m.maxToken = max(m.maxToken, r.RaiseTokens.GetFloor())
	}
	for _, g := range res.Effects.Grants {
		if m.issued[g.Token] {
			return fmt.Errorf("invariant 1: token %d issued twice (%+v)", g.Token, g)
		}
		if g.Token <= m.maxToken {
			return fmt.Errorf("invariant 1: token %d granted after token %d (%+v)", g.Token, m.maxToken, g)
		}
		m.issued[g.Token] = true
		m.maxToken = g.Token
	}
	if s.LastToken() != m.maxToken {
		return fmt.Errorf("LastToken() = %d but the highest token reported is %d", s.LastToken(), m.maxToken)
	}
	return nil
}

// answerFits reports whether a is of the type of cmd's own answer, or
// none: no command answers another's answer.
func answerFits(cmd *fsmpb.Command, a fsm.Answer) bool {
	switch a.(type) {
	case nil:
		return true
	case fsm.CreateSessionAnswer:
		return cmd.GetCreateSession() != nil
	case fsm.AcquireAnswer:
		return cmd.GetAcquire() != nil
	case fsm.CancelWaitAnswer:
		return cmd.GetCancelWait() != nil
	case fsm.CancelAcquireAnswer:
		return cmd.GetCancelAcquire() != nil
	case fsm.KVAnswer:
		return cmd.GetKvPut() != nil || cmd.GetKvDelete() != nil
	case fsm.TxnAnswer:
		return cmd.GetKvTxn() != nil
	case fsm.CreateTokenAnswer:
		return cmd.GetAuth().GetCreateToken() != nil
	}
	return false
}

// checkSuccess checks a successful command's own answer and updates the
// model for everything but hand-offs to waiters. immediate reports an
// Acquire granted at once, whose grant is already accounted for.
func (m *modelChecker) checkSuccess(cmd *fsmpb.Command, res fsm.Result) (immediate bool, err error) {
	_, isCancel := cmd.GetOp().(*fsmpb.Command_CancelWait)
	_, isCancelAcquire := cmd.GetOp().(*fsmpb.Command_CancelAcquire)
	_, isCreate := cmd.GetOp().(*fsmpb.Command_CreateSession)
	_, isClose := cmd.GetOp().(*fsmpb.Command_CloseSession)
	_, isExpire := cmd.GetOp().(*fsmpb.Command_ExpireSessions)
	switch {
	case !answerFits(cmd, res.Answer):
		return false, fmt.Errorf("%v answered %s", cmd, describeAnswer(res.Answer))
	case (res.Effects.Created != 0) != isCreate:
		return false, fmt.Errorf("%v created session %d", cmd, res.Effects.Created)
	case res.Effects.Dropped != nil && !isCancelAcquire && !isCancel:
		return false, fmt.Errorf("%v dropped a wait", cmd)
	case len(res.Effects.Ended) > 0 && !isClose && !isExpire:
		return false, fmt.Errorf("%v ended sessions", cmd)
	case len(res.Effects.Delayed) > 0 && !isExpire && (!isClose || endOf(cmd) == fsm.Closed):
		return false, fmt.Errorf("%v put locks under delay; only an end other than the holder's close may", cmd)
	case len(res.Effects.Ended) > 0 && res.Effects.EndedBy != endOf(cmd), len(res.Effects.Ended) == 0 && res.Effects.EndedBy != 0:
		return false, fmt.Errorf("%v ended %v by %v", cmd, res.Effects.Ended, res.Effects.EndedBy)
	case len(res.Effects.Events) > 0 && !isClose && !isExpire:
		return false, fmt.Errorf("%v made KV events", cmd)
	}
	if sid, ok := targetSession(cmd); ok && !m.live[sid] {
		return false, fmt.Errorf("invariant 5: %v succeeded for session %d, which is not live", cmd, sid)
	}
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_CreateSession:
		id := res.CreateSession().SessionID
		if id != res.Effects.Created {
			return false, fmt.Errorf("CreateSession answered session %d and created %d", id, res.Effects.Created)
		}
		if id <= m.lastSession {
			return false, fmt.Errorf("session id %d created after %d", id, m.lastSession)
		}
		if max := op.CreateSession.GetMaxSessions(); max > 0 && uint64(len(m.live)) >= max {
			return false, fmt.Errorf("session %d created with %d of max %d sessions", id, len(m.live), max)
		}
		if m.sessionQuotaReached(op.CreateSession.GetUser()) {
			return false, fmt.Errorf("session %d created for user %q beyond the sessions quota", id, op.CreateSession.GetUser())
		}
		m.lastSession, m.live[id] = id, true
		m.users[id] = op.CreateSession.GetUser()
	case *fsmpb.Command_Acquire:
		return m.acquired(op.Acquire, res)
	case *fsmpb.Command_Release:
		r := op.Release
		i := m.holderIndex(r.GetLock(), r.GetSessionId(), r.GetToken())
		if i < 0 {
			return false, fmt.Errorf("release(%d, %q, %d) succeeded for a non-holder", r.GetSessionId(), r.GetLock(), r.GetToken())
		}
		m.holders[r.GetLock()] = slices.Delete(m.holders[r.GetLock()], i, i+1)
		m.req.drop(r.GetLock(), r.GetSessionId())
	case *fsmpb.Command_CancelWait:
		return false, m.cancelled(op.CancelWait, res)
	case *fsmpb.Command_CancelAcquire:
		return false, m.cancelledAcquire(op.CancelAcquire, res)
	case *fsmpb.Command_CloseSession:
		return false, m.endSessions([]uint64{op.CloseSession.GetSessionId()}, res)
	case *fsmpb.Command_ExpireSessions:
		return false, m.endSessions(op.ExpireSessions.GetSessionIds(), res)
	case *fsmpb.Command_LiftDelay:
		if len(res.Effects.Grants) > 0 && m.before[op.LiftDelay.GetLock()].Delay == 0 {
			return false, fmt.Errorf("LiftDelay(%q) of a lock not delayed granted %+v", op.LiftDelay.GetLock(), res.Effects.Grants)
		}
	case *fsmpb.Command_RaiseTokens:
		if len(res.Effects.Grants) > 0 {
			return false, fmt.Errorf("%v granted %+v", cmd, res.Effects.Grants)
		}
	case *fsmpb.Command_SetClusterId:
		if len(res.Effects.Grants) > 0 {
			return false, fmt.Errorf("%v granted %+v", cmd, res.Effects.Grants)
		}
		if m.clusterID == "" {
			m.clusterID = op.SetClusterId.GetId() // the first name stays
		}
	case *fsmpb.Command_RegisterNode:
		r := op.RegisterNode
		switch {
		case r.GetNodeId() == "":
			return false, fmt.Errorf("%v succeeded with an empty node id", cmd)
		case len(res.Effects.Grants) > 0:
			return false, fmt.Errorf("%v granted %+v", cmd, res.Effects.Grants)
		case r.GetApiAddress() == "":
			delete(m.nodes, r.GetNodeId())
		default:
			m.nodes[r.GetNodeId()] = r.GetApiAddress()
		}
	case *fsmpb.Command_SetProtocol:
		// A protocol never goes back: an older one changes nothing.
		if v := op.SetProtocol.GetVersion(); v > fsm.Protocol || len(res.Effects.Grants) > 0 {
			return false, fmt.Errorf("%v succeeded with %+v", cmd, res)
		}
		m.protocol = max(m.protocol, op.SetProtocol.GetVersion())
	default:
		return false, fmt.Errorf("unknown command %v succeeded", cmd)
	}
	return false, nil
}

func (m *modelChecker) acquired(a *fsmpb.Acquire, res fsm.Result) (immediate bool, err error) {
	sid, name, mode := a.GetSessionId(), a.GetLock(), fsm.Mode(a.GetMode())
	if want, why := m.acquireVerdict(a); want != nil {
		return false, fmt.Errorf("acquire(%s) answered %s, but the model says it fails with %v: %s", describeAcquire(a), describe(res), want, why)
	}
	held, waits := m.holdsIn(name, sid), m.waitsIn(name, sid)
	ans := res.Acquire()
	switch {
	case ans.Queued && ans.Grant == nil && len(res.Effects.Grants) == 0:
		if waits == mode {
			return false, m.req.retried(a, res, "wait") // idempotent: already waiting
		}
		if held != 0 || waits != 0 {
			return false, fmt.Errorf("acquire(%d, %q, %s) queued a session that holds in %s or waits in %s", sid, name, mode, held, waits)
		}
		if a.GetTry() {
			return false, fmt.Errorf("try acquire(%d, %q) was queued", sid, name)
		}
		if m.grantableNow(name, mode, a.GetPermits()) {
			return false, fmt.Errorf("acquire(%s) was queued though the lock was free for it: %s", describeAcquire(a), m.describeName(name))
		}
		m.use(name, a.GetPermits())
		m.queues[name] = append(m.queues[name], fsm.WaiterInfo{Session: sid, Mode: mode})
		return false, m.req.tagged(a, res, "queued")
	case ans.Grant != nil && !ans.Queued && len(res.Effects.Grants) == 0:
		if m.holdsIn(name, sid) != mode || m.tokenOf(name, sid) != ans.Grant.Token || *ans.Grant != grant(sid, name, ans.Grant.Token, mode) {
			return false, fmt.Errorf("re-acquire answered %+v, which the session does not hold", *ans.Grant)
		}
		return true, m.req.retried(a, res, "grant")
	case ans.Grant != nil && !ans.Queued && len(res.Effects.Grants) == 1:
		g := res.Effects.Grants[0]
		if *ans.Grant != g || g != grant(sid, name, g.Token, mode) {
			return false, fmt.Errorf("acquire(%d, %q, %s) answered %+v and made %+v", sid, name, mode, *ans.Grant, g)
		}
		if held != 0 || waits != 0 {
			return false, fmt.Errorf("acquire(%d, %q) made a second grant to a session that holds in %s or waits in %s", sid, name, held, waits)
		}
		if !m.grantableNow(name, mode, a.GetPermits()) {
			return false, fmt.Errorf("invariant 4: acquire(%s) was granted past waiters, a delay, incompatible holders or a full semaphore: %s", describeAcquire(a), m.describeName(name))
		}
		m.use(name, a.GetPermits())
		m.holders[name] = append(m.holders[name], fsm.HolderInfo{Session: sid, Token: g.Token, Mode: mode})
		return true, m.req.tagged(a, res, "granted")
	}
	return false, fmt.Errorf("acquire answered %s", describe(res))
}

// use records the kind of a name that a new holder or waiter puts in use;
// acquireVerdict has already checked that it is the name's kind if the
// name was in use.
func (m *modelChecker) use(name string, permits uint32) {
	if _, inUse := m.kinds[name]; !inUse {
		m.kinds[name] = permits
	}
}

// cancelled checks a CancelWait. Without a request id it acts on the
// session's wait or grant whatever its request; with one, only on that
// request's (at that attempt, if one is named). On a grant it acts by
// answering the grant; on a wait by dropping it (Dequeued), the lock
// handed on (checked by handOut).
func (m *modelChecker) cancelled(c *fsmpb.CancelWait, res fsm.Result) error {
	sid, name, id := c.GetSessionId(), c.GetLock(), c.GetRequestId()
	acts := id == 0 || m.req.tag(name, sid).matches(id, c.GetAttempt())
	byRequest := "legacy cancel wait"
	if id != 0 {
		byRequest = "cancel wait by request"
	}
	if held := m.holdsIn(name, sid); held != 0 {
		want := fsm.Result{Answer: fsm.CancelWaitAnswer{}}
		if acts {
			want = grantedBefore(sid, name, m.tokenOf(name, sid), held)
			m.req.note("request: " + byRequest + " answered the grant")
		} else {
			m.req.note("request: cancel wait by another request left the grant")
		}
		if !sameAnswer(res, want) {
			return fmt.Errorf("cancel wait %v by holder %d of %q answered %s, want %s", c, sid, name, describe(res), describe(want))
		}
		return nil
	}
	i := m.queueIndex(name, sid)
	if i < 0 || !acts {
		if !sameAnswer(res, fsm.Result{}) {
			return fmt.Errorf("cancel wait %v that matches no wait or grant answered %s", c, describe(res))
		}
		if i >= 0 {
			m.req.note("request: cancel wait by another request left the wait")
		}
		return nil
	}
	if res.Answer != (fsm.CancelWaitAnswer{Dequeued: true}) || res.Effects.Dropped == nil || *res.Effects.Dropped != (fsm.WaitRef{Session: sid, Lock: name}) {
		return fmt.Errorf("cancel wait %v of a wait answered %s, dropped %v, want Dequeued", c, describe(res), res.Effects.Dropped)
	}
	m.queues[name] = slices.Delete(m.queues[name], i, i+1)
	m.req.drop(name, sid)
	m.req.note("request: " + byRequest + " dropped the wait")
	if len(res.Effects.Grants) > 0 {
		m.req.note("request: a wait dropped by cancel handed the lock on")
	}
	return nil
}

// cancelledAcquire checks a CancelAcquire that succeeded: with attempt 0
// the request id is given up for good (an acquire naming it fails from
// now on); the request's grant, if it matches, is released (Released), or
// else its wait dropped (Dequeued), the lock handed on (checked by
// handOut); a request that matches neither leaves everything else as it
// was.
func (m *modelChecker) cancelledAcquire(c *fsmpb.CancelAcquire, res fsm.Result) error {
	sid, name, id, attempt := c.GetSessionId(), c.GetLock(), c.GetRequestId(), c.GetAttempt()
	if id == 0 {
		return fmt.Errorf("%v without a request id succeeded", c)
	}
	if attempt == 0 {
		m.req.cancel(sid, id)
	}
	tag := m.req.tag(name, sid)
	byAttempt := ""
	if attempt != 0 {
		byAttempt = " by its attempt"
	}
	i, j := slices.IndexFunc(m.holders[name], func(h fsm.HolderInfo) bool { return h.Session == sid }), m.queueIndex(name, sid)
	switch {
	case tag.matches(id, attempt) && i >= 0:
		if res.Answer != (fsm.CancelAcquireAnswer{Released: true}) || res.Effects.Dropped != nil {
			return fmt.Errorf("%v of a grant answered %s, want Released", c, describe(res))
		}
		m.holders[name] = slices.Delete(m.holders[name], i, i+1)
		m.req.note("request: cancel released the grant" + byAttempt)
		if len(res.Effects.Grants) > 0 {
			m.req.note("request: a grant released by cancel handed the lock on")
		}
	case tag.matches(id, attempt) && j >= 0:
		if res.Answer != (fsm.CancelAcquireAnswer{Dequeued: true}) || res.Effects.Dropped == nil || *res.Effects.Dropped != (fsm.WaitRef{Session: sid, Lock: name}) {
			return fmt.Errorf("%v of a wait answered %s, dropped %v, want Dequeued", c, describe(res), res.Effects.Dropped)
		}
		m.queues[name] = slices.Delete(m.queues[name], j, j+1)
		m.req.note("request: cancel dropped the wait" + byAttempt)
		if len(res.Effects.Grants) > 0 {
			m.req.note("request: a wait dropped by cancel handed the lock on")
		}
	default:
		if !sameAnswer(res, fsm.Result{}) {
			return fmt.Errorf("%v that matches no wait or grant (the session's is %+v) answered %s", c, tag, describe(res))
		}
		switch {
		case tag.id == id:
			m.req.note("request: cancel of an attempt taken over left the request")
		case i >= 0 || j >= 0:
			m.req.note("request: cancel of another request left the session's")
		default:
			m.req.note("request: cancel that matches nothing")
		}
		return nil
	}
	m.req.drop(name, sid)
	return nil
}

// endSessions checks the Ended list against the live sessions named, and
// removes them from the model before any hand-off is checked, so that a
// grant to one of them counts as a violation. It checks the KV keys the
// command deleted with them: the events and revision that
// kvModel.endSession predicts for each session ended, in order.
func (m *modelChecker) endSessions(ids []uint64, res fsm.Result) error {
	var want []uint64
	for _, id := range ids {
		if m.live[id] && !slices.Contains(want, id) {
			want = append(want, id)
		}
	}
	if !slices.Equal(res.Effects.Ended, want) {
		return fmt.Errorf("ended %v, want the live sessions among %v: %v", res.Effects.Ended, ids, want)
	}
	var events []fsm.KVEvent
	for _, id := range want {
		events = append(events, m.kv.endSession(id)...)
	}
	if n := len(events); n > 0 && events[n-1].KV.ModRevision != m.kv.rev {
		return fmt.Errorf("the model deleted the keys of sessions %v up to revision %d, but its store is at %d", want, events[n-1].KV.ModRevision, m.kv.rev)
	}
	if !reflect.DeepEqual(cmpForm(fsm.Result{Effects: fsm.Effects{Events: res.Effects.Events}}), cmpForm(fsm.Result{Effects: fsm.Effects{Events: events}})) {
		return fmt.Errorf("ending sessions %v answered %s; the model deletes their keys: %s",
			want, describe(res), describe(fsm.Result{Effects: fsm.Effects{Events: events}}))
	}
	heldByEnded := map[string]bool{}
	for _, id := range want {
		for name, hs := range m.holders {
			if i := slices.IndexFunc(hs, func(h fsm.HolderInfo) bool { return h.Session == id }); i >= 0 {
				heldByEnded[name] = true
				m.holders[name] = slices.Delete(hs, i, i+1)
			}
		}
		for name := range m.queues {
			if i := m.queueIndex(name, id); i >= 0 {
				m.queues[name] = slices.Delete(m.queues[name], i, i+1)
			}
		}
		delete(m.live, id)
		m.ended[id] = true
		m.req.endSession(id)
	}
	for _, d := range res.Effects.Delayed {
		if !heldByEnded[d.Lock] || d.Delay <= 0 {
			return fmt.Errorf("lock %q put under delay %v, but no ended session held it", d.Lock, d.Delay)
		}
	}
	return nil
}

// endOf returns how a command that ends sessions ends them.
func endOf(cmd *fsmpb.Command) fsm.End {
	if cmd.GetExpireSessions() != nil {
		return fsm.Expired
	}
	switch cmd.GetCloseSession().GetEnd() {
	case fsmpb.SessionEnd_SESSION_END_CLOSED:
		return fsm.Closed
	case fsmpb.SessionEnd_SESSION_END_REVOKED:
		return fsm.Revoked
	case fsmpb.SessionEnd_SESSION_END_ABANDONED:
		return fsm.Abandoned
	}
	return 0
}

// handOut checks invariants 4 and 5 on grants made to waiters.
func (m *modelChecker) handOut(grants []fsm.Grant) error {
	for _, g := range grants {
		if !m.live[g.Session] {
			return fmt.Errorf("invariant 5: %+v granted to session %d, which is not live (ended: %v)", g, g.Session, m.ended[g.Session])
		}
		q := m.queues[g.Lock]
		if len(q) == 0 || q[0] != (fsm.WaiterInfo{Session: g.Session, Mode: g.Mode}) {
			return fmt.Errorf("invariant 4: %+v granted, but the queue for %q is %+v", g, g.Lock, q)
		}
		m.queues[g.Lock] = q[1:]
		m.holders[g.Lock] = append(m.holders[g.Lock], fsm.HolderInfo{Session: g.Session, Token: g.Token, Mode: g.Mode})
	}
	return nil
}

// compare checks the state against the model after a step, and the
// invariants that need only the state.
func (m *modelChecker) compare(s *fsm.State, cmd *fsmpb.Command, res fsm.Result) error {
	if s.ClusterID() != m.clusterID {
		return fmt.Errorf("cluster id %q, model %q (the first valid one named)", s.ClusterID(), m.clusterID)
	}
	if want := max(m.protocol, fsm.Protocol1); s.Protocol() != want {
		return fmt.Errorf("protocol %d, model %d (the highest moved to)", s.Protocol(), want)
	}
	now := map[string]fsm.LockInfo{}
	for _, l := range s.Locks("") {
		now[l.Name] = l
		if k, inUse := m.kinds[l.Name]; !inUse || k != l.Permits {
			return fmt.Errorf("lock %q has %d permits, model %d (in use: %v)", l.Name, l.Permits, k, inUse)
		}
		if err := checkLockShape(l); err != nil {
			return err
		}
		if !slices.Equal(l.Holders, m.holders[l.Name]) {
			return fmt.Errorf("lock %q holders %+v, model %+v", l.Name, l.Holders, m.holders[l.Name])
		}
		if !slices.Equal(l.Waiters, m.queues[l.Name]) {
			return fmt.Errorf("invariant 4: lock %q queue %+v, model (order of Queued answers) %+v", l.Name, l.Waiters, m.queues[l.Name])
		}
		for _, h := range l.Holders {
			if !m.live[h.Session] {
				return fmt.Errorf("invariant 5: lock %q held by session %d, which is not live", l.Name, h.Session)
			}
		}
		for _, w := range l.Waiters {
			if !m.live[w.Session] {
				return fmt.Errorf("invariant 5: lock %q awaited by session %d, which is not live", l.Name, w.Session)
			}
		}
	}
	for name := range m.holders {
		if len(m.holders[name]) == 0 {
			delete(m.holders, name)
		} else if _, ok := now[name]; !ok {
			return fmt.Errorf("lock %q is gone but the model has holders %+v", name, m.holders[name])
		}
	}
	for name := range m.queues {
		if len(m.queues[name]) == 0 {
			delete(m.queues, name)
		} else if _, ok := now[name]; !ok {
			return fmt.Errorf("lock %q is gone but the model has waiters %+v", name, m.queues[name])
		}
	}
	if err := m.checkDelays(now, cmd, res); err != nil {
		return err
	}
	// A name nobody holds, waits for or delays is forgotten, with its kind
	// (the state must not list it: see checkLockShape).
	for name := range m.kinds {
		if len(m.holders[name]) == 0 && len(m.queues[name]) == 0 && now[name].Delay == 0 {
			delete(m.kinds, name)
		}
	}
	var ids []uint64
	for _, si := range s.Sessions() {
		ids = append(ids, si.ID)
	}
	if want := m.liveIDs(); !slices.Equal(ids, want) {
		return fmt.Errorf("sessions %v, model %v", ids, want)
	}
	var nodes [][2]string
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		nodes = append(nodes, [2]string{id, m.nodes[id]})
	}
	if got := s.Nodes(); !slices.Equal(got, nodes) {
		return fmt.Errorf("nodes %v, model %v", got, nodes)
	}
	if err := m.kv.compare(s); err != nil {
		return err
	}
	if err := m.compareUsage(s); err != nil {
		return err
	}
	if err := m.req.compare(s.Snapshot()); err != nil {
		return err
	}
	list, _ := s.List("", 0)
	for _, kv := range list {
		if kv.Session != 0 && !m.live[kv.Session] {
			return fmt.Errorf("invariant 5: key %q is bound to session %d, which is not live", kv.Key, kv.Session)
		}
	}
	m.before = now
	return nil
}

// checkLockShape checks invariant 2 on one lock, that its holders and
// waiters are of its kind, and that no waiter is left at the head of a queue
// that it could be granted from.
func checkLockShape(l fsm.LockInfo) error {
	for _, h := range l.Holders {
		if !fitsKind(h.Mode, l.Permits) {
			return fmt.Errorf("lock %q of %d permits has holder %d in %s", l.Name, l.Permits, h.Session, h.Mode)
		}
		if h.Mode == fsm.Exclusive && len(l.Holders) > 1 {
			return fmt.Errorf("invariant 2: exclusive lock %q has %d holders: %+v", l.Name, len(l.Holders), l.Holders)
		}
	}
	if l.Permits > 0 && len(l.Holders) > int(l.Permits) {
		return fmt.Errorf("invariant 2: semaphore %q of %d permits has %d holders: %+v", l.Name, l.Permits, len(l.Holders), l.Holders)
	}
	for _, w := range l.Waiters {
		if !fitsKind(w.Mode, l.Permits) {
			return fmt.Errorf("lock %q of %d permits has waiter %d in %s", l.Name, l.Permits, w.Session, w.Mode)
		}
	}
	if l.Delay == 0 && len(l.Waiters) > 0 && joins(l.Waiters[0].Mode, l.Permits, l.Holders) {
		return fmt.Errorf("lock %q: head waiter %+v could be granted now but waits (holders %+v, %d permits)", l.Name, l.Waiters[0], l.Holders, l.Permits)
	}
	if len(l.Holders) == 0 && len(l.Waiters) == 0 && l.Delay == 0 {
		return fmt.Errorf("lock %q is idle but listed", l.Name)
	}
	return nil
}

// joins reports whether a request in mode may join holders on a name of
// the given permits (0 for a lock), leaving aside waiters and delay: shared
// with shared only, exclusive alone, and semaphore with semaphore while
// there are fewer holders than permits.
func joins(mode fsm.Mode, permits uint32, holders []fsm.HolderInfo) bool {
	if mode == fsm.Semaphore && len(holders) >= int(permits) {
		return false
	}
	for _, h := range holders {
		if mode == fsm.Exclusive || h.Mode != mode {
			return false
		}
	}
	return true
}

// checkDelays checks that pending lock-delays are added only by expiry
// (exactly the delays the result reports, with ids not seen before) and
// removed only by LiftDelay (the one it names, or every delay of the lock
// for id 0), that Delay is the longest pending one, and that no lock is
// under delay right after being granted.
func (m *modelChecker) checkDelays(now map[string]fsm.LockInfo, cmd *fsmpb.Command, res fsm.Result) error {
	pending := func(locks map[string]fsm.LockInfo) map[fsm.Delay]bool {
		out := map[fsm.Delay]bool{}
		for name, l := range locks {
			var longest time.Duration
			for _, d := range l.Delays {
				out[d] = true
				longest = max(longest, d.Delay)
			}
			if l.Delay != longest {
				panic(fmt.Sprintf("lock %q reports delay %v, but its longest pending delay is %v", name, l.Delay, longest))
			}
		}
		return out
	}
	before, after := pending(m.before), pending(now)
	reported := map[fsm.Delay]bool{}
	for _, d := range res.Effects.Delayed {
		reported[d] = true
		if before[d] || !after[d] {
			return fmt.Errorf("delay %+v reported, but it was pending before (%v) or is not after (%v)", d, before[d], after[d])
		}
	}
	for d := range after {
		if !before[d] && !reported[d] {
			return fmt.Errorf("delay %+v appeared, but the result reports %+v", d, res.Effects.Delayed)
		}
	}
	lift, isLift := cmd.GetOp().(*fsmpb.Command_LiftDelay)
	for d := range before {
		if after[d] {
			if isLift && res.Err == nil && lift.LiftDelay.GetLock() == d.Lock && lift.LiftDelay.GetId() == 0 {
				return fmt.Errorf("LiftDelay(%q) of every delay left %+v", d.Lock, d)
			}
			continue
		}
		if !isLift || lift.LiftDelay.GetLock() != d.Lock || (lift.LiftDelay.GetId() != 0 && lift.LiftDelay.GetId() != d.ID) {
			return fmt.Errorf("delay %+v vanished under %v", d, cmd)
		}
	}
	for _, g := range res.Effects.Grants {
		if now[g.Lock].Delay != 0 {
			return fmt.Errorf("%+v granted, but the lock is under delay %v after the command", g, now[g.Lock].Delay)
		}
	}
	return nil
}

// grantableNow reports whether a fresh request in mode, for a name of the
// given permits, may be granted at once according to the model and the
// previous state: no waiter ahead, no delay, every holder compatible and,
// on a semaphore, a permit free.
func (m *modelChecker) grantableNow(name string, mode fsm.Mode, permits uint32) bool {
	return len(m.queues[name]) == 0 && m.before[name].Delay == 0 && joins(mode, permits, m.holders[name])
}

func (m *modelChecker) holderIndex(name string, sid, token uint64) int {
	return slices.IndexFunc(m.holders[name], func(h fsm.HolderInfo) bool { return h.Session == sid && h.Token == token })
}

func (m *modelChecker) queueIndex(name string, sid uint64) int {
	return slices.IndexFunc(m.queues[name], func(w fsm.WaiterInfo) bool { return w.Session == sid })
}

// heldBy returns sid's first grant of name, or the zero HolderInfo.
func (m *modelChecker) heldBy(name string, sid uint64) fsm.HolderInfo {
	if i := slices.IndexFunc(m.holders[name], func(h fsm.HolderInfo) bool { return h.Session == sid }); i >= 0 {
		return m.holders[name][i]
	}
	return fsm.HolderInfo{}
}

// holdsIn returns the mode in which sid holds name, or 0.
func (m *modelChecker) holdsIn(name string, sid uint64) fsm.Mode { return m.heldBy(name, sid).Mode }

// tokenOf returns the token of sid's grant of name, or 0.
func (m *modelChecker) tokenOf(name string, sid uint64) uint64 { return m.heldBy(name, sid).Token }

// waitsIn returns the mode in which sid waits for name, or 0.
func (m *modelChecker) waitsIn(name string, sid uint64) fsm.Mode {
	if i := m.queueIndex(name, sid); i >= 0 {
		return m.queues[name][i].Mode
	}
	return 0
}

// liveIDs returns the ids of the live sessions, in order.
func (m *modelChecker) liveIDs() []uint64 { return slices.Sorted(maps.Keys(m.live)) }

// commandSource decodes bytes into commands over a small universe: live
// sessions plus ids 1..6 (some unknown or ended), locks "a", "b", "c", the
// exclusive and shared modes, semaphores of 1..3 permits (the same name
// used as a lock and as a semaphore, and wrong permits, at times: see
// acquirePermits) and a bad mode, try, lock-delays, waiter and session limits,
// releases with right and wrong tokens, expiry and close of holders and
// waiters together, and LiftDelay; 0xfd names the group, 0xfe raises the
// token floor, and 0xfc is an auth change, 0xfb batches the next
// commands, and an op byte of 0xa0..0xfa is a KV put or delete (see kvOp), whose puts may bind their keys to sessions. A close
// (2) or expiry (3) whose op byte's high nibble is 1, 5 or 9 ends the
// sessions that keys are bound to (see keyOwner); older seeds leave that
// nibble 0, and the saved input made of ASCII digits 3. Other op bytes
// whose high nibble is not 0 (older seeds leave it 0) reach acquire
// requests and idempotency keys: an acquire (4..7) carries a request id
// (see requestID), a cancel wait (8) names a request and an attempt, and
// 12 is a CancelAcquire (see requestTarget), and 1 gives the command that
// follows an idempotency key, or retries a keyed command made before (see
// keyedCommand). Where a command needs a token, a holder or a request it
// reads the state it is given, so a stream is decoded once, from the first
// State, and the same commands are fed to the others.
type commandSource struct {
	data []byte
	pos  int
	// keyed are the keyed commands made so far, for retries (see
	// keyedCommand).
	keyed []*fsmpb.Command
}

var lockNames = []string{"a", "b", "c"}

func (c *commandSource) byte() byte {
	if c.pos >= len(c.data) {
		return 0
	}
	b := c.data[c.pos]
	c.pos++
	return b
}

func (c *commandSource) session(s *fsm.State, b byte) uint64 {
	live := s.Sessions()
	if b&7 == 7 || len(live) == 0 {
		return 1 + uint64(b>>3)%6
	}
	return live[int(b>>3)%len(live)].ID
}

func lockName(b byte) string { return lockNames[int(b)%len(lockNames)] }

// keyOwner picks the session that key kvKeys[b%3] is bound to, or, if it
// is bound to none (or missing), one as session(s, b>>2) picks it.
func (c *commandSource) keyOwner(s *fsm.State, b byte) uint64 {
	if kv, ok := s.Get(kvKeys[int(b)%len(kvKeys)]); ok && kv.Session != 0 {
		return kv.Session
	}
	return c.session(s, b>>2)
}

// holderOf picks a holder of a lock, if it has one.
func holderOf(s *fsm.State, name string, b byte) (fsm.HolderInfo, bool) {
	l, ok := s.Lock(name)
	if !ok || len(l.Holders) == 0 {
		return fsm.HolderInfo{}, false
	}
	return l.Holders[int(b)%len(l.Holders)], true
}

// acquirePermits picks the permits of an acquire from o>>6 (k), bits that
// older inputs leave 0. A semaphore request (mode byte b >= 192, or mode
// index 7) names, for k 0..2, the permits of the semaphore in use, or 1+k
// if the name is idle or a lock (then a mismatched kind); for k 3, a wrong
// number: another one than the semaphore's in use, or 0 (no permits).
// Another mode names 0 permits, but 1..3, wrongly, for k 3 and an odd b/24.
func acquirePermits(s *fsm.State, name string, mode fsm.Mode, b, o byte) uint32 {
	k := uint32(o >> 6)
	inUse := uint32(0)
	if l, ok := s.Lock(name); ok {
		inUse = l.Permits
	}
	switch {
	case mode != sem && k == 3 && (b/24)%2 == 1:
		return 1 + uint32(b/48)%3
	case mode != sem:
		return 0
	case k == 3 && inUse > 0:
		return inUse%3 + 1
	case k == 3:
		return 0
	case inUse > 0:
		return inUse
	}
	return 1 + k
}

// closeEnds are the ends a generated CloseSession has.
var closeEnds = []fsmpb.SessionEnd{fsmpb.SessionEnd_SESSION_END_CLOSED, fsmpb.SessionEnd_SESSION_END_REVOKED, fsmpb.SessionEnd_SESSION_END_ABANDONED}

// next returns the next command, or false once the data is used up.
func (c *commandSource) next(s *fsm.State) (*fsmpb.Command, bool) {
	if c.pos >= len(c.data) {
		return nil, false
	}
	op := c.byte()
	if op == 0xff {
		return &fsmpb.Command{}, true
	}
	if op == 0xfb { // a batch of the next commands, perhaps keyed (refused)
		b := c.byte()
		batch := &fsmpb.Batch{}
		for range b % 8 {
			sub, ok := c.next(s)
			if !ok {
				break
			}
			batch.Commands = append(batch.Commands, sub)
		}
		cmd := &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: batch}}
		if b >= 0xf8 {
			cmd.IdempotencyKey = "batch"
		}
		return cmd, true
	}
	if op == 0xfd { // a leader names the group, perhaps again, perhaps badly
		id := []string{"", "g1", "g2"}[c.byte()%3]
		return &fsmpb.Command{Op: &fsmpb.Command_SetClusterId{SetClusterId: &fsmpb.SetClusterID{Id: id}}}, true
	}
	if op == 0xfc { // an auth change (see authOp)
		return authOp(c.byte(), c.byte(), c.byte()), true
	}
	if op == 0xfe { // a new leader's token floor, above or below the last token
		floor := max(0, int64(s.LastToken())+int64(c.byte())-128)
		return &fsmpb.Command{Op: &fsmpb.Command_RaiseTokens{RaiseTokens: &fsmpb.RaiseTokens{Floor: uint64(floor)}}}, true
	}
	if op >= 0xa0 {
		return c.kvOp(s, op), true
	}
	if op%16 == 1 && op>>4 != 0 {
		return c.keyedCommand(s, op>>4)
	}
	switch op % 16 {
	case 0, 1:
		b := c.byte()
		cmd := createSession(time.Duration(1+b%10)*time.Second, []string{"", "x"}[b>>7], []uint64{0, 0, 0, 3, 4, 5}[(b>>4)%6])
		cmd.GetCreateSession().User = []string{"", "", "u1", "u2"}[(op>>4)%4] // the creator, for quotas
		return cmd, true
	case 2: // closed, revoked or abandoned, as op>>6 says
		end := closeEnds[(op>>6)%3]
		if owners := (op>>4)%4 == 1; owners {
			return closeSessionAs(c.keyOwner(s, c.byte()), end), true
		}
		return closeSessionAs(c.session(s, c.byte()), end), true
	case 3:
		owners := (op>>4)%4 == 1
		n := 1 + int(c.byte())%3
		ids := make([]uint64, n)
		for i := range ids {
			if owners {
				ids[i] = c.keyOwner(s, c.byte())
			} else {
				ids[i] = c.session(s, c.byte())
			}
		}
		return expireSessions(ids...), true
	case 4, 5, 6, 7:
		sid, b, o := c.session(s, c.byte()), c.byte(), c.byte()
		name := lockName(b)
		mode := []fsm.Mode{excl, shared, excl, shared, 0, excl, shared, sem}[(b/3)%8]
		if b >= 192 || (name == "c" && (b/3)%8 >= 2 && mode != 0) {
			mode = sem // "c" is mostly a semaphore; any name at times
		}
		opts := []acquireOpt{withDelay([]time.Duration{0, 0, time.Second, 2 * time.Second}[(o>>1)&3]), maxWaiters([]uint64{0, 0, 0, 1, 2, 0, 0, 0}[(o>>3)&7])}
		if o&1 == 1 {
			opts = append(opts, try)
		}
		if n := acquirePermits(s, name, mode, b, o); n != 0 {
			opts = append(opts, permits(n))
		}
		if id := c.requestID(s, op>>4, sid, name); id != 0 {
			opts = append(opts, withRequest(id))
		}
		return acquire(sid, name, mode, opts...), true
	case 8:
		if op>>4 != 0 {
			sid, name, id, attempt := c.requestTarget(s, op>>4)
			return cancelWaitOf(sid, name, id, attempt), true
		}
		return cancelWait(c.session(s, c.byte()), lockName(c.byte())), true
	case 9:
		sid, name := c.session(s, c.byte()), lockName(c.byte())
		token := s.LastToken()
		if l, ok := s.Lock(name); ok {
			for _, h := range l.Holders {
				if h.Session == sid {
					token = h.Token
				}
			}
		}
		return release(sid, name, token), true
	case 10:
		name, b := lockName(c.byte()), c.byte()
		if h, ok := holderOf(s, name, b); ok {
			return release(h.Session, name, []uint64{h.Token + 1, h.Token - 1, 0, s.LastToken() + 1}[(b>>4)%4]), true
		}
		return release(c.session(s, b), name, uint64(b>>4)), true
	case 11:
		name, b := lockName(c.byte()), c.byte()
		if h, ok := holderOf(s, name, b); ok {
			return release(h.Session, name, h.Token), true
		}
		return release(c.session(s, b), name, 1), true
	case 12:
		if op>>4 != 0 {
			sid, name, id, attempt := c.requestTarget(s, op>>4)
			return cancelAcquire(sid, name, id, attempt), true
		}
		return liftDelay(lockName(c.byte())), true
	case 13:
		b := c.byte()
		if all := s.DelayedLocks(); len(all) > 0 {
			// Mostly one delay by its id, as leaders commit them; now
			// and then every delay of the lock, as older versions did.
			d := all[int(b)%len(all)]
			if b&0x80 == 0 {
				return liftDelayID(d.Lock, d.ID), true
			}
			return liftDelay(d.Lock), true
		}
		return liftDelay(lockName(b)), true
	case 14:
		name, b := lockName(c.byte()), c.byte()
		sid := c.session(s, b)
		if h, ok := holderOf(s, name, b); ok {
			sid = h.Session
		}
		if b&0x80 != 0 {
			return closeSessionAs(sid, closeEnds[((b>>5)&3)%3]), true
		}
		return expireSessions(sid), true
	default: // 15: expire the holders and waiters of one lock together
		name, b := lockName(c.byte()), c.byte()
		l, _ := s.Lock(name)
		var holders, waiters []uint64
		for _, h := range l.Holders {
			holders = append(holders, h.Session)
		}
		for _, w := range l.Waiters {
			waiters = append(waiters, w.Session)
		}
		if b&1 == 1 {
			return expireSessions(append(waiters, holders...)...), true
		}
		return expireSessions(append(holders, waiters...)...), true
	}
}

// maxStreamSteps bounds a stream, so that a fuzz input runs quickly.
const maxStreamSteps = 400

// runStream applies the stream decoded from data to three States: a, which
// the modelChecker follows; b, a second fresh State; and c, rebuilt from a's
// snapshot every few steps. Every Result and the final snapshot bytes must
// be identical across them (invariant 7). It returns how many KV commands
// had each outcome (see kvOutcome), how many commands reached each
// semaphore path (see semOutcomes) and each path of keys bound to
// sessions (see bindOutcomes), and how many steps the model saw take each
// path of acquire requests and idempotency keys (see requestModel.note).
func runStream(tb testing.TB, data []byte) map[string]int {
	tb.Helper()
	return runStreamFrom(tb, data, nil)
}

// runStreamFrom is runStream on States restored from start, a snapshot
// that holds idempotency keys and nothing else (nil for fresh States).
func runStreamFrom(tb testing.TB, data []byte, start *fsmpb.Snapshot) map[string]int {
	tb.Helper()
	src := &commandSource{data: data}
	a, b, c := startState(tb, start), startState(tb, start), startState(tb, start)
	check := newModelChecker()
	check.req.start(tb, start)
	period := 5
	if len(data) > 0 {
		period += int(data[0] % 32)
	}
	var history []string
	fail := func(step int, format string, args ...any) {
		tb.Helper()
		from := max(0, len(history)-40)
		tb.Fatalf("step %d: %s\nlast commands:\n%s", step, fmt.Sprintf(format, args...), strings.Join(history[from:], "\n"))
	}
	outcomes := map[string]int{}
	mirror := lockMirror{}
	lastPermits := map[string]uint32{}
	prologue := []*fsmpb.Command{newSession(), newSession(), newSession(), newSession()}
	for step := 0; step < maxStreamSteps; step++ {
		if step > 0 && step%period == 0 {
			if !bytes.Equal(snapshotBytes(tb, a), snapshotBytes(tb, c)) {
				fail(step, "invariant 7: the state restored at an earlier step has drifted from the original")
			}
			c = mustRestore(tb, a)
		}
		var cmd *fsmpb.Command
		if step < len(prologue) {
			cmd = prologue[step]
		} else if next, ok := src.next(a); ok {
			cmd = next
		} else {
			break
		}
		before := snapshotBytes(tb, a)
		var pre fsm.LockInfo
		var inUse bool
		if op, ok := cmd.GetOp().(*fsmpb.Command_Acquire); ok {
			pre, inUse = a.Lock(op.Acquire.GetLock())
		}
		kvPre := kvBeforeOf(a)
		ra := a.Apply(cmd)
		history = append(history, fmt.Sprintf("  %d: %v -> %s", step, cmd, describe(ra)))
		if err := check.observe(tb, cmd, ra, a, before); err != nil {
			fail(step, "%v", err)
		}
		// The lock events alone tell a watcher every lock's holders,
		// waiters and lock-delays.
		if err := mirror.apply(ra); err != nil {
			fail(step, "lock events: %v", err)
		}
		if d := mirror.differs(a); d != "" {
			fail(step, "lock events: %s", d)
		}
		for _, o := range check.req.takeNotes() {
			outcomes[o]++
		}
		if !answeredByKey(cmd, ra) {
			if o := kvOutcome(cmd, ra); o != "" {
				outcomes[o]++
			}
			for _, o := range semOutcomes(cmd, ra, pre, inUse, lastPermits, a) {
				outcomes[o]++
			}
			for _, o := range bindOutcomes(cmd, ra, kvPre) {
				outcomes[o]++
			}
			for _, o := range txnOutcomes(cmd, ra) {
				outcomes[o]++
			}
		}
		for _, l := range a.Locks("") {
			lastPermits[l.Name] = l.Permits
		}
		for name, other := range map[string]*fsm.State{"second fresh state": b, "restored state": c} {
			ro := other.Apply(cmd)
			if !sameAnswer(ro, ra) {
				fail(step, "invariant 7: %s answered %s, the first %s", name, describe(ro), describe(ra))
			}
			if !reflect.DeepEqual(allLockEvents(ro), allLockEvents(ra)) {
				fail(step, "invariant 7: %s made lock events\n%s\nthe first\n%s", name, describeLockEvents(allLockEvents(ro)), describeLockEvents(allLockEvents(ra)))
			}
		}
	}
	want := snapshotBytes(tb, a)
	if !bytes.Equal(snapshotBytes(tb, b), want) || !bytes.Equal(snapshotBytes(tb, c), want) {
		tb.Fatalf("invariant 7: final snapshots differ")
	}
	return outcomes
}

// semaphoreStream returns the input of a stream of about n commands that
// mostly act on semaphores (see commandSource.next for the encoding):
// sessions created, semaphore acquires of "a", "b" and "c" with their
// permits in use or a wrong number, some with try, lock-delay or a waiter
// limit, a few lock acquires of the same names, releases, cancels, closes
// and expiries of holders and waiters, and lifted delays.
func semaphoreStream(r *rand.Rand, n int) []byte {
	var data []byte
	session := func() byte { return byte(8 * r.IntN(8)) } // a live session
	name := func() byte { return byte(r.IntN(3)) }
	for range n {
		switch x := r.IntN(100); {
		case x < 15: // a session, without a limit
			data = append(data, 0, byte(r.IntN(16)))
		case x < 55: // a semaphore acquire: b >= 192; o>>6 == 3 is a wrong number
			o := byte(r.IntN(2)) | byte(r.IntN(4))<<1 | byte([]int{0, 0, 0, 0, 0, 3, 4, 0}[r.IntN(8)])<<3 | byte([]int{0, 1, 1, 1, 2, 2, 2, 3}[r.IntN(8)])<<6
			if r.IntN(3) > 0 {
				o &^= 1 // try in 1 of 6
			}
			data = append(data, 4, session(), byte(192+3*r.IntN(21))+name(), o)
		case x < 60: // an exclusive or shared acquire, of a name that may be a semaphore
			data = append(data, 4, session(), byte(24*r.IntN(8)+3*r.IntN(2))+name(), byte(r.IntN(256)))
		case x < 75: // a holder releases
			data = append(data, 11, name(), byte(r.IntN(256)))
		case x < 78: // a release with a wrong token
			data = append(data, 10, name(), byte(r.IntN(256)))
		case x < 83: // a session cancels its wait
			data = append(data, 8, session(), name())
		case x < 88: // a holder's session expires or closes
			data = append(data, 14, name(), byte(r.IntN(256)))
		case x < 91: // two sessions expire together
			data = append(data, 3, 1, session(), session())
		case x < 93: // the holders and waiters of a lock expire together
			data = append(data, 15, name(), byte(r.IntN(2)))
		default: // a delayed lock is lifted
			data = append(data, 13, byte(r.IntN(256)))
		}
	}
	return data
}

// semOutcomes names the semaphore paths a command reached, so that
// TestRandomCommandStreams can show its streams reach them. pre is the
// acquired name's lock before an Acquire (inUse false if it was idle),
// lastPermits each name's permits when it was last in use, and s the state
// after the command.
func semOutcomes(cmd *fsmpb.Command, res fsm.Result, pre fsm.LockInfo, inUse bool, lastPermits map[string]uint32, s *fsm.State) []string {
	var out []string
	if op, ok := cmd.GetOp().(*fsmpb.Command_Acquire); ok {
		a := op.Acquire
		mode, n := fsm.Mode(a.GetMode()), a.GetPermits()
		_, seen := lastPermits[a.GetLock()]
		switch {
		case errors.Is(res.Err, fence.ErrSessionNotFound) || errors.Is(res.Err, fence.ErrCancelled) || (res.Err != nil && !validMode(a.GetMode())):
		case errors.Is(res.Err, fence.ErrInvalidArgument) && (mode == sem) != (n > 0):
			out = append(out, "semaphore: permits that do not fit the mode")
		case errors.Is(res.Err, fence.ErrInvalidArgument) && inUse && pre.Permits > 0 && n > 0 && n != pre.Permits:
			out = append(out, "semaphore: wrong number of permits")
		case errors.Is(res.Err, fence.ErrInvalidArgument) && inUse && pre.Permits > 0 && n == 0:
			out = append(out, "semaphore: taken as a lock")
		case errors.Is(res.Err, fence.ErrInvalidArgument) && inUse && pre.Permits == 0 && n > 0:
			out = append(out, "semaphore: lock taken as a semaphore")
		case mode != sem:
			if res.Err == nil && !inUse && seen && lastPermits[a.GetLock()] > 0 {
				out = append(out, "semaphore: name reused as a lock")
			}
		case errors.Is(res.Err, fence.ErrLocked) && pre.Delay > 0:
			out = append(out, "semaphore: try under delay")
		case errors.Is(res.Err, fence.ErrLocked) && len(pre.Holders) >= int(n):
			out = append(out, "semaphore: try when full")
		case errors.Is(res.Err, fence.ErrLimit):
			out = append(out, "semaphore: waiter limit")
		case res.Err != nil:
			out = append(out, "semaphore: other error")
		case len(res.Effects.Grants) == 1 && len(pre.Holders) > 0:
			out = append(out, "semaphore: granted beside other holders")
		case len(res.Effects.Grants) == 1 && !inUse && seen && lastPermits[a.GetLock()] == 0:
			out = append(out, "semaphore: name reused as a semaphore")
		case res.Acquire().Grant != nil && len(res.Effects.Grants) == 0:
			out = append(out, "semaphore: granted again")
		case res.Acquire().Queued && len(pre.Holders) >= int(n) && slices.IndexFunc(pre.Waiters, func(w fsm.WaiterInfo) bool { return w.Session == a.GetSessionId() }) < 0:
			out = append(out, "semaphore: queued when full")
		}
	}
	handedOff := map[string]int{}
	for _, g := range res.Effects.Grants {
		if _, isAcquire := cmd.GetOp().(*fsmpb.Command_Acquire); g.Mode == sem && !isAcquire {
			handedOff[g.Lock]++
		}
	}
	for _, n := range handedOff {
		out = append(out, "semaphore: handed to waiters")
		if n > 1 {
			out = append(out, "semaphore: handed to several waiters at once")
		}
		if _, lift := cmd.GetOp().(*fsmpb.Command_LiftDelay); lift {
			out = append(out, "semaphore: handed to waiters when the delay lifts")
		}
	}
	for _, d := range res.Effects.Delayed {
		if l, ok := s.Lock(d.Lock); ok && l.Permits > 0 {
			out = append(out, "semaphore: put under delay")
		}
	}
	return out
}

// TestRandomCommandStreams runs runStream on seeded pseudo-random streams,
// so that the model and determinism checks run on every go test, not only
// under -fuzz. It also proves the streams reach every KV outcome and every
// path of semaphores, keys bound to sessions, acquire requests and
// idempotency keys, so that those model checks are not passing on streams
// that never test them.
func TestRandomCommandStreams(t *testing.T) {
	n := 150
	if testing.Short() {
		n = 30
	}
	// total adds up the outcomes of every stream, which stream runs, from
	// fresh States, as the subtest name.
	total := map[string]int{}
	add := func(outcomes map[string]int) {
		for o, c := range outcomes {
			total[o] += c
		}
	}
	stream := func(name string, data []byte) {
		t.Run(name, func(t *testing.T) { add(runStream(t, data)) })
	}
	for seed := range uint64(n) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		data := make([]byte, 64+r.IntN(700))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		stream(fmt.Sprint(seed), data)
	}
	// Streams from the generators: count of each (as many under -short),
	// stream seed drawn from rand.NewPCG(seed, pcgStream) and about
	// base+seed%spread commands long.
	for _, g := range []struct {
		name         string
		count        uint64
		pcgStream    uint64 // the second seed of the PCG
		base, spread int
		commands     func(r *rand.Rand, n int) []byte
	}{
		// Random bytes keep few sessions alive and make few semaphore
		// acquires, so that semaphores seldom fill up: these streams are
		// mostly of them, as they are quick and some paths are rare.
		{"semaphores", 150, 0x5e3a, 60, 120, semaphoreStream},
		// Keys bound to sessions, and those sessions ending.
		{"bindings", 100, 0xb0a7, 40, 120, boundKeyStream},
		// Acquire requests, their cancels and keyed commands.
		{"requests", 60, 0x4e9, 50, 120, func(r *rand.Rand, n int) []byte { return requestStream(r, n, 0) }},
		// Auth with small quotas per user.
		{"quotas", 40, 0x907a, 60, 100, quotaStream},
		{"txns", 60, 0x7a9, 40, 100, txnStream},
	} {
		for seed := range g.count {
			data := g.commands(rand.New(rand.NewPCG(seed, g.pcgStream)), g.base+int(seed)%g.spread)
			stream(fmt.Sprint(g.name, "/", seed), data)
		}
	}
	// Streams of one session cancelling more requests than it remembers;
	// and from a state that remembers as many idempotency keys as it keeps.
	for seed := range uint64(10) {
		data := cancelStormStream(rand.New(rand.NewPCG(seed, 0xca7)))
		stream(fmt.Sprint("cancel storms/", seed), data)
	}
	// Random streams in which every few commands are batched.
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 0xba7c))
		data := make([]byte, 100+r.IntN(500))
		for i := range data {
			data[i] = byte(r.Uint32())
			if i > 0 && r.IntN(6) == 0 {
				data[i] = 0xfb
			}
		}
		stream(fmt.Sprint("batches/", seed), data)
	}
	// One short stream from a state that keeps as many keys as it may:
	// every step takes snapshots of ten thousand keys, slow under -race.
	t.Run("keys kept in full", func(t *testing.T) {
		data := keysInFullStream(rand.New(rand.NewPCG(0, 0x1d3)))
		add(runStreamFrom(t, data, keyedStart()))
	})
	t.Logf("outcomes: %v", total)

	// reachedEach fails the test if the streams reached any of outcomes,
	// each named prefix+outcome in total, fewer than three times: the model
	// checks of that path would then pass without being tested. It reports
	// only the first shortfall, as each message prints every count, and
	// none once the test has failed, as a failed stream stopped short.
	reachedEach := func(what, prefix string, outcomes ...string) {
		t.Helper()
		for _, o := range outcomes {
			if total[prefix+o] < 3 && !t.Failed() {
				t.Errorf("the streams reached %s %q only %d times: %v", what, o, total[prefix+o], total)
			}
		}
	}
	reachedEach("KV outcome", "", "fenced put", "fenced delete", "unfenced write", "strict write", "CAS write", "no-op delete",
		"fenced no-op delete", "stale", "invalid", "never issued", "not holder", "revision mismatch", "limit", "session not found")
	if total["other error"] > 0 {
		t.Errorf("KV commands failed with unexpected errors: %v", total)
	}
	reachedEach("semaphore path", "semaphore: ", "permits that do not fit the mode", "wrong number of permits", "taken as a lock", "lock taken as a semaphore",
		"name reused as a lock", "name reused as a semaphore", "try under delay", "try when full", "waiter limit",
		"granted beside other holders", "granted again", "queued when full", "handed to waiters", "handed to several waiters at once",
		"handed to waiters when the delay lifts", "put under delay")
	if total["semaphore: other error"] > 0 {
		t.Errorf("semaphore acquires failed with unexpected errors: %v", total)
	}
	reachedEach("request path", "request: ", "granted with a request id", "queued with a request id", "a retry took the grant over", "a retry took the wait over",
		"another request told of the grant", "another request told of the wait", "acquire of a cancelled request refused",
		"cancel released the grant", "cancel released the grant by its attempt", "cancel dropped the wait", "cancel dropped the wait by its attempt",
		"a grant released by cancel handed the lock on", "a wait dropped by cancel handed the lock on",
		"cancel of an attempt taken over left the request", "cancel of another request left the session's", "cancel that matches nothing",
		"cancel without a request id refused", "a request cancelled again", "the oldest cancelled request forgotten",
		"a request cancelled and since forgotten acquired again", "cancel wait by request answered the grant", "cancel wait by request dropped the wait",
		"cancel wait by another request left the grant", "cancel wait by another request left the wait",
		"legacy cancel wait answered the grant", "legacy cancel wait dropped the wait")
	reachedEach("idempotency key path", "key: ", "a keyed command applied", "a keyed command failed and left no key", "a retry of a failed keyed command applied",
		"a keyed command repeated", "a retry of the same command repeated", "a key reused by another command", "a repeat of a CreateSession",
		"a repeat of a write that changed keys", "a repeat of a write that changed nothing", "a repeat with nothing to report",
		"a key over the limit refused", "a key of the longest length applied", "the oldest key forgotten", "a key forgotten applied again",
		"a repeat of a txn that ran then")
	reachedEach("batch path", "batch: ", "applied", "refused whole", "a batch inside refused")
	reachedEach("txn path", "txn: ", "then ran", "else ran", "several writes at one revision", "changed nothing", "a get after a write of its key",
		"a get found its key", "a bound put", "fenced no-op delete", "strict writes", "stale", "refused by a write after another", "invalid",
		"not holder", "limit", "session not found", "never issued")
	reachedEach("quota path", "quota: ", "sessions quota refused a session", "locks quota refused an acquire", "waits quota refused an acquire",
		"kv bytes quota refused a put", "kv bytes quota refused a txn")
	reachedEach("binding path", "binding: ", "bound put", "bound again to its session", "rebound to another session", "unbound by a put",
		"unbound by a delete", "put bound to a session not live", "session checked before max_keys", "fence checked before the session",
		"keys deleted on close", "keys deleted on expiry", "a fenced key left as a tombstone by its session",
		"keys of several sessions deleted in one command", "several keys of one session deleted", "locks handed on as keys are deleted")
}

// observedState applies cmds to a new state under a new model checker,
// failing the test if the checker objects to any of them.
func observedState(t *testing.T, cmds ...*fsmpb.Command) (*fsm.State, *modelChecker) {
	t.Helper()
	s, m := fsm.NewState(), newModelChecker()
	for _, cmd := range cmds {
		before := snapshotBytes(t, s)
		if err := m.observe(t, cmd, s.Apply(cmd), s, before); err != nil {
			t.Fatalf("setup %v: %v", cmd, err)
		}
	}
	return s, m
}

// restoreBroken returns a copy of s whose snapshot was changed by breakIt.
func restoreBroken(t *testing.T, s *fsm.State, breakIt func(*fsmpb.Snapshot)) *fsm.State {
	t.Helper()
	snap := s.Snapshot()
	breakIt(snap)
	b, err := fsm.Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// observeRefusedAs applies cmd, which the state must refuse with refusal,
// and returns what the checker says of it reported as res instead.
func observeRefusedAs(t *testing.T, s *fsm.State, m *modelChecker, cmd *fsmpb.Command, refusal error, res fsm.Result) error {
	t.Helper()
	before := snapshotBytes(t, s)
	if got := s.Apply(cmd); !errors.Is(got.Err, refusal) {
		t.Fatalf("setup: %s", describe(got))
	}
	return m.observe(t, cmd, res, s, before)
}

// TestModelCheckerCatchesViolations shows that the checker can fail: fed
// results (or states) that break invariants 1, 2, 4, 5 and 6, the rules of
// semaphores, or those of keys bound to sessions, observe reports each.
func TestModelCheckerCatchesViolations(t *testing.T) {
	setup := func(t *testing.T) (*fsm.State, *modelChecker) {
		return observedState(t, newSession(), newSession(), newSession(), acquire(1, "a", excl), acquire(2, "a", excl), acquire(3, "a", excl))
	}
	releaseAndAcquire := batchOf(release(1, "a", 1), acquire(1, "b", excl))
	runBrokenCases(t, setup, []brokenCase{
		{"a token reused (1)", release(1, "a", 1), func(r fsm.Result) fsm.Result { r.Effects.Grants[0].Token = 1; return r }, nil, ""},
		{"the grant skips the head of the queue (4)", release(1, "a", 1), func(r fsm.Result) fsm.Result { r.Effects.Grants[0].Session = 3; return r }, nil, ""},
		{"a grant goes missing from the result (1)", release(1, "a", 1), func(r fsm.Result) fsm.Result { r.Effects.Grants = nil; return r }, nil, ""},
		{"a grant to a session the same command ends (5)", expireSessions(1, 2), func(r fsm.Result) fsm.Result {
			r.Effects.Grants = append([]fsm.Grant{grant(2, "a", 2, excl)}, r.Effects.Grants...)
			return r
		}, nil, "invariant"},
		// A batch must answer each command as applied alone, and apply each.
		{"batch: two callers' results swapped", releaseAndAcquire, func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(b *fsm.BatchAnswer) { b.Results[0], b.Results[1] = b.Results[1], b.Results[0] })
		}, nil, ""},
		{"batch: a result missing", releaseAndAcquire, func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(b *fsm.BatchAnswer) { b.Results = b.Results[:1] })
		}, nil, ""},
		{"batch: a hand-off left out", releaseAndAcquire, func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(b *fsm.BatchAnswer) { b.Results[0].Effects.Grants = nil })
		}, nil, ""},
		{"batch: the batch failed whole", releaseAndAcquire, func(fsm.Result) fsm.Result { return fsm.Result{Err: fence.ErrInvalidArgument} }, nil, ""},
	})
	kvSetup := func(t *testing.T) (*fsm.State, *modelChecker) {
		return observedState(t,
			newSession(), acquire(1, "a", excl), release(1, "a", 1), acquire(1, "a", excl), release(1, "a", 2),
			acquire(1, "a", excl), release(1, "a", 3), acquire(1, "a", excl), release(1, "a", 4), acquire(1, "a", excl), // token 5
			kvPut("k", "v", fenced("a", 5)), kvPut("t", "v", fenced("a", 5)), kvDel("t", fenced("a", 5)))
	}
	// The KV cases that do more than break the result of a command or the
	// state it leaves; runBrokenCases runs the others below.
	kvCases := []struct {
		name string
		run  func(t *testing.T, s *fsm.State, m *modelChecker) error
		// why is what the error must say; "invariant 6" if empty.
		why string
	}{
		{"a stale put reported as accepted (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			return observeRefusedAs(t, s, m, kvPut("k", "old", fenced("a", 4)), fence.ErrStaleToken, wrote(3, kvAt("k", "old", "a", 4, 5, 1, 4, 2)))
		}, ""},
		{"a stale put on a tombstone applied by the state (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			cmd := kvPut("t", "old", fenced("a", 4))
			before := snapshotBytes(t, s)
			broken := restoreBroken(t, s, func(snap *fsmpb.Snapshot) {
				snap.KvRevision = 4
				snap.Kvs[1] = &fsmpb.KV{Key: "t", Value: []byte("old"), Token: 4, Lock: "a", HighestToken: 5, CreateRevision: 4, ModRevision: 4, Version: 1}
			})
			return m.observe(t, cmd, wrote(4, kvAt("t", "old", "a", 4, 5, 4, 4, 1)), broken, before)
		}, ""},
		{"a stale delete applied by the state (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			cmd := kvDel("k", fenced("a", 4))
			before := snapshotBytes(t, s)
			broken := restoreBroken(t, s, func(snap *fsmpb.Snapshot) {
				snap.KvRevision = 4
				snap.Kvs[0] = &fsmpb.KV{Key: "k", Token: 4, Lock: "a", HighestToken: 5, CreateRevision: 1, ModRevision: 4, Version: 1, Deleted: true}
			})
			return m.observe(t, cmd, removed(4, kvAt("k", "", "a", 4, 5, 1, 4, 1)), broken, before)
		}, ""},
		{"a key's highest token goes down (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			broken := restoreBroken(t, s, func(snap *fsmpb.Snapshot) { snap.Kvs[0].Token, snap.Kvs[0].HighestToken = 3, 3 })
			return m.observe(t, liftDelay("z"), fsm.Result{}, broken, snapshotBytes(t, broken))
		}, ""},
		{"a tombstone is forgotten (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			broken := restoreBroken(t, s, func(snap *fsmpb.Snapshot) { snap.Kvs = snap.Kvs[:1] })
			return m.observe(t, liftDelay("z"), fsm.Result{}, broken, snapshotBytes(t, broken))
		}, ""},
		{"a fenced delete of a tombstone does not raise its highest token (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			for _, cmd := range []*fsmpb.Command{release(1, "a", 5), acquire(1, "a", excl)} { // token 6
				before := snapshotBytes(t, s)
				if err := m.observe(t, cmd, s.Apply(cmd), s, before); err != nil {
					t.Fatalf("setup %v: %v", cmd, err)
				}
			}
			cmd := kvDel("t", fenced("a", 6))
			before := snapshotBytes(t, s)
			res := s.Apply(cmd)
			broken := restoreBroken(t, s, func(snap *fsmpb.Snapshot) { snap.Kvs[1].HighestToken = 5 })
			return m.observe(t, cmd, res, broken, before)
		}, ""},
		{"a write with a token never issued reported as accepted", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			return observeRefusedAs(t, s, m, kvPut("k", "x", fenced("a", 6)), fence.ErrInvalidArgument, wrote(4, kvAt("k", "x", "a", 6, 6, 1, 4, 2)))
		}, "never issued"},
		{"a stale txn reported as applied (6)", func(t *testing.T, s *fsm.State, m *modelChecker) error {
			return observeRefusedAs(t, s, m, txn(nil, ops(tPut("n", "x"), tPut("k", "old")), nil, fenced("a", 4)), fence.ErrStaleToken,
				txnDid(true, 4, []fsm.TxnOpAnswer{none, none}, put(kvAt("n", "x", "a", 4, 4, 4, 4, 1)), put(kvAt("k", "old", "a", 4, 5, 1, 4, 2))))
		}, ""},
	}
	for _, tc := range kvCases {
		t.Run(tc.name, func(t *testing.T) {
			s, m := kvSetup(t)
			why := tc.why
			if why == "" {
				why = "invariant 6"
			}
			if err := tc.run(t, s, m); err == nil || !strings.Contains(err.Error(), why) {
				t.Fatalf("observe = %v, want an error saying %q", err, why)
			}
		})
	}
	runBrokenCases(t, kvSetup, []brokenCase{
		{"a fenced delete of a key never seen records no token (6)", kvDel("new", fenced("a", 5)), nil, func(snap *fsmpb.Snapshot) {
			snap.Kvs = slices.DeleteFunc(snap.Kvs, func(kv *fsmpb.KV) bool { return kv.GetKey() == "new" })
		}, "invariant 6"},
		{"an unfenced write reported with a lock", kvPut("p", "x", fenced("a", 0)), func(r fsm.Result) fsm.Result {
			r.Effects.Events[0].KV.Lock = "a"
			return r
		}, nil, `Lock:"a"`},
		{"a txn applied in part by the state", txn(nil, ops(tPut("n", "x"), tPut("m", "y")), nil), nil, func(snap *fsmpb.Snapshot) {
			snap.Kvs = slices.DeleteFunc(snap.Kvs, func(kv *fsmpb.KV) bool { return kv.GetKey() == "n" })
		}, "snapshot keeps"},
		{"a txn's writes at two revisions", txn(nil, ops(tPut("n", "x"), tPut("k", "new")), nil, fenced("a", 5)), func(r fsm.Result) fsm.Result {
			r.Effects.Events[1].KV.ModRevision++
			return r
		}, nil, "answered"},
		{"a txn that ran the wrong list", txn(ifs(ifValue("k", eq, "v")), ops(tGet("k")), ops(tGet("k"))), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.TxnAnswer) { a.Succeeded = false })
		}, nil, "answered"},
		{"a txn's get that read another key", txn(nil, ops(tGet("k"), tGet("t")), nil), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.TxnAnswer) { a.Ops[1] = a.Ops[0] })
		}, nil, "answered"},
	})
	// A semaphore of 2 permits held by sessions 1 and 2, session 3 waiting.
	semSetup := func(t *testing.T) (*fsm.State, *modelChecker) {
		return observedState(t, newSession(), newSession(), newSession(), newSession(),
			acquire(1, "s", sem, permits(2)), acquire(2, "s", sem, permits(2)), acquire(3, "s", sem, permits(2)))
	}
	semCases := []struct {
		name string
		// cmd is observed with res on the state that run returns, without
		// being applied to it unless run applies it.
		cmd *fsmpb.Command
		run func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State)
		why string
	}{
		{"a grant past the permits (2, 4)", acquire(4, "s", sem, permits(2)), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return granted(4, "s", 3, sem), restoreBroken(t, s, func(snap *fsmpb.Snapshot) { snap.LastToken = 3 })
		}, "full semaphore"},
		{"a valid semaphore acquire refused", acquire(4, "s", sem, permits(2)), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return fails(fence.ErrInvalidArgument), s
		}, "model says it succeeds"},
		{"a try on a full semaphore reported as invalid", acquire(4, "s", sem, permits(2), try), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return fails(fence.ErrInvalidArgument), s
		}, "want fence: lock is held"},
		{"a semaphore taken as a lock", acquire(4, "s", excl), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return queued(), s
		}, "model says it fails"},
		{"a semaphore asked with another number of permits", acquire(4, "s", sem, permits(3)), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return queued(), s
		}, "in use with 2 permits"},
		{"a semaphore acquire without permits", acquire(4, "t", sem), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return fails(fence.ErrLocked), s
		}, "0 permits do not fit semaphore mode"},
		{"a semaphore's permits changed in the state", liftDelay("z"), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			return fsm.Result{}, restoreBroken(t, s, func(snap *fsmpb.Snapshot) { snap.Locks[0].Permits = 3 })
		}, "permits"},
		{"a free permit not handed to the head waiter", release(1, "s", 1), func(t *testing.T, s *fsm.State, cmd *fsmpb.Command) (fsm.Result, *fsm.State) {
			s.Apply(cmd)
			return fsm.Result{}, restoreBroken(t, s, func(snap *fsmpb.Snapshot) {
				l := snap.Locks[0]
				l.Waiters = append(l.Waiters, &fsmpb.Waiter{SessionId: 3, Mode: uint32(sem)})
				l.Holders = l.Holders[:1]
				snap.LastToken = 2
			})
		}, "could be granted now"},
	}
	for _, tc := range semCases {
		t.Run(tc.name, func(t *testing.T) {
			s, m := semSetup(t)
			before := snapshotBytes(t, s)
			res, after := tc.run(t, s, tc.cmd)
			if err := m.observe(t, tc.cmd, res, after, before); err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("observe = %v, want an error saying %q", err, tc.why)
			}
		})
	}
	// Keys bound to sessions: k (fenced by a, token 1) and j bound to
	// session 1, u to none; session 2 waits for a.
	bindSetup := func(t *testing.T) (*fsm.State, *modelChecker) {
		return observedState(t, newSession(), newSession(), acquire(1, "a", excl), acquire(2, "a", excl),
			kvPut("k", "v", fenced("a", 1), boundTo(1)), kvPut("j", "v", boundTo(1)), kvPut("u", "v"))
	}
	sessionGone := fmt.Errorf("%w: session 7 does not exist or has expired; create a new session", fence.ErrSessionNotFound)
	bindCases := []brokenCase{
		{"a close that leaves its session's keys", closeSession(1), func(r fsm.Result) fsm.Result {
			r.Effects.Events = nil
			return r
		}, nil, "the model deletes their keys"},
		{"a close that deletes its session's keys out of key order", closeSession(1), func(r fsm.Result) fsm.Result {
			r.Effects.Events[0], r.Effects.Events[1] = r.Effects.Events[1], r.Effects.Events[0]
			return r
		}, nil, "the model deletes their keys"},
		{"a close that deletes its keys at one revision", closeSession(1), func(r fsm.Result) fsm.Result {
			r.Effects.Events[1].KV.ModRevision = r.Effects.Events[0].KV.ModRevision
			return r
		}, nil, "the model deletes their keys"},
		{"a key deleted with its session still reported bound", closeSession(1), func(r fsm.Result) fsm.Result {
			r.Effects.Events[0].KV.Session = 1
			return r
		}, nil, "the model deletes their keys"},
		{"a key deleted with its session leaves no tombstone", closeSession(1), nil, func(snap *fsmpb.Snapshot) {
			snap.Kvs = slices.DeleteFunc(snap.Kvs, func(kv *fsmpb.KV) bool { return kv.GetKey() == "k" })
		}, "invariant 6"},
		{"a key bound to a closed session left live", closeSession(1), func(r fsm.Result) fsm.Result {
			r.Effects.Events = r.Effects.Events[:1]
			return r
		}, func(snap *fsmpb.Snapshot) {
			snap.KvRevision--
			i := slices.IndexFunc(snap.Kvs, func(kv *fsmpb.KV) bool { return kv.GetKey() == "k" })
			snap.Kvs[i] = &fsmpb.KV{Key: "k", Value: []byte("v"), Token: 1, Lock: "a", HighestToken: 1, CreateRevision: 1, ModRevision: 1, Version: 1}
		}, "the model deletes their keys"},
		{"a put bound to a session that does not exist reported as accepted", kvPut("n", "v", boundTo(7)), func(fsm.Result) fsm.Result {
			return wrote(4, bound(kvAt("n", "v", "", 0, 0, 4, 4, 1), 7))
		}, nil, "the model refuses it"},
		{"a put bound to a session failed for its token reported for its session", kvPut("k", "v", boundTo(7)), func(fsm.Result) fsm.Result {
			return fsm.Result{Err: sessionGone}
		}, nil, "want fence: invalid argument"},
		{"a put bound to a missing session over max_keys reported as the limit", kvPut("n", "v", boundTo(7), maxKeys(1)), func(fsm.Result) fsm.Result {
			return fails(fence.ErrLimit)
		}, nil, "session"},
		{"a bound put reported unbound", kvPut("u", "w", boundTo(2)), func(r fsm.Result) fsm.Result {
			r.Effects.Events[0].KV.Session = 0
			return r
		}, nil, "the model"},
		{"a put that leaves its key bound to its old session", kvPut("j", "w"), nil, func(snap *fsmpb.Snapshot) {
			for _, kv := range snap.Kvs {
				if kv.GetKey() == "j" {
					kv.SessionId = 1
				}
			}
		}, "snapshot has"},
		{"a delete that leaves its key bound", kvDel("k", fenced("a", 1)), func(r fsm.Result) fsm.Result {
			r.Effects.Events[0].KV.Session = 1
			return r
		}, nil, "the model"},
	}
	runBrokenCases(t, bindSetup, bindCases)
}

// brokenCase is a command applied to a state and observed by the model
// checker with its result broken by res, on the state broken by state
// (each nil for none): the checker must fail, saying why ("" for any
// error).
type brokenCase struct {
	name  string
	cmd   *fsmpb.Command
	res   func(fsm.Result) fsm.Result
	state func(*fsmpb.Snapshot)
	why   string
}

// runBrokenCases runs each case as a subtest, on a state and checker from
// setup.
func runBrokenCases(t *testing.T, setup func(t *testing.T) (*fsm.State, *modelChecker), cases []brokenCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, m := setup(t)
			before := snapshotBytes(t, s)
			res := s.Apply(tc.cmd)
			if tc.res != nil {
				res = tc.res(res)
			}
			if tc.state != nil {
				s = restoreBroken(t, s, tc.state)
			}
			if err := m.observe(t, tc.cmd, res, s, before); err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("observe = %v, want an error saying %q", err, tc.why)
			}
		})
	}
}
