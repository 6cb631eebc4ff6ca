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

// granted is the result of an Acquire that made a new grant.
func granted(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Grant: &g, Effects: fsm.Effects{Grants: []fsm.Grant{g}}}
}

// alreadyHeld is the result of an Acquire or CancelWait for a lock the
// session already holds: the grant, and no new grant made.
func alreadyHeld(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Grant: &g}
}

func queued() fsm.Result { return fsm.Result{Queued: true} }

func handedTo(gs ...fsm.Grant) fsm.Result { return fsm.Result{Effects: fsm.Effects{Grants: gs}} }

func fails(sentinel error) fsm.Result { return fsm.Result{Err: sentinel} }

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
	return fsm.Result{Revision: rev, Effects: fsm.Effects{Events: []fsm.KVEvent{{KV: kv}}}}
}

// removed is the result of a delete that made the store's revision rev; kv
// is the key as deleted (no value; the delete's token and lock).
func removed(rev uint64, kv fsm.KeyValue) fsm.Result {
	return fsm.Result{Revision: rev, Effects: fsm.Effects{Events: []fsm.KVEvent{{Deleted: true, KV: kv}}}}
}

// unchanged is the result of a delete of a missing key: the store's
// revision, no event.
func unchanged(rev uint64) fsm.Result { return fsm.Result{Revision: rev} }

// comparableResult is a Result whose error is reduced to its message, so
// that two results can be compared with reflect.DeepEqual; empty slices are
// nil.
type comparableResult struct {
	Err       string
	SessionID uint64
	Grant     *fsm.Grant
	Queued    bool
	Attempt   uint64
	Released  bool
	Dequeued  bool
	Grants    []fsm.Grant
	Ended     []uint64
	EndedBy   fsm.End
	Delayed   []fsm.Delay
	Revision  uint64
	Events    []fsm.KVEvent
	Txn       *fsm.TxnResult
	// Batch and BatchRepeats are a Batch's results and their Repeats.
	Batch        []comparableResult
	BatchRepeats []*fsm.Repeat
}

func cmpForm(r fsm.Result) comparableResult {
	c := comparableResult{SessionID: r.SessionID, Grant: r.Grant, Queued: r.Queued, Revision: r.Revision,
		Attempt: r.Attempt, Released: r.Released, Dequeued: r.Dequeued, EndedBy: r.Effects.EndedBy, Txn: r.Txn}
	if r.Err != nil {
		c.Err = r.Err.Error()
	}
	if len(r.Effects.Events) > 0 {
		c.Events = r.Effects.Events
	}
	if len(r.Effects.Grants) > 0 {
		c.Grants = r.Effects.Grants
	}
	if len(r.Effects.Ended) > 0 {
		c.Ended = r.Effects.Ended
	}
	if len(r.Effects.Delayed) > 0 {
		c.Delayed = r.Effects.Delayed
	}
	if r.Batch != nil {
		c.Batch, c.BatchRepeats = []comparableResult{}, []*fsm.Repeat{}
		for _, sub := range r.Batch {
			c.Batch = append(c.Batch, cmpForm(sub))
			c.BatchRepeats = append(c.BatchRepeats, sub.Repeat)
		}
	}
	return c
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

// describe formats a result for a failure message, with the grant shown by
// value rather than by address.
func describe(r fsm.Result) string {
	c := cmpForm(r)
	grant := "<nil>"
	if c.Grant != nil {
		grant = fmt.Sprintf("%+v", *c.Grant)
	}
	out := fmt.Sprintf("{Err:%q SessionID:%d Grant:%s Queued:%v Grants:%+v Ended:%v EndedBy:%v Delayed:%v",
		c.Err, c.SessionID, grant, c.Queued, c.Grants, c.Ended, c.EndedBy, c.Delayed)
	if c.Revision != 0 || len(c.Events) > 0 {
		out += fmt.Sprintf(" Revision:%d Events:[", c.Revision)
		for i, ev := range c.Events {
			if i > 0 {
				out += " "
			}
			out += fmt.Sprintf("{Deleted:%v KV:%s}", ev.Deleted, describeKV(ev.KV))
		}
		out += "]"
	}
	if t := r.Txn; t != nil {
		out += fmt.Sprintf(" Txn:{Succeeded:%v Ops:[", t.Succeeded)
		for i, op := range t.Ops {
			if i > 0 {
				out += " "
			}
			out += fmt.Sprintf("{Deleted:%v Found:%v KV:%s}", op.Deleted, op.Found, describeKV(op.KV))
		}
		out += "]}"
	}
	if r.Batch != nil {
		out += " Batch:["
		for i, sub := range r.Batch {
			if i > 0 {
				out += " "
			}
			out += describe(sub)
		}
		out += "]"
	}
	return out + "}"
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
