// Helpers shared by the fsm tests: command constructors, expected results,
// a result form that compares errors by message, and snapshot encoding.
// They prove nothing on their own; the tests that use them do.
package fsm_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

const (
	excl   = fsm.Exclusive
	shared = fsm.Shared
)

func createSession(ttl time.Duration, owner string, maxSessions uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{
		TtlNs: int64(ttl), Owner: owner, MaxSessions: maxSessions,
	}}}
}

func setClusterID(id string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetClusterId{SetClusterId: &fsmpb.SetClusterID{Id: id}}}
}

func newSession() *fsmpb.Command { return createSession(10*time.Second, "test", 0) }

func closeSession(id uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{SessionId: id}}}
}

// closeSessionAs is closeSession with how the session ends.
func closeSessionAs(id uint64, end fsmpb.SessionEnd) *fsmpb.Command {
	cmd := closeSession(id)
	cmd.GetCloseSession().End = end
	return cmd
}

func expireSessions(ids ...uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{SessionIds: ids}}}
}

type acquireOpt func(*fsmpb.Acquire)

func try(a *fsmpb.Acquire) { a.Try = true }

func withDelay(d time.Duration) acquireOpt {
	return func(a *fsmpb.Acquire) { a.LockDelayNs = int64(d) }
}

// withRequest names the acquire, as a client does across its retries.
func withRequest(id uint64) acquireOpt { return func(a *fsmpb.Acquire) { a.RequestId = id } }

func maxWaiters(n uint64) acquireOpt { return func(a *fsmpb.Acquire) { a.MaxWaiters = n } }

func acquire(sess uint64, name string, mode fsm.Mode, opts ...acquireOpt) *fsmpb.Command {
	a := &fsmpb.Acquire{SessionId: sess, Lock: name, Mode: uint32(mode)}
	for _, o := range opts {
		o(a)
	}
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: a}}
}

func release(sess uint64, name string, token uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{SessionId: sess, Lock: name, Token: token}}}
}

func cancelWait(sess uint64, name string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CancelWait{CancelWait: &fsmpb.CancelWait{SessionId: sess, Lock: name}}}
}

// liftDelay lifts every delay of a lock, as older versions logged it.
func liftDelay(name string) *fsmpb.Command { return liftDelayID(name, 0) }

// liftDelayID lifts one delay of a lock.
func liftDelayID(name string, id uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_LiftDelay{LiftDelay: &fsmpb.LiftDelay{Lock: name, Id: id}}}
}

func cancelAcquire(sess uint64, name string, req, attempt uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CancelAcquire{CancelAcquire: &fsmpb.CancelAcquire{SessionId: sess, Lock: name, RequestId: req, Attempt: attempt}}}
}

func cancelWaitOf(sess uint64, name string, req, attempt uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CancelWait{CancelWait: &fsmpb.CancelWait{SessionId: sess, Lock: name, RequestId: req, Attempt: attempt}}}
}

func grant(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Grant {
	return fsm.Grant{Session: sess, Lock: name, Token: token, Mode: mode}
}

// sessionMade is the result of a CreateSession that made session id.
func sessionMade(id uint64) fsm.Result {
	return fsm.Result{Answer: fsm.CreateSessionAnswer{SessionID: id}, Effects: fsm.Effects{Created: id}}
}

// granted is the result of an Acquire that made a new grant.
func granted(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Answer: fsm.AcquireAnswer{Grant: &g}, Effects: fsm.Effects{Grants: []fsm.Grant{g}}}
}

// alreadyHeld is the result of an Acquire for a lock the session already
// holds: the grant, and no new grant made.
func alreadyHeld(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Answer: fsm.AcquireAnswer{Grant: &g}}
}

// grantedBefore is the result of a CancelWait whose wait was granted
// already: the grant, which stays.
func grantedBefore(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Answer: fsm.CancelWaitAnswer{Grant: &g}}
}

func queued() fsm.Result { return fsm.Result{Answer: fsm.AcquireAnswer{Queued: true}} }

// dequeued is the result of a CancelWait that dropped the wait and handed
// the lock to no one.
func dequeued() fsm.Result { return fsm.Result{Answer: fsm.CancelWaitAnswer{Dequeued: true}} }

func handedTo(gs ...fsm.Grant) fsm.Result { return fsm.Result{Effects: fsm.Effects{Grants: gs}} }

func fails(sentinel error) fsm.Result { return fsm.Result{Err: sentinel} }

// ended is the result of a command that ended the sessions ids, how (a
// close or an expiry), and did nothing else; withGrants, withDelays and
// withEvents add what else it did.
func ended(how fsm.End, ids ...uint64) fsm.Result {
	return fsm.Result{Effects: fsm.Effects{Ended: ids, EndedBy: how}}
}

// withGrants is r with the grants it handed on to waiters.
func withGrants(r fsm.Result, gs ...fsm.Grant) fsm.Result {
	r.Effects.Grants = gs
	return r
}

// withDelays is r with the lock-delays it started.
func withDelays(r fsm.Result, ds ...fsm.Delay) fsm.Result {
	r.Effects.Delayed = ds
	return r
}

// withEvents is r with the KV events it made.
func withEvents(r fsm.Result, evs ...fsm.KVEvent) fsm.Result {
	r.Effects.Events = evs
	return r
}

func holding(sess, token uint64, mode fsm.Mode) fsm.HolderInfo {
	return fsm.HolderInfo{Session: sess, Token: token, Mode: mode}
}

func waiting(sess uint64, mode fsm.Mode) fsm.WaiterInfo {
	return fsm.WaiterInfo{Session: sess, Mode: mode}
}

// kvArgs collects the options of a KV command.
type kvArgs struct {
	fence   fsmpb.KVFence
	maxKeys uint64
	session uint64
	user    string
}

type kvOpt func(*kvArgs)

// fenced sets the write's lock and fencing token.
func fenced(lock string, token uint64) kvOpt {
	return func(a *kvArgs) { a.fence.Lock, a.fence.Token = lock, token }
}

// strict asks for the token to be the lock's current grant.
func strict(a *kvArgs) { a.fence.Strict = true }

// expectRev makes the write a compare-and-swap on the key's mod revision.
func expectRev(rev uint64) kvOpt {
	return func(a *kvArgs) { a.fence.ExpectRevision = &rev }
}

func maxKeys(n uint64) kvOpt { return func(a *kvArgs) { a.maxKeys = n } }

// boundTo binds a put's key to a session.
func boundTo(session uint64) kvOpt { return func(a *kvArgs) { a.session = session } }

// byUser makes user the put's writer, whose kv bytes quota it is charged to.
func byUser(user string) kvOpt { return func(a *kvArgs) { a.user = user } }

func kvOpts(opts []kvOpt) *kvArgs {
	a := &kvArgs{}
	for _, o := range opts {
		o(a)
	}
	return a
}

func kvPut(key, value string, opts ...kvOpt) *fsmpb.Command {
	a := kvOpts(opts)
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte(value), Fence: &a.fence, MaxKeys: a.maxKeys, SessionId: a.session, User: a.user}}}
}

func kvDel(key string, opts ...kvOpt) *fsmpb.Command {
	a := kvOpts(opts)
	return &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: key, Fence: &a.fence}}}
}

// val is a value as the state stores it: nil when empty.
func val(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// wrote is the result of a put that made the store's revision rev and left kv.
func wrote(rev uint64, kv fsm.KeyValue) fsm.Result {
	return fsm.Result{Answer: fsm.KVAnswer{Revision: rev, Changed: true}, Effects: fsm.Effects{Events: []fsm.KVEvent{{KV: kv}}}}
}

// removed is the result of a delete that made the store's revision rev; kv
// is the key as deleted (no value; the delete's token and lock).
func removed(rev uint64, kv fsm.KeyValue) fsm.Result {
	return fsm.Result{Answer: fsm.KVAnswer{Revision: rev, Changed: true}, Effects: fsm.Effects{Events: []fsm.KVEvent{{Deleted: true, KV: kv}}}}
}

// unchanged is the result of a delete of a missing key: the store's
// revision, no event.
func unchanged(rev uint64) fsm.Result { return fsm.Result{Answer: fsm.KVAnswer{Revision: rev}} }

// comparableResult is a Result whose error is reduced to its message, so
// that two results can be compared with reflect.DeepEqual; empty slices are
// nil. The effects compared are the ones the tests state (Dropped,
// LockEvents and AuthChanged have tests of their own).
type comparableResult struct {
	Err string
	// Answer is the answer; nil for a zero one, but a Repeat, which says
	// the command was not applied again. A Batch's is its results'
	// comparable forms.
	Answer  any
	Created uint64
	Grants  []fsm.Grant
	Ended   []uint64
	EndedBy fsm.End
	Delayed []fsm.Delay
	Events  []fsm.KVEvent
}

func cmpForm(r fsm.Result) comparableResult {
	eff := r.Effects
	c := comparableResult{Answer: r.Answer, Created: eff.Created, EndedBy: eff.EndedBy}
	if r.Err != nil {
		c.Err = r.Err.Error()
	}
	if _, repeat := r.Repeat(); !repeat && r.Answer != nil && reflect.ValueOf(r.Answer).IsZero() {
		c.Answer = nil
	}
	if batch, ok := r.Answer.(fsm.BatchAnswer); ok {
		results := []comparableResult{}
		for _, sub := range batch.Results {
			results = append(results, cmpForm(sub))
		}
		c.Answer = results
	}
	if len(eff.Events) > 0 {
		c.Events = eff.Events
	}
	if len(eff.Grants) > 0 {
		c.Grants = eff.Grants
	}
	if len(eff.Ended) > 0 {
		c.Ended = eff.Ended
	}
	if len(eff.Delayed) > 0 {
		c.Delayed = eff.Delayed
	}
	return c
}

// editAnswer returns r with its answer, of type A, changed by edit: a
// result broken on purpose.
func editAnswer[A fsm.Answer](r fsm.Result, edit func(*A)) fsm.Result {
	a, _ := r.Answer.(A)
	edit(&a)
	r.Answer = a
	return r
}

// sameResult reports whether got matches want. want.Err, if set, is a
// sentinel that got.Err must wrap, and a failed result must carry nothing
// else; otherwise every field must be equal.
func sameResult(got, want fsm.Result) bool {
	if want.Err != nil {
		rest := got
		rest.Err = nil
		return errors.Is(got.Err, want.Err) && reflect.DeepEqual(cmpForm(rest), comparableResult{})
	}
	return got.Err == nil && reflect.DeepEqual(cmpForm(got), cmpForm(want))
}

// snapshotBytes encodes the state's snapshot deterministically: equal
// states give equal bytes.
func snapshotBytes(tb testing.TB, s *fsm.State) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.Snapshot())
	if err != nil {
		tb.Fatalf("marshalling snapshot: %v", err)
	}
	return b
}

// mustRestore rebuilds a state from s's snapshot and fails the test if
// Restore rejects it or the copy's snapshot differs.
func mustRestore(tb testing.TB, s *fsm.State) *fsm.State {
	tb.Helper()
	snap := s.Snapshot()
	r, err := fsm.Restore(snap)
	if err != nil {
		tb.Fatalf("Restore of a consistent snapshot: %v", err)
	}
	if !proto.Equal(r.Snapshot(), snap) {
		tb.Fatalf("restored state snapshots differently:\n got %v\nwant %v", r.Snapshot(), snap)
	}
	return r
}

// mustApply applies cmd, fails the test if the state's invariants break,
// and returns the result.
func mustApply(tb testing.TB, s *fsm.State, cmd *fsmpb.Command) fsm.Result {
	tb.Helper()
	res := s.Apply(cmd)
	if err := s.CheckInvariants(); err != nil {
		tb.Fatalf("after %v: invariant broken: %v", cmd, err)
	}
	return res
}

// describe formats a result for a failure message, with grants shown by
// value rather than by address.
func describe(r fsm.Result) string {
	c := cmpForm(r)
	out := fmt.Sprintf("{Err:%q Answer:%s Created:%d Grants:%+v Ended:%v EndedBy:%v Delayed:%v",
		c.Err, describeAnswer(r.Answer), c.Created, c.Grants, c.Ended, c.EndedBy, c.Delayed)
	if len(c.Events) > 0 {
		out += " Events:["
		for i, ev := range c.Events {
			if i > 0 {
				out += " "
			}
			out += fmt.Sprintf("{Deleted:%v KV:%s}", ev.Deleted, describeKV(ev.KV))
		}
		out += "]"
	}
	return out + "}"
}

// describeAnswer formats an answer, with its grant by value and its keys
// as describeKV does.
func describeAnswer(a fsm.Answer) string {
	grant := func(g *fsm.Grant) string {
		if g == nil {
			return "<nil>"
		}
		return fmt.Sprintf("%+v", *g)
	}
	switch a := a.(type) {
	case fsm.AcquireAnswer:
		return fmt.Sprintf("Acquire{Grant:%s Queued:%v Attempt:%d}", grant(a.Grant), a.Queued, a.Attempt)
	case fsm.CancelWaitAnswer:
		return fmt.Sprintf("CancelWait{Grant:%s Dequeued:%v}", grant(a.Grant), a.Dequeued)
	case fsm.TxnAnswer:
		out := fmt.Sprintf("Txn{Succeeded:%v Revision:%d Ops:[", a.Succeeded, a.Revision)
		for i, op := range a.Ops {
			if i > 0 {
				out += " "
			}
			out += fmt.Sprintf("{Deleted:%v Found:%v KV:%s}", op.Deleted, op.Found, describeKV(op.KV))
		}
		return out + "]}"
	case fsm.BatchAnswer:
		out := "Batch["
		for i, sub := range a.Results {
			if i > 0 {
				out += " "
			}
			out += describe(sub)
		}
		return out + "]"
	case nil:
		return "<none>"
	}
	return fmt.Sprintf("%T%+v", a, a)
}

// describeKV formats a key with its value as a string, and its session if
// it is bound to one.
func describeKV(kv fsm.KeyValue) string {
	bound := ""
	if kv.Session != 0 {
		bound = fmt.Sprintf(" Session:%d", kv.Session)
	}
	return fmt.Sprintf("{Key:%q Value:%q Token:%d Lock:%q Highest:%d Create:%d Mod:%d Version:%d%s}",
		kv.Key, kv.Value, kv.Token, kv.Lock, kv.HighestToken, kv.CreateRevision, kv.ModRevision, kv.Version, bound)
}

const sem = fsm.Semaphore

func permits(n uint32) acquireOpt { return func(a *fsmpb.Acquire) { a.Permits = n } }
