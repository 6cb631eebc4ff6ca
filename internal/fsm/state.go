package fsm

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Mode says which holders a lock may have at once.
type Mode uint32

const (
	// Exclusive allows one holder.
	Exclusive Mode = 1
	// Shared allows any number of shared holders and no exclusive one.
	Shared Mode = 2
	// Semaphore allows as many holders as the semaphore has permits.
	Semaphore Mode = 3
)

func (m Mode) String() string { return enumName(m, "mode", modeNames) }

var modeNames = map[Mode]string{
	Exclusive: "exclusive",
	Shared:    "shared",
	Semaphore: "semaphore",
}

// compatible reports whether a grant in mode m may coexist with a holder in
// mode h, leaving aside a semaphore's number of permits.
func (m Mode) compatible(h Mode) bool { return m == h && m != Exclusive }

// Grant is a lock granted to a session, with its fencing token.
type Grant struct {
	Session uint64
	Lock    string
	Token   uint64
	Mode    Mode
}

// Delay is a lock-delay: a lock held back after a holder's session ended
// without its own close (it expired, was revoked or was abandoned).
// The leader commits a LiftDelay of its ID once Delay has passed. A lock may
// have several pending at once (the holders of a shared lock or a semaphore
// expiring one after the other); it is granted again once none is.
type Delay struct {
	Lock  string
	Delay time.Duration
	// ID names the delay among all of the state's, from one counter.
	ID uint64
}

// Result is what applying one command did: its failure, or the effects
// that every observer must learn of and the command's own answer to
// whoever proposed it.
type Result struct {
	// Err is the command's failure; a failed command changes nothing, and
	// its result has no effects and no answer.
	Err error
	// Effects are what the command changed that others must learn of.
	Effects Effects
	// Answer is the command's own answer, nil for a command that has none
	// beyond its effects. Read it with the accessor of the command
	// proposed (Acquire, KV, Repeat, ...), not by its dynamic type.
	Answer Answer
}

// Answer is a command's own answer to its proposer: CreateSessionAnswer,
// AcquireAnswer, CancelWaitAnswer, CancelAcquireAnswer, KVAnswer,
// TxnAnswer, CreateTokenAnswer or BatchAnswer, as each command's accessor
// on Result says; or Repeat, for a command whose idempotency key was
// applied before. The other commands (CloseSession, ExpireSessions,
// Release, LiftDelay, the auth commands but CreateToken, and the group's
// own commands) answer nothing: their effects say what they did.
type Answer interface{ isAnswer() }

// CreateSessionAnswer answers a CreateSession.
type CreateSessionAnswer struct {
	// SessionID is the id of the session created.
	SessionID uint64
}

// AcquireAnswer answers an Acquire: the session holds the lock (Grant) or
// waits for it (Queued).
type AcquireAnswer struct {
	// Grant is the session's grant of the lock, new or held already; nil
	// while it waits. Only a new one is also among Effects.Grants.
	Grant *Grant
	// Queued is true when the session now waits for the lock.
	Queued bool
	// Attempt numbers an Acquire that carries a request id: the wait or
	// grant it left is now this attempt's (see CancelAcquire). It is 0
	// for an Acquire without one, or of another request than the one
	// that left the session's grant or wait.
	Attempt uint64
}

// CancelWaitAnswer answers a CancelWait.
type CancelWaitAnswer struct {
	// Grant is the session's grant of the lock when the wait had already
	// been granted: the grant stays, and the caller is told of it.
	Grant *Grant
	// Dequeued is true when the wait was dropped (Effects.Dropped).
	Dequeued bool
}

// CancelAcquireAnswer answers a CancelAcquire. Both are false when the
// request left nothing to give up.
type CancelAcquireAnswer struct {
	// Released is true when the request's grant was released.
	Released bool
	// Dequeued is true when the request's wait was dropped
	// (Effects.Dropped).
	Dequeued bool
}

// KVAnswer answers a KVPut or a KVDelete.
type KVAnswer struct {
	// Revision is the KV store's revision after the write: the key's mod
	// revision when it changed the key, the store's unchanged one when a
	// delete found no key.
	Revision uint64
	// Changed is true when the write changed a key: always for a put,
	// for a delete when the key was live (its event is in Effects.Events).
	Changed bool
}

// CreateTokenAnswer answers an Auth command that created a bearer token.
type CreateTokenAnswer struct {
	// TokenID is the id of the token created.
	TokenID uint64
}

// BatchAnswer answers a Batch command: each of its commands' own result,
// effects included, in order. A batch refused as a whole fails (Err) and
// has no BatchAnswer.
type BatchAnswer struct {
	// Results are the results of the batch's commands, in order.
	Results []Result
}

func (CreateSessionAnswer) isAnswer() {}
func (AcquireAnswer) isAnswer()       {}
func (CancelWaitAnswer) isAnswer()    {}
func (CancelAcquireAnswer) isAnswer() {}
func (KVAnswer) isAnswer()            {}
func (TxnAnswer) isAnswer()           {}
func (CreateTokenAnswer) isAnswer()   {}
func (BatchAnswer) isAnswer()         {}
func (Repeat) isAnswer()              {}

// answerOf returns r's answer if it is an A, and the zero A otherwise: the
// body of every accessor of an answer.
func answerOf[A Answer](r Result) A {
	a, _ := r.Answer.(A)
	return a
}

// CreateSession returns r's answer to a CreateSession. Like every
// accessor of an answer, it returns the zero answer when r is the result
// of another command, a failure (Err) or a repeat (Repeat).
func (r Result) CreateSession() CreateSessionAnswer { return answerOf[CreateSessionAnswer](r) }

// Acquire returns r's answer to an Acquire.
func (r Result) Acquire() AcquireAnswer { return answerOf[AcquireAnswer](r) }

// CancelWait returns r's answer to a CancelWait.
func (r Result) CancelWait() CancelWaitAnswer { return answerOf[CancelWaitAnswer](r) }

// CancelAcquire returns r's answer to a CancelAcquire.
func (r Result) CancelAcquire() CancelAcquireAnswer { return answerOf[CancelAcquireAnswer](r) }

// KV returns r's answer to a KVPut or a KVDelete.
func (r Result) KV() KVAnswer { return answerOf[KVAnswer](r) }

// Txn returns r's answer to a KVTxn.
func (r Result) Txn() TxnAnswer { return answerOf[TxnAnswer](r) }

// CreateToken returns r's answer to an Auth command that created a token.
func (r Result) CreateToken() CreateTokenAnswer { return answerOf[CreateTokenAnswer](r) }

// Batch returns the results of a Batch's commands, in order; nil for the
// result of another command, or of a batch refused as a whole.
func (r Result) Batch() []Result { return answerOf[BatchAnswer](r).Results }

// Repeat returns what the first application of r's command reported, and
// true, when the command's idempotency key was applied before and the
// command was not applied again: r has then no effects and no other
// answer.
func (r Result) Repeat() (Repeat, bool) {
	a, ok := r.Answer.(Repeat)
	return a, ok
}

// Effects are what applying one command changed that the parts of a node
// other than the command's proposer must learn of, whichever command it
// was: waiting clients, session timers, lock-delay timers, watchers and
// auth checks. Every node derives the same effects from the same log; an
// Observer hears them in log order. A failed command has none.
type Effects struct {
	// Created is the id of the session the command created, 0 for none.
	Created uint64
	// Grants lists every grant the command made, hand-offs to waiters
	// included, in token order.
	Grants []Grant
	// Dropped names the wait that a CancelAcquire or CancelWait dropped:
	// whoever blocks on it will not be granted by it.
	Dropped *WaitRef
	// Ended lists the sessions the command closed or expired, and EndedBy
	// says how they ended (zero when none did).
	Ended   []uint64
	EndedBy End
	// Delayed lists the locks the command put under lock-delay.
	Delayed []Delay
	// Events lists the KV changes the command made, in revision order.
	Events []KVEvent
	// LockEvents lists the changes the command made to locks' holders,
	// queues and lock-delays, in the order it made them.
	LockEvents []LockEvent
	// AuthChanged is set when an auth command changed users, roles,
	// tokens or enforcement: open calls must be checked again.
	AuthChanged bool
}

// End is how a command ended sessions: by their own client's close,
// or otherwise. Every end but Closed puts each lock whose holder asked
// for a lock-delay under that delay: the holder did not release it, and
// may still be writing under it.
type End uint8

const (
	// Closed is a close by the session's own client (CloseSession).
	Closed End = iota + 1
	// Expired is the leader's expiry (ExpireSessions).
	Expired
	// Revoked is an operator's revoke (CloseSession, SESSION_END_REVOKED).
	Revoked
	// Abandoned is a session given up by its client, which could not
	// renew it (CloseSession, SESSION_END_ABANDONED).
	Abandoned
)

// String names the end as the console and logs say it: "closed",
// "expired", "revoked" or "abandoned".
func (e End) String() string { return enumName(e, "end", endNames) }

var endNames = map[End]string{
	Closed:    "closed",
	Expired:   "expired",
	Revoked:   "revoked",
	Abandoned: "abandoned",
}

// delays reports whether the end puts locks under their holders'
// lock-delay.
func (e End) delays() bool { return e != Closed }

// WaitRef names one session's wait for one lock.
type WaitRef struct {
	Session uint64
	Lock    string
}

// Repeat is what the first application of a command with an idempotency
// key reported, kept in the state for its retries: each of them answers
// it (Result.Repeat). See repeatOf.
type Repeat struct {
	// SessionID is the session a CreateSession made.
	SessionID uint64
	// Revision is the KV store's revision after a command that wrote to
	// it (a KV write, or a session's end that deleted its keys), or after
	// a KV command that found nothing to change.
	Revision uint64
	// Changed is true when the command changed a key.
	Changed bool
	// Succeeded is true when a KVTxn ran its then list.
	Succeeded bool
}

// MaxIdempotencyKeys is how many idempotency keys the state remembers, the
// most recent ones: a retry whose first attempt applied more than this
// many keyed commands ago is applied again.
const MaxIdempotencyKeys = 10000

// MaxIdempotencyKeyBytes bounds the length of an idempotency key.
const MaxIdempotencyKeyBytes = 64

type holder struct {
	session   uint64
	token     uint64
	mode      Mode
	lockDelay time.Duration
	req       request
}

type waiter struct {
	session   uint64
	mode      Mode
	lockDelay time.Duration
	req       request
}

// request is the client's id of the acquire that left a wait or a grant,
// and the attempt, numbered by the state, that last took it over.
type request struct {
	id      uint64
	attempt uint64
}

// matches reports whether r is the request id, at the given attempt (0:
// at any attempt).
func (r request) matches(id, attempt uint64) bool {
	return id != 0 && r.id == id && (attempt == 0 || r.attempt == attempt)
}

type lock struct {
	name    string
	holders []holder
	waiters []waiter
	// delays are the pending lock-delays, in id order; the lock is held
	// back while there is any.
	delays []Delay
	// permits is a semaphore's number of holders at once; 0 for a lock.
	// The first acquire of an idle name sets it; it goes with the name
	// once nobody holds, waits for or delays it.
	permits uint32
}

func (l *lock) holderIndex(session uint64) int {
	for i, h := range l.holders {
		if h.session == session {
			return i
		}
	}
	return -1
}

func (l *lock) waiterIndex(session uint64) int {
	for i, w := range l.waiters {
		if w.session == session {
			return i
		}
	}
	return -1
}

// grantable reports whether a request in mode m may be granted now, ahead of
// nobody: the lock is not delayed, every holder is compatible and, on a
// semaphore, a permit is free.
func (l *lock) grantable(m Mode) bool {
	if l.delayed() {
		return false
	}
	if m == Semaphore && l.full() {
		return false
	}
	for _, h := range l.holders {
		if !m.compatible(h.mode) {
			return false
		}
	}
	return true
}

// full reports whether l is a semaphore with every permit taken.
func (l *lock) full() bool {
	return l.permits > 0 && uint64(len(l.holders)) >= uint64(l.permits)
}

func (l *lock) idle() bool { return len(l.holders) == 0 && len(l.waiters) == 0 && !l.delayed() }

func (l *lock) delayed() bool { return len(l.delays) > 0 }

// longestDelay returns the longest of the pending delays, 0 for none.
func (l *lock) longestDelay() time.Duration {
	var d time.Duration
	for _, p := range l.delays {
		d = max(d, p.Delay)
	}
	return d
}

type session struct {
	id    uint64
	ttl   time.Duration
	owner string
	// user is the authenticated user who created the session ("" with
	// auth off); its quotas count the session and its locks.
	user string
	// secretHash is the SHA-256 of the session's secret; nil for a legacy
	// session, created before sessions had secrets (see AuthorizeSession).
	secretHash []byte
	// holds and waits index the locks the session appears in, keys the
	// KV keys bound to it; each is nil while empty (addName, dropName).
	holds map[string]struct{}
	waits map[string]struct{}
	keys  map[string]struct{}
	// cancelled are request ids the client gave up, oldest first, at most
	// maxCancelled: an acquire with one of them fails.
	cancelled []uint64
}

// addName adds name to the set *set, which it makes if it is nil. Most
// sessions are idle, with no lock and no key: an empty map would cost
// each of them 48 bytes a set, a third of what the state keeps of it.
func addName(set *map[string]struct{}, name string) {
	if *set == nil {
		*set = map[string]struct{}{}
	}
	(*set)[name] = struct{}{}
}

// dropName removes name from the set *set, and lets the set go once it is
// empty.
func dropName(set *map[string]struct{}, name string) {
	delete(*set, name)
	if len(*set) == 0 {
		*set = nil
	}
}

// maxCancelled bounds the request ids a session remembers as given up. An
// acquire can be overtaken by its own cancel only while a retry of it is
// on its way, so a client would have to give up this many acquires in
// that time for one to slip through.
const maxCancelled = 64

func (sess *session) wasCancelled(id uint64) bool {
	for _, c := range sess.cancelled {
		if c == id {
			return true
		}
	}
	return false
}

func (sess *session) cancel(id uint64) {
	if sess.wasCancelled(id) {
		return
	}
	if len(sess.cancelled) == maxCancelled {
		sess.cancelled = append(sess.cancelled[:0], sess.cancelled[1:]...)
	}
	sess.cancelled = append(sess.cancelled, id)
}

// State is fence's replicated state: sessions, locks and the token counter.
// It is a pure function of the commands applied to it, in order: it reads no
// clock, draws no random number, and never lets map order reach a result.
// State is not safe for concurrent use; FSM guards it.
type State struct {
	lastToken     uint64
	lastSessionID uint64
	sessions      map[uint64]*session
	locks         map[string]*lock
	kvRevision    uint64
	kv            map[string]*kvEntry // live keys and fenced tombstones
	liveKeys      int
	liveBytes     int               // names and values of the live keys
	nodes         map[string]string // node id -> API address
	rejoins       map[string]string // member id -> raft address, of the members being added again
	lastDelayID   uint64
	lastAttempt   uint64
	clusterID     string // empty until the group's first leader names it
	protocol      uint32 // the group's protocol; 0 for Protocol1
	// applied remembers what commands with idempotency keys did, and
	// appliedKeys their keys, oldest first, at most MaxIdempotencyKeys.
	applied     map[string]Repeat
	appliedKeys []string
	auth        authState
	// usage counts, per user, what the user's sessions and writes use,
	// for the user's quotas: derived state, rebuilt on Restore (quota.go).
	usage map[string]*Usage
	// lockEvents gathers the lock events of the command being applied,
	// for its Result: not state, empty between commands.
	lockEvents []LockEvent
}

// NewState returns an empty state: no sessions, no locks, token counter 0.
func NewState() *State {
	return &State{sessions: map[uint64]*session{}, locks: map[string]*lock{}, kv: map[string]*kvEntry{}, nodes: map[string]string{}, rejoins: map[string]string{}, applied: map[string]Repeat{}, auth: newAuthState(), usage: map[string]*Usage{}}
}

// Apply applies one command and reports what it did. It never panics on a
// well-formed protobuf message, whatever its field values. A command whose
// idempotency key was applied before is not applied again: its Result
// answers Repeat and has no effects. A failed command changes nothing, and
// its key is not kept.
func (s *State) Apply(cmd *fsmpb.Command) Result {
	if b, ok := cmd.GetOp().(*fsmpb.Command_Batch); ok {
		return s.applyBatch(cmd, b.Batch.GetCommands())
	}
	key := cmd.GetIdempotencyKey()
	if key == "" {
		return s.apply(cmd)
	}
	if len(key) > MaxIdempotencyKeyBytes {
		return Result{Err: fmt.Errorf("%w: idempotency key of %d bytes is over the limit of %d", fence.ErrInvalidArgument, len(key), MaxIdempotencyKeyBytes)}
	}
	if r, ok := s.applied[key]; ok {
		return Result{Answer: r}
	}
	res := s.apply(cmd)
	if res.Err == nil {
		s.remember(key, repeatOf(res))
	}
	return res
}

// repeatOf is what the retries of a command that applied as res are
// answered. Revision is the KV store's after the command, for a command
// that wrote to it or a KV command that found nothing to change: a
// session's end deletes its keys each at a revision of its own, the last
// event's being the store's.
func repeatOf(res Result) Repeat {
	r := Repeat{SessionID: res.CreateSession().SessionID, Changed: len(res.Effects.Events) > 0}
	if n := len(res.Effects.Events); n > 0 {
		r.Revision = res.Effects.Events[n-1].KV.ModRevision
	}
	switch a := res.Answer.(type) {
	case KVAnswer:
		r.Revision = a.Revision
	case TxnAnswer:
		r.Revision, r.Succeeded = a.Revision, a.Succeeded
	}
	return r
}

// MaxBatchCommands bounds the commands of one Batch; a larger one is
// refused as a whole. Seq numbers a batch's commands within its entry.
const MaxBatchCommands = 1 << seqBatchBits

// applyBatch applies a batch's commands in order, each as Apply would
// apply it alone. A batch that carries an idempotency key, or holds too
// many commands, is refused whole and changes nothing; a batch inside a
// batch fails alone.
func (s *State) applyBatch(cmd *fsmpb.Command, cmds []*fsmpb.Command) Result {
	if cmd.GetIdempotencyKey() != "" {
		return Result{Err: fmt.Errorf("%w: a batch has no idempotency key of its own; its commands carry theirs", fence.ErrInvalidArgument)}
	}
	if len(cmds) > MaxBatchCommands {
		return Result{Err: fmt.Errorf("%w: a batch of %d commands is over the limit of %d", fence.ErrInvalidArgument, len(cmds), MaxBatchCommands)}
	}
	out := make([]Result, len(cmds))
	for i, c := range cmds {
		if _, nested := c.GetOp().(*fsmpb.Command_Batch); nested {
			out[i] = Result{Err: fmt.Errorf("%w: a batch inside a batch", fence.ErrInvalidArgument)}
			continue
		}
		out[i] = s.Apply(c)
	}
	return Result{Answer: BatchAnswer{Results: out}}
}

// remember keeps what a keyed command did, forgetting the oldest key
// beyond MaxIdempotencyKeys.
func (s *State) remember(key string, r Repeat) {
	if len(s.appliedKeys) >= MaxIdempotencyKeys {
		delete(s.applied, s.appliedKeys[0])
		s.appliedKeys = s.appliedKeys[1:]
	}
	s.applied[key] = r
	s.appliedKeys = append(s.appliedKeys, key)
}

// apply applies one command that is not a Batch, and lists the lock
// events it caused (none for a command that failed: it changed nothing).
func (s *State) apply(cmd *fsmpb.Command) Result {
	s.lockEvents = nil
	res := s.applyOp(cmd)
	if res.Err == nil {
		res.Effects.LockEvents = s.lockEvents
	}
	s.lockEvents = nil
	return res
}

func (s *State) applyOp(cmd *fsmpb.Command) Result {
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_CreateSession:
		return s.createSession(op.CreateSession)
	case *fsmpb.Command_CloseSession:
		return s.closeSession(op.CloseSession)
	case *fsmpb.Command_ExpireSessions:
		return s.endSessions(op.ExpireSessions.GetSessionIds(), Expired)
	case *fsmpb.Command_Acquire:
		return s.acquire(op.Acquire)
	case *fsmpb.Command_CancelWait:
		return s.cancelWait(op.CancelWait)
	case *fsmpb.Command_CancelAcquire:
		return s.cancelAcquire(op.CancelAcquire)
	case *fsmpb.Command_Release:
		return s.release(op.Release)
	case *fsmpb.Command_LiftDelay:
		return s.liftDelay(op.LiftDelay.GetLock(), op.LiftDelay.GetId())
	case *fsmpb.Command_KvPut:
		return s.kvPut(op.KvPut)
	case *fsmpb.Command_KvDelete:
		return s.kvDelete(op.KvDelete)
	case *fsmpb.Command_KvTxn:
		return s.kvTxn(op.KvTxn)
	case *fsmpb.Command_RegisterNode:
		return s.registerNode(op.RegisterNode)
	case *fsmpb.Command_RejoinMember:
		return s.rejoinMember(op.RejoinMember)
	case *fsmpb.Command_RaiseTokens:
		s.lastToken = max(s.lastToken, op.RaiseTokens.GetFloor())
		return Result{}
	case *fsmpb.Command_SetClusterId:
		return s.setClusterID(op.SetClusterId.GetId())
	case *fsmpb.Command_Auth:
		return s.applyAuth(op.Auth)
	case *fsmpb.Command_SetProtocol:
		return s.setProtocol(op.SetProtocol.GetVersion())
	}
	return Result{Err: fmt.Errorf("%w: unknown command", fence.ErrInvalidArgument)}
}

func (s *State) createSession(c *fsmpb.CreateSession) Result {
	if max := c.GetMaxSessions(); max > 0 && uint64(len(s.sessions)) >= max {
		return Result{Err: fmt.Errorf("%w: the server already has %d sessions, its limit; close unused sessions or raise --max-sessions", fence.ErrLimit, len(s.sessions))}
	}
	hash := c.GetSecretSha256()
	if len(hash) != 0 && len(hash) != SecretHashBytes {
		return Result{Err: fmt.Errorf("%w: a session secret's hash has %d bytes, not %d", fence.ErrInvalidArgument, len(hash), SecretHashBytes)}
	}
	if err := s.checkSessionQuota(c.GetUser()); err != nil {
		return Result{Err: err}
	}
	s.lastSessionID++
	id := s.lastSessionID
	s.sessions[id] = &session{
		id:         id,
		ttl:        time.Duration(c.GetTtlNs()),
		owner:      c.GetOwner(),
		user:       c.GetUser(),
		secretHash: nilIfEmpty(hash),
	}
	s.countSession(s.sessions[id], 1)
	return Result{Answer: CreateSessionAnswer{SessionID: id}, Effects: Effects{Created: id}}
}

func (s *State) session(id uint64) (*session, error) {
	sess, ok := s.sessions[id]
	if !ok {
		return nil, fmt.Errorf("%w: session %d does not exist or has expired; create a new session", fence.ErrSessionNotFound, id)
	}
	return sess, nil
}

func (s *State) acquire(c *fsmpb.Acquire) Result {
	sess, err := s.session(c.GetSessionId())
	if err != nil {
		return Result{Err: err}
	}
	mode := Mode(c.GetMode())
	if mode != Exclusive && mode != Shared && mode != Semaphore {
		return Result{Err: fmt.Errorf("%w: unknown lock mode %d", fence.ErrInvalidArgument, c.GetMode())}
	}
	permits := c.GetPermits()
	if (mode == Semaphore) != (permits > 0) {
		return Result{Err: fmt.Errorf("%w: a semaphore needs a number of permits, and only a semaphore has one (mode %s, %d permits)", fence.ErrInvalidArgument, mode, permits)}
	}
	name := c.GetLock()
	reqID := c.GetRequestId()
	if reqID != 0 && sess.wasCancelled(reqID) {
		return Result{Err: fmt.Errorf("%w: acquire %d of lock %q by session %d was cancelled", fence.ErrCancelled, reqID, name, sess.id)}
	}
	l := s.locks[name]
	if l == nil {
		l = &lock{name: name, permits: permits}
	}
	if err := l.sameKind(permits); err != nil {
		return Result{Err: err}
	}
	if res, ok := s.acquireAgain(l, sess, mode, reqID); ok {
		return res
	}
	w := waiter{session: sess.id, mode: mode, lockDelay: time.Duration(c.GetLockDelayNs())}
	grantNow := len(l.waiters) == 0 && l.grantable(mode)
	if !grantNow && c.GetTry() {
		return Result{Err: s.lockedError(l)}
	}
	if max := c.GetMaxWaiters(); !grantNow && max > 0 && uint64(len(l.waiters)) >= max {
		return Result{Err: fmt.Errorf("%w: lock %q already has %d waiters, its limit", fence.ErrLimit, name, len(l.waiters))}
	}
	if err := s.checkLockLimits(sess, name, c); err != nil {
		return Result{Err: err}
	}
	if err := s.checkLockQuota(sess, !grantNow); err != nil {
		return Result{Err: err}
	}
	// Only an acquire that grants or queues numbers an attempt: a failed
	// command changes nothing.
	if reqID != 0 {
		s.lastAttempt++
		w.req = request{id: reqID, attempt: s.lastAttempt}
	}
	if grantNow {
		s.locks[name] = l
		g := s.grant(l, w)
		return Result{Answer: AcquireAnswer{Grant: &g, Attempt: w.req.attempt}, Effects: Effects{Grants: []Grant{g}}}
	}
	s.locks[name] = l
	l.waiters = append(l.waiters, w)
	s.addWait(sess, name)
	s.emit(LockEvent{Kind: LockQueued, Lock: name, Session: sess.id, Owner: sess.owner, Mode: mode, Permits: l.permits})
	return Result{Answer: AcquireAnswer{Queued: true, Attempt: w.req.attempt}}
}

// acquireAgain answers an acquire by a session that already holds or
// waits for l: a retry of the request that left the grant or the wait
// takes it over, under a new attempt number; another request is told of
// it, but the grant or wait stays its first request's to give up. It
// reports false when the session neither holds nor waits for l.
func (s *State) acquireAgain(l *lock, sess *session, mode Mode, reqID uint64) (Result, bool) {
	// takeOver returns the attempt that took r over, 0 for none.
	takeOver := func(r *request) uint64 {
		if reqID == 0 || r.id != reqID {
			return 0
		}
		s.lastAttempt++
		r.attempt = s.lastAttempt
		return r.attempt
	}
	if i := l.holderIndex(sess.id); i >= 0 {
		h := &l.holders[i]
		if h.mode != mode {
			return Result{Err: fmt.Errorf("%w: session %d holds lock %q in %s mode, not %s; release it first", fence.ErrInvalidArgument, sess.id, l.name, h.mode, mode)}, true
		}
		g := Grant{Session: sess.id, Lock: l.name, Token: h.token, Mode: h.mode}
		return Result{Answer: AcquireAnswer{Grant: &g, Attempt: takeOver(&h.req)}}, true
	}
	if i := l.waiterIndex(sess.id); i >= 0 {
		w := &l.waiters[i]
		if w.mode != mode {
			return Result{Err: fmt.Errorf("%w: session %d already waits for lock %q in %s mode", fence.ErrInvalidArgument, sess.id, l.name, w.mode)}, true
		}
		return Result{Answer: AcquireAnswer{Queued: true, Attempt: takeOver(&w.req)}}, true
	}
	return Result{}, false
}

// checkLockLimits refuses an acquire that would make a session hold or
// wait for more locks than the command allows, or add a lock name beyond
// the limit on all locks. The session is neither holder nor waiter of name.
func (s *State) checkLockLimits(sess *session, name string, c *fsmpb.Acquire) error {
	if max := c.GetMaxSessionLocks(); max > 0 && uint64(len(sess.holds)+len(sess.waits)) >= max {
		return fmt.Errorf("%w: session %d already holds or waits for %d locks, its limit", fence.ErrLimit, sess.id, len(sess.holds)+len(sess.waits))
	}
	if max := c.GetMaxLocks(); max > 0 && s.locks[name] == nil && uint64(len(s.locks)) >= max {
		return fmt.Errorf("%w: there are %d locks, the limit; lock %q would be one more", fence.ErrLimit, len(s.locks), name)
	}
	return nil
}

// sameKind refuses to take a semaphore as a lock, a lock as a semaphore,
// or a semaphore with another number of permits than it has.
func (l *lock) sameKind(permits uint32) error {
	switch {
	case l.permits == permits:
		return nil
	case l.permits == 0:
		return fmt.Errorf("%w: %q is in use as a lock, not a semaphore", fence.ErrInvalidArgument, l.name)
	case permits == 0:
		return fmt.Errorf("%w: %q is in use as a semaphore of %d permits, not a lock", fence.ErrInvalidArgument, l.name, l.permits)
	}
	return fmt.Errorf("%w: semaphore %q has %d permits, not %d; every holder must name the same number", fence.ErrInvalidArgument, l.name, l.permits, permits)
}

// lockedError says why l cannot be taken at once, naming its newest
// holder, if any.
func (s *State) lockedError(l *lock) error {
	e := &fence.LockedError{Lock: l.name}
	if len(l.holders) > 0 {
		h := l.holders[len(l.holders)-1]
		e.HolderSession, e.HolderToken = h.session, h.token
	}
	switch {
	case l.delayed():
		e.Reason = fmt.Sprintf("lock %q is under lock-delay after its holder's session ended without releasing it", l.name)
	case l.full():
		e.Reason = fmt.Sprintf("semaphore %q has all %d permits taken", l.name, l.permits)
	case len(l.holders) > 0:
		e.Reason = fmt.Sprintf("lock %q is held by session %d with token %d", l.name, e.HolderSession, e.HolderToken)
	default:
		e.Reason = fmt.Sprintf("lock %q has %d waiters ahead", l.name, len(l.waiters))
	}
	return e
}

// grant makes w a holder of l with the next token.
func (s *State) grant(l *lock, w waiter) Grant {
	s.lastToken++
	l.holders = append(l.holders, holder{session: w.session, token: s.lastToken, mode: w.mode, lockDelay: w.lockDelay, req: w.req})
	s.addHold(s.sessions[w.session], l.name)
	g := Grant{Session: w.session, Lock: l.name, Token: s.lastToken, Mode: w.mode}
	s.emitGranted(l, g)
	return g
}

// grantWaiters grants l to the waiters at the head of its queue for as long
// as they are compatible with the holders: one exclusive waiter, or a run of
// shared ones. FIFO is kept: a waiter is never granted ahead of an earlier one.
func (s *State) grantWaiters(l *lock) []Grant {
	var grants []Grant
	for len(l.waiters) > 0 && l.grantable(l.waiters[0].mode) {
		w := l.waiters[0]
		l.waiters = l.waiters[1:]
		s.dropWait(s.sessions[w.session], l.name)
		grants = append(grants, s.grant(l, w))
	}
	if len(l.waiters) == 0 {
		l.waiters = nil
	}
	return grants
}

// forget drops l from the state once nobody holds, waits for or delays it,
// so that the state stays bounded under churn of lock names.
func (s *State) forget(l *lock) {
	if l.idle() {
		delete(s.locks, l.name)
	}
}

func (s *State) release(c *fsmpb.Release) Result {
	sess, err := s.session(c.GetSessionId())
	if err != nil {
		return Result{Err: err}
	}
	name := c.GetLock()
	l := s.locks[name]
	i := -1
	if l != nil {
		i = l.holderIndex(sess.id)
	}
	if i < 0 {
		return Result{Err: fmt.Errorf("%w: session %d does not hold lock %q", fence.ErrNotHolder, sess.id, name)}
	}
	if h := l.holders[i]; h.token != c.GetToken() {
		return Result{Err: fmt.Errorf("%w: session %d holds lock %q with token %d, not %d", fence.ErrNotHolder, sess.id, name, h.token, c.GetToken())}
	}
	return Result{Effects: Effects{Grants: s.releaseAt(sess, l, i)}}
}

// releaseAt removes the session's grant at index i of l's holders and hands
// the lock on.
func (s *State) releaseAt(sess *session, l *lock, i int) []Grant {
	s.emitHolderEnd(l, l.holders[i], 0)
	l.holders = append(l.holders[:i], l.holders[i+1:]...)
	s.dropHold(sess, l.name)
	grants := s.grantWaiters(l)
	s.forget(l)
	return grants
}

func (s *State) cancelWait(c *fsmpb.CancelWait) Result {
	sess, err := s.session(c.GetSessionId())
	if err != nil {
		return Result{Err: err}
	}
	l := s.locks[c.GetLock()]
	if l == nil {
		return Result{Answer: CancelWaitAnswer{}}
	}
	reqID, attempt := c.GetRequestId(), c.GetAttempt()
	if i := l.holderIndex(sess.id); i >= 0 {
		h := l.holders[i]
		if reqID != 0 && !h.req.matches(reqID, attempt) {
			return Result{Answer: CancelWaitAnswer{}}
		}
		return Result{Answer: CancelWaitAnswer{Grant: &Grant{Session: sess.id, Lock: l.name, Token: h.token, Mode: h.mode}}}
	}
	i := l.waiterIndex(sess.id)
	if i < 0 || (reqID != 0 && !l.waiters[i].req.matches(reqID, attempt)) {
		return Result{Answer: CancelWaitAnswer{}}
	}
	why := GaveUpCancelled
	if c.GetTimedOut() {
		why = GaveUpTimedOut
	}
	return Result{Effects: s.dropWaiter(sess, l, i, why), Answer: CancelWaitAnswer{Dequeued: true}}
}

// dropWaiter removes the session's wait at index i of l's queue, which it
// gave up for why, hands the lock to the waiters it may have blocked, and
// returns the effects.
func (s *State) dropWaiter(sess *session, l *lock, i int, why GiveUp) Effects {
	s.emitWaiterEnd(l, l.waiters[i], why, 0)
	l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
	s.dropWait(sess, l.name)
	eff := Effects{Grants: s.grantWaiters(l), Dropped: &WaitRef{Session: sess.id, Lock: l.name}}
	s.forget(l)
	return eff
}

// cancelAcquire gives up an acquire by request id: it drops the request's
// wait or releases its grant. With attempt 0 the client gives up the whole
// request, and the id is remembered so that a retry still on its way fails;
// with an attempt, it acts only if no later attempt took the request over.
func (s *State) cancelAcquire(c *fsmpb.CancelAcquire) Result {
	sess, err := s.session(c.GetSessionId())
	if err != nil {
		return Result{Err: err}
	}
	reqID, attempt := c.GetRequestId(), c.GetAttempt()
	if reqID == 0 {
		return Result{Err: fmt.Errorf("%w: request id is missing; name the acquire to cancel", fence.ErrInvalidArgument)}
	}
	if attempt == 0 {
		sess.cancel(reqID)
	}
	l := s.locks[c.GetLock()]
	if l == nil {
		return Result{Answer: CancelAcquireAnswer{}}
	}
	if i := l.holderIndex(sess.id); i >= 0 && l.holders[i].req.matches(reqID, attempt) {
		return Result{Answer: CancelAcquireAnswer{Released: true}, Effects: Effects{Grants: s.releaseAt(sess, l, i)}}
	}
	if i := l.waiterIndex(sess.id); i >= 0 && l.waiters[i].req.matches(reqID, attempt) {
		return Result{Answer: CancelAcquireAnswer{Dequeued: true}, Effects: s.dropWaiter(sess, l, i, GaveUpCancelled)}
	}
	return Result{Answer: CancelAcquireAnswer{}}
}

// closeSession ends one session as its command says: closed by its
// client, revoked or abandoned. An end this version does not know fails
// and changes nothing.
func (s *State) closeSession(c *fsmpb.CloseSession) Result {
	var how End
	switch c.GetEnd() {
	case fsmpb.SessionEnd_SESSION_END_CLOSED:
		how = Closed
	case fsmpb.SessionEnd_SESSION_END_REVOKED:
		how = Revoked
	case fsmpb.SessionEnd_SESSION_END_ABANDONED:
		how = Abandoned
	default:
		return Result{Err: fmt.Errorf("%w: CloseSession of session %d with an unknown end (%d)", fence.ErrInvalidArgument, c.GetSessionId(), int32(c.GetEnd()))}
	}
	return s.endSessions([]uint64{c.GetSessionId()}, how)
}

// endSessions ends sessions as how says: each releases everything it
// holds, drops its waits and deletes the KV keys bound to it, in key order,
// each at a revision of its own. Every end but the session's own close
// puts a lock whose holder asked for a lock-delay under that delay. Unknown
// ids are skipped: the session may have been closed while the leader
// decided.
func (s *State) endSessions(ids []uint64, how End) Result {
	var eff Effects
	touched := map[string]struct{}{}
	for _, id := range ids {
		sess, ok := s.sessions[id]
		if !ok {
			continue
		}
		for _, name := range sortedKeys(sess.waits) {
			l := s.locks[name]
			i := l.waiterIndex(id)
			s.emitWaiterEnd(l, l.waiters[i], GaveUpSessionEnded, how)
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
		}
		for _, name := range sortedKeys(sess.holds) {
			l := s.locks[name]
			i := l.holderIndex(id)
			h := l.holders[i]
			s.emitHolderEnd(l, h, how)
			l.holders = append(l.holders[:i], l.holders[i+1:]...)
			if how.delays() && h.lockDelay > 0 {
				// Each end's delay holds in full, whatever other
				// delays the lock is under.
				s.lastDelayID++
				d := Delay{Lock: name, Delay: h.lockDelay, ID: s.lastDelayID}
				l.delays = append(l.delays, d)
				eff.Delayed = append(eff.Delayed, d)
				s.emit(LockEvent{Kind: LockDelayStarted, Lock: name, Session: id, Owner: sess.owner, Token: h.token, Mode: h.mode, Permits: l.permits, End: how, Delay: d.Delay, DelayID: d.ID})
			}
		}
		for _, key := range sortedKeys(sess.keys) {
			eff.Events = append(eff.Events, s.removeKey(s.kv[key], nil))
		}
		delete(s.sessions, id)
		s.countSession(sess, -1)
		eff.Ended, eff.EndedBy = append(eff.Ended, id), how
		for name := range union(sess.holds, sess.waits) {
			touched[name] = struct{}{}
		}
	}
	// Hand the locks on only once every session this command ends is gone
	// entirely, so that none of them goes to one of those sessions: a
	// waiter whose session expires is never granted.
	for _, name := range sortedKeys(touched) {
		l := s.locks[name]
		eff.Grants = append(eff.Grants, s.grantWaiters(l)...)
		s.forget(l)
	}
	return Result{Effects: eff}
}

// liftDelay ends the lock's delay id (every delay for id 0, as older
// versions logged it) and grants the lock once no delay is pending.
func (s *State) liftDelay(name string, id uint64) Result {
	l := s.locks[name]
	if l == nil || !l.delayed() {
		return Result{}
	}
	if id == 0 {
		for _, d := range l.delays {
			s.emit(LockEvent{Kind: LockDelayEnded, Lock: name, Permits: l.permits, DelayID: d.ID})
		}
		l.delays = nil
	} else {
		i := slices.IndexFunc(l.delays, func(d Delay) bool { return d.ID == id })
		if i < 0 {
			return Result{}
		}
		s.emit(LockEvent{Kind: LockDelayEnded, Lock: name, Permits: l.permits, DelayID: id})
		l.delays = slices.Delete(l.delays, i, i+1)
		if l.delayed() {
			return Result{}
		}
		l.delays = nil
	}
	grants := s.grantWaiters(l)
	s.forget(l)
	return Result{Effects: Effects{Grants: grants}}
}

// sortedKeys returns m's keys in order: the state walks its maps in that
// order wherever the order shows (answers, effects, snapshots), so that
// every replica does the same.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func union(a, b map[string]struct{}) map[string]struct{} {
	u := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		u[k] = struct{}{}
	}
	for k := range b {
		u[k] = struct{}{}
	}
	return u
}

// SessionInfo describes a session. It never carries the session's secret
// or its hash.
type SessionInfo struct {
	ID    uint64
	TTL   time.Duration
	Owner string
	// Legacy is set for a session created before sessions had secrets,
	// which is acted on by its id alone (see AuthorizeSession).
	Legacy bool
}

// HolderInfo describes a holder of a lock.
type HolderInfo struct {
	Session uint64
	Token   uint64
	Mode    Mode
}

// WaiterInfo describes a waiter for a lock.
type WaiterInfo struct {
	Session uint64
	Mode    Mode
}

// LockInfo describes a lock: holders in grant order, waiters in queue order.
type LockInfo struct {
	Name    string
	Holders []HolderInfo
	Waiters []WaiterInfo
	// Delay is the longest of the pending lock-delays, non-zero while the
	// lock is held back; Delays lists them, in id order.
	Delay  time.Duration
	Delays []Delay
	// Permits is a semaphore's number of permits; 0 for a lock.
	Permits uint32
}

// LastToken returns the last fencing token issued, 0 before the first grant.
func (s *State) LastToken() uint64 { return s.lastToken }

// ClusterID returns the group's id; empty until its first leader names it.
func (s *State) ClusterID() string { return s.clusterID }

// MaxClusterIDLen bounds a cluster id.
const MaxClusterIDLen = 64

// setClusterID names the group. The first name stays: a later one, from a
// leader that read the state before the first was applied, changes nothing.
func (s *State) setClusterID(id string) Result {
	if id == "" || len(id) > MaxClusterIDLen {
		return Result{Err: fmt.Errorf("%w: a cluster id is 1 to %d bytes", fence.ErrInvalidArgument, MaxClusterIDLen)}
	}
	if s.clusterID == "" {
		s.clusterID = id
	}
	return Result{}
}

// setProtocol moves the group to protocol v; a protocol never goes back,
// so an older one changes nothing. One newer than this node's was refused
// before it reached the state (FSM.ApplyBatch).
func (s *State) setProtocol(v uint32) Result {
	if v > Protocol {
		return Result{Err: fmt.Errorf("%w: protocol %d is newer than this node's %d", fence.ErrInvalidArgument, v, Protocol)}
	}
	s.protocol = max(s.protocol, v)
	return Result{}
}

// Protocol returns the group's protocol (see Protocol1).
func (s *State) Protocol() uint32 { return max(s.protocol, Protocol1) }

// Repeated returns what the command applied with idempotency key key
// reported, while the state keeps it (the newest MaxIdempotencyKeys keys).
func (s *State) Repeated(key string) (Repeat, bool) {
	r, ok := s.applied[key]
	return r, ok
}

// Session returns the session with the given id.
func (s *State) Session(id uint64) (SessionInfo, bool) {
	sess, ok := s.sessions[id]
	if !ok {
		return SessionInfo{}, false
	}
	return sess.info(), true
}

// RequestState says what the acquire request id of session left on lock:
// a wait (waiting), a grant (grant non-nil), or nothing; attempt is the
// attempt that last took it over.
func (s *State) RequestState(session uint64, lock string, id uint64) (attempt uint64, waiting bool, grant *Grant) {
	l := s.locks[lock]
	if l == nil || id == 0 {
		return 0, false, nil
	}
	for _, h := range l.holders {
		if h.session == session && h.req.id == id {
			return h.req.attempt, false, &Grant{Session: session, Lock: lock, Token: h.token, Mode: h.mode}
		}
	}
	for _, w := range l.waiters {
		if w.session == session && w.req.id == id {
			return w.req.attempt, true, nil
		}
	}
	return 0, false, nil
}

// held yields the lock name and the holder entry of each grant session id
// holds, in no order; nothing if it holds none or does not exist.
func (s *State) held(id uint64) iter.Seq2[string, holder] {
	return func(yield func(string, holder) bool) {
		sess, ok := s.sessions[id]
		if !ok {
			return
		}
		for name := range sess.holds {
			l := s.locks[name]
			if i := l.holderIndex(id); i >= 0 && !yield(name, l.holders[i]) {
				return
			}
		}
	}
}

// HeldTokens returns the tokens of the grants session id holds, in order;
// nil if it holds none or does not exist.
func (s *State) HeldTokens(id uint64) []uint64 {
	var tokens []uint64
	for _, h := range s.held(id) {
		tokens = append(tokens, h.token)
	}
	slices.Sort(tokens)
	return tokens
}

// SessionGrant is a grant a session holds.
type SessionGrant struct {
	Lock  string
	Token uint64
	Mode  Mode
}

// HeldGrants returns the grants session id holds, by lock name; nil if it
// holds none or does not exist.
func (s *State) HeldGrants(id uint64) []SessionGrant {
	var out []SessionGrant
	for name, h := range s.held(id) {
		out = append(out, SessionGrant{Lock: name, Token: h.token, Mode: h.mode})
	}
	slices.SortFunc(out, func(a, b SessionGrant) int { return strings.Compare(a.Lock, b.Lock) })
	return out
}

// Sessions returns every session, in id order.
func (s *State) Sessions() []SessionInfo {
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, sess.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// NumSessions returns the number of sessions.
func (s *State) NumSessions() int { return len(s.sessions) }

// NumLocks returns the number of locks held, waited for or delayed.
func (s *State) NumLocks() int { return len(s.locks) }

// EachQueue calls visit with the number of waiters of every lock, in no
// particular order, for a distribution of queue lengths.
func (s *State) EachQueue(visit func(waiters int)) {
	for _, l := range s.locks {
		visit(len(l.waiters))
	}
}

// TryRefusal returns the error with which an exclusive Acquire with try
// of lock name, by a session that neither holds nor waits for it, would
// fail in this state: ErrLocked (a *fence.LockedError naming the holder)
// when the lock is held, delayed or waited for, ErrInvalidArgument when
// the name is a semaphore's. nil when such an acquire would be granted,
// limits and quotas aside. It changes nothing: the edge reads it to refuse
// a Lease of a held lock before it creates the lease's session.
func (s *State) TryRefusal(name string) error {
	l := s.locks[name]
	if l == nil {
		return nil
	}
	if err := l.sameKind(0); err != nil {
		return err
	}
	if len(l.waiters) > 0 || !l.grantable(Exclusive) {
		return s.lockedError(l)
	}
	return nil
}

// Lock returns the named lock; ok is false when it is free and unwaited.
func (s *State) Lock(name string) (LockInfo, bool) {
	l, ok := s.locks[name]
	if !ok {
		return LockInfo{Name: name}, false
	}
	return lockInfo(l), true
}

// Locks returns the locks whose names start with prefix, in name order.
func (s *State) Locks(prefix string) []LockInfo {
	out, _ := s.LocksPage(prefix, "", 0)
	return out
}

// LocksPage returns, in name order, at most limit (0: all) locks whose
// names start with prefix and sort after after, and whether more follow.
func (s *State) LocksPage(prefix, after string, limit int) ([]LockInfo, bool) {
	var names []string
	for name := range s.locks {
		if strings.HasPrefix(name, prefix) && name > after {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	more := limit > 0 && len(names) > limit
	if more {
		names = names[:limit]
	}
	var out []LockInfo
	for _, name := range names {
		out = append(out, lockInfo(s.locks[name]))
	}
	return out, more
}

// DelayedLocks returns the pending lock-delays, by lock name, then id.
func (s *State) DelayedLocks() []Delay {
	var out []Delay
	for _, l := range s.locks {
		out = append(out, l.delays...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Lock != out[j].Lock {
			return out[i].Lock < out[j].Lock
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func lockInfo(l *lock) LockInfo {
	info := LockInfo{Name: l.name, Delay: l.longestDelay(), Delays: slices.Clone(l.delays), Permits: l.permits}
	for _, h := range l.holders {
		info.Holders = append(info.Holders, HolderInfo{Session: h.session, Token: h.token, Mode: h.mode})
	}
	for _, w := range l.waiters {
		info.Waiters = append(info.Waiters, WaiterInfo{Session: w.session, Mode: w.mode})
	}
	return info
}
