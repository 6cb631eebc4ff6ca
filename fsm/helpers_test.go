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

	"github.com/fencelock/fence/fsm"
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

func newSession() *fsmpb.Command { return createSession(10*time.Second, "test", 0) }

func closeSession(id uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{SessionId: id}}}
}

func expireSessions(ids ...uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{SessionIds: ids}}}
}

type acquireOpt func(*fsmpb.Acquire)

func try(a *fsmpb.Acquire) { a.Try = true }

func withDelay(d time.Duration) acquireOpt {
	return func(a *fsmpb.Acquire) { a.LockDelayNs = int64(d) }
}

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

func liftDelay(name string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_LiftDelay{LiftDelay: &fsmpb.LiftDelay{Lock: name}}}
}

func grant(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Grant {
	return fsm.Grant{Session: sess, Lock: name, Token: token, Mode: mode}
}

// granted is the result of an Acquire that made a new grant.
func granted(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Grant: &g, Grants: []fsm.Grant{g}}
}

// alreadyHeld is the result of an Acquire or CancelWait for a lock the
// session already holds: the grant, and no new grant made.
func alreadyHeld(sess uint64, name string, token uint64, mode fsm.Mode) fsm.Result {
	g := grant(sess, name, token, mode)
	return fsm.Result{Grant: &g}
}

func queued() fsm.Result { return fsm.Result{Queued: true} }

func handedTo(gs ...fsm.Grant) fsm.Result { return fsm.Result{Grants: gs} }

func fails(sentinel error) fsm.Result { return fsm.Result{Err: sentinel} }

func holding(sess, token uint64, mode fsm.Mode) fsm.HolderInfo {
	return fsm.HolderInfo{Session: sess, Token: token, Mode: mode}
}

func waiting(sess uint64, mode fsm.Mode) fsm.WaiterInfo {
	return fsm.WaiterInfo{Session: sess, Mode: mode}
}

// comparableResult is a Result whose error is reduced to its message, so
// that two results can be compared with reflect.DeepEqual; empty slices are
// nil.
type comparableResult struct {
	Err       string
	SessionID uint64
	Grant     *fsm.Grant
	Queued    bool
	Grants    []fsm.Grant
	Ended     []uint64
	Delayed   []fsm.Delay
}

func cmpForm(r fsm.Result) comparableResult {
	c := comparableResult{SessionID: r.SessionID, Grant: r.Grant, Queued: r.Queued}
	if r.Err != nil {
		c.Err = r.Err.Error()
	}
	if len(r.Grants) > 0 {
		c.Grants = r.Grants
	}
	if len(r.Ended) > 0 {
		c.Ended = r.Ended
	}
	if len(r.Delayed) > 0 {
		c.Delayed = r.Delayed
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
	return fmt.Sprintf("{Err:%q SessionID:%d Grant:%s Queued:%v Grants:%+v Ended:%v Delayed:%v}",
		c.Err, c.SessionID, grant, c.Queued, c.Grants, c.Ended, c.Delayed)
}
