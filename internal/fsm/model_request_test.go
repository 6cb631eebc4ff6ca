// The model checker's half for acquire requests and idempotency keys
// (docs/design.md, "Acquire requests" and "Writes and retries").
// requestModel follows, from the commands and the Results the
// modelChecker has checked:
//
//   - the request tag (request id and attempt) of every holder and waiter:
//     an Acquire with a request id that leaves a new wait or grant tags it
//     with the id and the next attempt number; a retry with the same id by
//     the same session takes the wait or grant over under the next number;
//     another id (or none) is told of it, with Attempt 0, and leaves the tag
//     as it is; a waiter keeps its tag when it is granted;
//   - the last attempt number, which only those acquires move (a failed
//     acquire changes nothing);
//   - per session, the request ids that CancelAcquire gave up whole
//     (attempt 0), the last cancelledIDsKept, oldest first: an Acquire
//     naming one fails with ErrCancelled;
//   - the idempotency keys of the keyed commands that succeeded, the last
//     MaxIdempotencyKeys, oldest first, with what each first reported: a
//     command whose key is among them must answer Repeat and nothing else,
//     and leave the state's snapshot as it was, and a key longer than
//     MaxIdempotencyKeyBytes fails with ErrInvalidArgument.
//
// With the lock model (modelChecker.cancelled and cancelledAcquire) it
// predicts Attempt, Released, Dequeued, the Grant a CancelWait answers and
// Repeat exactly, and compare checks the tags, the attempt counter, the
// cancelled ids and the keys against the state's snapshot after every
// step. note names the paths the model saw a step take, so that
// TestRandomCommandStreams can require that its streams reach them.
package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// cancelledIDsKept is how many cancelled request ids a session remembers
// (docs/design.md: "the last 64 per session").
const cancelledIDsKept = 64

// entryKey names a holder or waiter: a session holds or waits for a lock
// at most once.
type entryKey struct {
	lock    string
	session uint64
}

// requestTag is the request id and attempt a wait or grant carries.
type requestTag struct{ id, attempt uint64 }

// matches reports whether a cancel naming request id (and attempt, if not
// 0) acts on the wait or grant tagged t.
func (t requestTag) matches(id, attempt uint64) bool {
	return id != 0 && t.id == id && (attempt == 0 || t.attempt == attempt)
}

// requestModel is the model of requests and idempotency keys that
// modelChecker keeps beside its lock model (see the top of this file).
type requestModel struct {
	tags        map[entryKey]requestTag // entries with a request id only
	lastAttempt uint64
	// cancelled holds each session's cancelled request ids, oldest first;
	// forgotten the ids that newer ones pushed out.
	cancelled map[uint64][]uint64
	forgotten map[uint64]map[uint64]bool
	// keys are the idempotency keys remembered, oldest first; applied what
	// each one's command reported, first the command itself, failed the
	// keys whose last command failed, and dropped the keys pushed out.
	keys    []string
	applied map[string]fsm.Repeat
	first   map[string]*fsmpb.Command
	failed  map[string]bool
	dropped map[string]bool
	notes   []string
}

func newRequestModel() *requestModel {
	return &requestModel{
		tags:      map[entryKey]requestTag{},
		cancelled: map[uint64][]uint64{},
		forgotten: map[uint64]map[uint64]bool{},
		applied:   map[string]fsm.Repeat{},
		first:     map[string]*fsmpb.Command{},
		failed:    map[string]bool{},
		dropped:   map[string]bool{},
	}
}

// start loads the idempotency keys of the snapshot the States start from.
func (q *requestModel) start(tb testing.TB, snap *fsmpb.Snapshot) {
	tb.Helper()
	if snap == nil {
		return
	}
	rest := proto.Clone(snap).(*fsmpb.Snapshot)
	rest.Applied = nil
	if !proto.Equal(rest, &fsmpb.Snapshot{}) {
		tb.Fatalf("a stream can start from idempotency keys only, not %v", rest)
	}
	for _, a := range snap.GetApplied() {
		q.keys = append(q.keys, a.GetKey())
		q.applied[a.GetKey()] = fsm.Repeat{SessionID: a.GetSessionId(), Revision: a.GetRevision(), Changed: a.GetChanged()}
	}
}

// startState returns a fresh State, or one restored from snap.
func startState(tb testing.TB, snap *fsmpb.Snapshot) *fsm.State {
	tb.Helper()
	if snap == nil {
		return fsm.NewState()
	}
	s, err := fsm.Restore(snap)
	if err != nil {
		tb.Fatalf("restoring the start of a stream: %v", err)
	}
	return s
}

// note records a path the step took.
func (q *requestModel) note(path string) { q.notes = append(q.notes, path) }

// takeNotes returns the paths noted since the last call.
func (q *requestModel) takeNotes() []string {
	out := q.notes
	q.notes = nil
	return out
}

func (q *requestModel) tag(lock string, session uint64) requestTag {
	return q.tags[entryKey{lock, session}]
}

// drop forgets the tag of a wait or grant that is gone.
func (q *requestModel) drop(lock string, session uint64) {
	delete(q.tags, entryKey{lock, session})
}

// endSession forgets an ended session's tags and cancelled ids.
func (q *requestModel) endSession(id uint64) {
	for k := range q.tags {
		if k.session == id {
			delete(q.tags, k)
		}
	}
	delete(q.cancelled, id)
	delete(q.forgotten, id)
}

func (q *requestModel) wasCancelled(session, id uint64) bool {
	return id != 0 && slices.Contains(q.cancelled[session], id)
}

// cancel records a request id given up whole, pushing out the oldest
// beyond cancelledIDsKept; an id already recorded keeps its place.
func (q *requestModel) cancel(session, id uint64) {
	ids := q.cancelled[session]
	if slices.Contains(ids, id) {
		q.note("request: a request cancelled again")
		return
	}
	if len(ids) == cancelledIDsKept {
		if q.forgotten[session] == nil {
			q.forgotten[session] = map[uint64]bool{}
		}
		q.forgotten[session][ids[0]] = true
		ids = slices.Delete(ids, 0, 1)
		q.note("request: the oldest cancelled request forgotten")
	}
	q.cancelled[session] = append(ids, id)
	delete(q.forgotten[session], id)
}

// tagged checks the Attempt of an Acquire that made a new wait or grant
// (what says which), and tags it.
func (q *requestModel) tagged(a *fsmpb.Acquire, res fsm.Result, what string) error {
	k := entryKey{a.GetLock(), a.GetSessionId()}
	var want uint64
	if id := a.GetRequestId(); id != 0 {
		q.lastAttempt++
		want = q.lastAttempt
		q.tags[k] = requestTag{id, want}
		q.note("request: " + what + " with a request id")
		if q.forgotten[k.session][id] {
			q.note("request: a request cancelled and since forgotten acquired again")
		}
	}
	if got := res.Acquire().Attempt; got != want {
		return fmt.Errorf("acquire(%s) %s with attempt %d, want %d", describeAcquire(a), what, got, want)
	}
	return nil
}

// retried checks the Attempt of an Acquire by a session that already holds
// or waits (what says which): a retry of the same request takes the grant
// or wait over under the next attempt number; another request leaves it.
func (q *requestModel) retried(a *fsmpb.Acquire, res fsm.Result, what string) error {
	k := entryKey{a.GetLock(), a.GetSessionId()}
	t, id := q.tags[k], a.GetRequestId()
	var want uint64
	switch {
	case id != 0 && t.id == id:
		q.lastAttempt++
		want = q.lastAttempt
		q.tags[k] = requestTag{id, want}
		q.note("request: a retry took the " + what + " over")
	case id != 0:
		q.note("request: another request told of the " + what)
	}
	if got := res.Acquire().Attempt; got != want {
		return fmt.Errorf("acquire(%s) of a %s tagged %+v answered attempt %d, want %d", describeAcquire(a), what, t, got, want)
	}
	return nil
}

// checkKeyed checks a command that its idempotency key alone answers: a key
// over MaxIdempotencyKeyBytes (ErrInvalidArgument) or one applied before
// (Repeat, as the first command reported). Either answer carries nothing
// else and leaves the state's snapshot as it was. answered is false for
// any other command, which the model checks as applied.
func (q *requestModel) checkKeyed(tb testing.TB, cmd *fsmpb.Command, res fsm.Result, s *fsm.State, before []byte) (answered bool, err error) {
	tb.Helper()
	key := cmd.GetIdempotencyKey()
	if key == "" {
		return false, nil
	}
	if len(key) > fsm.MaxIdempotencyKeyBytes {
		q.note("key: a key over the limit refused")
		rest := res
		rest.Err = nil
		if !errors.Is(res.Err, fence.ErrInvalidArgument) || !sameAnswer(rest, fsm.Result{}) {
			return true, fmt.Errorf("%v with a key of %d bytes answered %s, want ErrInvalidArgument", cmd, len(key), describe(res))
		}
	} else if r, ok := q.applied[key]; ok {
		if !sameAnswer(res, fsm.Result{Answer: r}) {
			return true, fmt.Errorf("%v, whose key was applied before, answered %s, want only Repeat %+v", cmd, describe(res), r)
		}
		q.noteRepeat(cmd, r)
	} else {
		return false, nil
	}
	if !bytes.Equal(before, snapshotBytes(tb, s)) {
		return true, fmt.Errorf("%v answered %s by its key alone, but changed the state", cmd, describe(res))
	}
	return true, nil
}

func (q *requestModel) noteRepeat(cmd *fsmpb.Command, r fsm.Repeat) {
	q.note("key: a keyed command repeated")
	if cmd.GetKvTxn() != nil && r.Succeeded {
		q.note("key: a repeat of a txn that ran then")
	}
	switch {
	case r.SessionID != 0:
		q.note("key: a repeat of a CreateSession")
	case r.Changed:
		q.note("key: a repeat of a write that changed keys")
	case r.Revision != 0:
		q.note("key: a repeat of a write that changed nothing")
	default:
		q.note("key: a repeat with nothing to report")
	}
	if first, ok := q.first[cmd.GetIdempotencyKey()]; ok && proto.Equal(first, cmd) {
		q.note("key: a retry of the same command repeated")
	} else {
		q.note("key: a key reused by another command")
	}
}

// keyApplied remembers the key of a keyed command that was applied and
// succeeded, with what it reported, pushing out the oldest key beyond
// MaxIdempotencyKeys; a failed command leaves no key.
func (q *requestModel) keyApplied(cmd *fsmpb.Command, res fsm.Result) {
	key := cmd.GetIdempotencyKey()
	if key == "" {
		return
	}
	if res.Err != nil {
		q.failed[key] = true
		q.note("key: a keyed command failed and left no key")
		return
	}
	q.note("key: a keyed command applied")
	if q.failed[key] {
		q.note("key: a retry of a failed keyed command applied")
	}
	if q.dropped[key] {
		q.note("key: a key forgotten applied again")
	}
	if len(key) == fsm.MaxIdempotencyKeyBytes {
		q.note("key: a key of the longest length applied")
	}
	delete(q.failed, key)
	delete(q.dropped, key)
	if len(q.keys) == fsm.MaxIdempotencyKeys {
		old := q.keys[0]
		q.keys = q.keys[1:]
		delete(q.applied, old)
		delete(q.first, old)
		q.dropped[old] = true
		q.note("key: the oldest key forgotten")
	}
	q.keys = append(q.keys, key)
	q.applied[key] = modelRepeat(res)
	q.first[key] = cmd
}

// compare checks the state's snapshot against the model: the attempt
// counter, every holder's and waiter's request tag, the sessions'
// cancelled ids and the idempotency keys, in order, with what they report.
func (q *requestModel) compare(snap *fsmpb.Snapshot) error {
	if snap.GetLastAttempt() != q.lastAttempt {
		return fmt.Errorf("last attempt %d, model %d", snap.GetLastAttempt(), q.lastAttempt)
	}
	tagged := 0
	check := func(lock string, session, id, attempt uint64, what string) error {
		want := q.tag(lock, session)
		if got := (requestTag{id, attempt}); got != want {
			return fmt.Errorf("%s %d of %q is tagged %+v, model %+v", what, session, lock, got, want)
		}
		if want.id != 0 {
			tagged++
		}
		return nil
	}
	for _, l := range snap.GetLocks() {
		for _, h := range l.GetHolders() {
			if err := check(l.GetName(), h.GetSessionId(), h.GetRequestId(), h.GetAttempt(), "holder"); err != nil {
				return err
			}
		}
		for _, w := range l.GetWaiters() {
			if err := check(l.GetName(), w.GetSessionId(), w.GetRequestId(), w.GetAttempt(), "waiter"); err != nil {
				return err
			}
		}
	}
	if tagged != len(q.tags) {
		return fmt.Errorf("the state tags %d waits and grants with requests, model %d: %+v", tagged, len(q.tags), q.tags)
	}
	withCancelled := 0
	for _, sess := range snap.GetSessions() {
		if got, want := sess.GetCancelled(), q.cancelled[sess.GetId()]; !slices.Equal(got, want) {
			return fmt.Errorf("session %d has cancelled requests %v, model %v", sess.GetId(), got, want)
		}
		if len(sess.GetCancelled()) > 0 {
			withCancelled++
		}
	}
	for id, ids := range q.cancelled {
		if len(ids) > 0 {
			withCancelled--
		}
		if len(ids) == 0 {
			delete(q.cancelled, id)
		}
	}
	if withCancelled != 0 {
		return fmt.Errorf("the model has cancelled requests of sessions the state does not: %v", q.cancelled)
	}
	applied := snap.GetApplied()
	if len(applied) != len(q.keys) {
		return fmt.Errorf("the state remembers %d idempotency keys, model %d", len(applied), len(q.keys))
	}
	for i, a := range applied {
		got := fsm.Repeat{SessionID: a.GetSessionId(), Revision: a.GetRevision(), Changed: a.GetChanged(), Succeeded: a.GetSucceeded()}
		if a.GetKey() != q.keys[i] || got != q.applied[q.keys[i]] {
			return fmt.Errorf("idempotency key %d is %q reporting %+v, model %q reporting %+v", i, a.GetKey(), got, q.keys[i], q.applied[q.keys[i]])
		}
	}
	return nil
}

// answeredByKey reports whether cmd's idempotency key alone answered it
// (a key over the limit, or one applied before): the command itself was
// not applied, and its outcomes are those of its key.
func answeredByKey(cmd *fsmpb.Command, res fsm.Result) bool {
	_, repeat := res.Repeat()
	return repeat || len(cmd.GetIdempotencyKey()) > fsm.MaxIdempotencyKeyBytes
}

// modelRepeat is what the model expects the state to remember of a keyed
// command that applied as res: the session it created, the KV revision
// after it (its answer's, or, for a session's end, its last event's),
// whether it changed a key, and whether a txn ran its then list.
func modelRepeat(res fsm.Result) fsm.Repeat {
	r := fsm.Repeat{SessionID: res.Effects.Created, Changed: len(res.Effects.Events) > 0, Succeeded: res.Txn().Succeeded}
	for _, ev := range res.Effects.Events {
		r.Revision = ev.KV.ModRevision
	}
	r.Revision = max(r.Revision, res.KV().Revision, res.Txn().Revision)
	return r
}

// sameAnswer reports whether two results are equal, Repeat included.
func sameAnswer(a, b fsm.Result) bool {
	return reflect.DeepEqual(cmpForm(a), cmpForm(b))
}

// taggedEntry is a wait or grant of a lock, with its request, as the
// state's snapshot has it.
type taggedEntry struct {
	session, id, attempt uint64
}

// requestEntries returns the lock's holders, then its waiters, that carry
// a request id.
func requestEntries(s *fsm.State, name string) []taggedEntry {
	var out []taggedEntry
	for _, l := range s.Snapshot().GetLocks() {
		if l.GetName() != name {
			continue
		}
		for _, h := range l.GetHolders() {
			if h.GetRequestId() != 0 {
				out = append(out, taggedEntry{h.GetSessionId(), h.GetRequestId(), h.GetAttempt()})
			}
		}
		for _, w := range l.GetWaiters() {
			if w.GetRequestId() != 0 {
				out = append(out, taggedEntry{w.GetSessionId(), w.GetRequestId(), w.GetAttempt()})
			}
		}
	}
	return out
}

// cancelledOf returns the request ids the session cancelled, oldest first.
func cancelledOf(s *fsm.State, session uint64) []uint64 {
	for _, sess := range s.Snapshot().GetSessions() {
		if sess.GetId() == session {
			return sess.GetCancelled()
		}
	}
	return nil
}

// requestID picks the request id of an acquire by session of lock name
// from h, the op byte's high nibble: 0 none; 1..3 that id, a small pool
// shared by every session, so that requests are retried and taken over;
// 4 and 7 a retry: the id of the session's wait or grant of the lock, 1
// if it has none with one; 5 and 8 a retry overtaken by its cancel: the
// id the session cancelled last, 2 if none; 6 and 9 1 plus the next byte,
// for ids enough to push cancelled ones out.
func (c *commandSource) requestID(s *fsm.State, h byte, session uint64, name string) uint64 {
	switch h {
	case 0:
		return 0
	case 1, 2, 3:
		return uint64(h)
	case 4, 7:
		for _, e := range requestEntries(s, name) {
			if e.session == session {
				return e.id
			}
		}
		return 1
	case 5, 8:
		if ids := cancelledOf(s, session); len(ids) > 0 {
			return ids[len(ids)-1]
		}
		return 2
	}
	return 1 + uint64(c.byte())
}

// requestTarget picks what a CancelAcquire or a CancelWait by request
// names, from h (the op byte's high nibble, 1..9) and two bytes, lock b
// and x: for h 1..3 and 7, a wait or grant of lock b that carries a
// request id (picked by x&0x3f; as for 4 if there is none), its session
// and, by x>>6, its request as a whole (attempt 0), at its attempt (a
// match), at the attempt before (one taken over), or another request of
// the session at its attempt; for 4, 5 and 8, the session that x picks
// and request 1..3 (b>>2), as a whole or, for x>>6 == 1, at the attempt
// of the session's wait or grant; for 6, the session x picks and request
// 1 plus the next byte, as a whole, for storms of cancels; for 9 no
// request id (a CancelAcquire that fails, a legacy CancelWait).
func (c *commandSource) requestTarget(s *fsm.State, h byte) (session uint64, name string, id, attempt uint64) {
	b, x := c.byte(), c.byte()
	name = lockName(b)
	entries := requestEntries(s, name)
	switch {
	case h == 6:
		return c.session(s, x), name, 1 + uint64(c.byte()), 0
	case h == 9:
		return c.session(s, x), name, 0, uint64(x >> 6)
	case (h <= 3 || h == 7) && len(entries) > 0:
		e := entries[int(x&0x3f)%len(entries)]
		switch x >> 6 {
		case 0:
			return e.session, name, e.id, 0
		case 1:
			return e.session, name, e.id, e.attempt
		case 2:
			return e.session, name, e.id, e.attempt - 1
		}
		return e.session, name, e.id%3 + 1, e.attempt
	}
	session, id = c.session(s, x), 1+uint64(b>>2)%3
	if x>>6 == 1 {
		for _, e := range entries {
			if e.session == session {
				attempt = e.attempt
			}
		}
	}
	return session, name, id, attempt
}

// idempotencyKeys are the keys of generated streams: a small pool, so that
// keys are used again; the longest key allowed; and one byte over it.
var idempotencyKeys = []string{"k1", "k2", "k3", "k4",
	strings.Repeat("l", fsm.MaxIdempotencyKeyBytes), strings.Repeat("o", fsm.MaxIdempotencyKeyBytes+1)}

// keyedCommand decodes a keyed command from h, the op byte's high nibble
// (1..9): for 1..6 the command that follows carries key
// idempotencyKeys[h-1] (unless it has a key of its own); for 7..9 the next
// byte picks a keyed command made before (0 the last), retried as it was,
// or, if there is none, as for 1..3.
func (c *commandSource) keyedCommand(s *fsm.State, h byte) (*fsmpb.Command, bool) {
	if h >= 7 && len(c.keyed) > 0 {
		b := c.byte()
		return proto.Clone(c.keyed[len(c.keyed)-1-int(b)%len(c.keyed)]).(*fsmpb.Command), true
	}
	cmd, ok := c.next(s)
	if !ok {
		return nil, false
	}
	if cmd.GetIdempotencyKey() == "" {
		cmd.IdempotencyKey = idempotencyKeys[(h-1)%6]
		c.keyed = append(c.keyed, cmd)
	}
	return cmd, true
}

// requestStream returns the input of a stream of about n commands that
// mostly make, retry and give up acquire requests, and key commands (see
// commandSource.next for the encoding): sessions created; acquires of
// "a", "b" and "c", exclusive, shared or as a semaphore, now and then a
// try or with a waiter limit, most with a request id of the small pool, a
// retry of the session's request or one it cancelled; CancelAcquire and
// CancelWait of waits and grants by request, as a whole or at an attempt,
// current or taken over, or of another request; legacy cancel waits;
// releases, expiries and closes of holders, and lifted delays; and
// CreateSession, KV writes, acquires and closes under idempotency keys of
// a small pool, some of them failing, and retries of keyed commands; of
// those, keyed percent more than the 16% it makes of its own.
func requestStream(r *rand.Rand, n, keyed int) []byte {
	session := func() byte { return byte(8 * r.IntN(8)) } // a live session
	name := func() byte { return byte(r.IntN(3)) }
	acquireOp := func(h byte) []byte {
		b := byte(3*r.IntN(2)) + name() // exclusive or shared
		o := byte(r.IntN(4)&1) | byte([]int{0, 0, 0, 2}[r.IntN(4)])<<1 | byte([]int{0, 0, 0, 0, 0, 3, 4}[r.IntN(7)])<<3
		if r.IntN(4) == 0 { // a semaphore of the permits in use, or 2 or 3 if idle
			b, o = byte(192+3*r.IntN(21))+name(), o|byte(1+r.IntN(2))<<6
		}
		out := []byte{h<<4 | 4, session(), b, o}
		if h == 6 || h == 9 {
			out = append(out, byte(r.IntN(8)))
		}
		return out
	}
	var command func(inner bool) []byte
	command = func(inner bool) []byte {
		x := r.IntN(100)
		if !inner && r.IntN(100) < keyed {
			x = 84 + x%16
		}
		switch {
		case x < 8: // a session, with a limit now and then
			return []byte{0, byte(r.IntN(0x40))}
		case x < 36: // an acquire with a request id
			return acquireOp([]byte{1, 2, 3, 1, 2, 4, 4, 7, 5, 6}[r.IntN(10)])
		case x < 41: // an acquire without one
			return acquireOp(0)
		case x < 55: // a CancelAcquire
			h := []byte{1, 2, 3, 7, 1, 2, 4, 5, 8, 6, 9}[r.IntN(11)]
			if h == 6 {
				return []byte{h<<4 | 12, name(), session(), byte(r.IntN(8))}
			}
			return []byte{h<<4 | 12, name(), byte(r.IntN(256))}
		case x < 62: // a CancelWait by request
			return []byte{[]byte{1, 2, 3, 7, 1, 2, 4, 8}[r.IntN(8)]<<4 | 8, name(), byte(r.IntN(256))}
		case x < 64: // a legacy CancelWait
			return []byte{8, session(), name()}
		case x < 71: // a holder releases
			return []byte{11, name(), byte(r.IntN(256))}
		case x < 75: // a holder's session expires or closes
			return []byte{14, name(), byte(r.IntN(256))}
		case x < 77: // a delayed lock is lifted
			return []byte{13, byte(r.IntN(256))}
		case x < 80: // shared holders, an exclusive waiter under request 2 and a shared one behind it; the exclusive one gives up
			b := byte(r.IntN(3))
			out := []byte{0x14, session(), 3 + b, 0, 0x24, session(), b, 0, 0x14, session(), 3 + b, 0}
			if r.IntN(2) == 0 {
				return append(out, 0x4c, []byte{6, 4, 5}[b], out[5])
			}
			return append(out, 8, out[5], b)
		case x < 84: // a KV write: a fenced or unfenced put, or a delete
			return []byte{[]byte{0xa4, 0xa8, 0xa3}[r.IntN(3)], byte(r.IntN(256)), []byte{0, 1, 3, 4, 5}[r.IntN(5)], []byte{0x02, 0x02, 0x06, 0x82}[r.IntN(4)]}
		case x < 94 && !inner: // a keyed command: CreateSession (some with a limit), a KV write, or any other
			h := byte([]int{1, 2, 3, 4, 1, 2, 5, 6}[r.IntN(8)])
			switch r.IntN(4) {
			case 0:
				return []byte{h<<4 | 1, 0, byte(r.IntN(256))}
			case 1:
				return append([]byte{h<<4 | 1, []byte{0xa4, 0xa8, 0xa3}[r.IntN(3)], byte(r.IntN(256)), []byte{0, 1, 3, 4}[r.IntN(4)]}, []byte{0x02, 0x82}[r.IntN(2)])
			}
			return append([]byte{h<<4 | 1}, command(true)...)
		case x < 100 && !inner: // a retry of a recent keyed command
			return []byte{byte(7+r.IntN(3))<<4 | 1, byte(r.IntN(3))}
		}
		return []byte{11, name(), byte(r.IntN(256))}
	}
	var data []byte
	for range n {
		data = append(data, command(false)...)
	}
	return data
}

// cancelStormStream returns the input of a stream in which one session
// gives up more requests than it remembers: it holds or waits for locks
// under requests of ids 1..8, cancels requests 1..n whole (n over
// cancelledIDsKept), some of them of its waits and grants, among acquires
// of other sessions; then it acquires again under ids the storm pushed
// out (they succeed) and under ids it still remembers (they fail with
// ErrCancelled).
func cancelStormStream(r *rand.Rand) []byte {
	sess := byte(8 * r.IntN(4))
	other := func() byte { return byte(8 * r.IntN(4)) }
	var data []byte
	acquireID := func(s byte, id byte) {
		data = append(data, 0x64, s, byte(3*r.IntN(2))+byte(r.IntN(3)), 0, id-1)
	}
	for range 4 {
		acquireID(sess, byte(1+r.IntN(8)))
		acquireID(other(), byte(1+r.IntN(8)))
	}
	n := cancelledIDsKept + 2 + r.IntN(10)
	for i := range n {
		data = append(data, 0x6c, byte(r.IntN(3)), sess, byte(i))
		if r.IntN(6) == 0 {
			acquireID(other(), byte(1+r.IntN(8)))
		}
	}
	for range 6 {
		acquireID(sess, byte(1+r.IntN(n-cancelledIDsKept)))
		acquireID(sess, byte(n-r.IntN(8)))
	}
	return data
}

// keyedStart is a snapshot that holds MaxIdempotencyKeys idempotency keys
// and nothing else, the oldest k1, k2 and k3 of idempotencyKeys, so that
// every new key in a stream from it pushes the oldest out, and k1..k3 are
// applied again once pushed out.
func keyedStart() *fsmpb.Snapshot {
	snap := &fsmpb.Snapshot{Applied: []*fsmpb.Applied{{Key: "k1", SessionId: 9}, {Key: "k2", Revision: 7, Changed: true}, {Key: "k3", Revision: 8}}}
	for i := range fsm.MaxIdempotencyKeys - len(snap.Applied) {
		snap.Applied = append(snap.Applied, &fsmpb.Applied{Key: fmt.Sprintf("fill-%d", i)})
	}
	return snap
}

// keysInFullStream returns the input of a stream for keyedStart: keyed
// commands under new keys that push k1, k2 and k3 out, then under those
// keys again, which are applied anew, each pushing out the oldest key
// left; then a few commands as requestStream makes them.
func keysInFullStream(r *rand.Rand) []byte {
	data := []byte{
		0x41, 0xa4, 0, 0, 0x02, // put x under k4, a new key: k1 pushed out
		0x51, 0xa8, 0, 0, 0x02, // put x under the longest key: k2 pushed out
		0x11, 0xa3, 1, 0, 0x02, // delete y under k1, applied anew: k3 pushed out
		0x71, 0, // retried: Repeat
		0x21, 0, 0x10, // CreateSession under k2, applied anew
		0x31, 0xa4, 2, 0, 0x02, // put orders/17 under k3, applied anew
		0x81, 2, // a retry of the put of x under the longest key: Repeat
	}
	return append(data, requestStream(r, 4, 80)...)
}

// An acquire with a request id that fails, as a try or over the waiter
// limit, numbers no attempt: a failed command changes nothing. (It moved
// the counter once; the model checker found it.)
func TestFailedAcquireSpendsNoAttempt(t *testing.T) {
	runApplyCases(t, []applyCase{{
		name: "a failed try and an acquire over the waiter limit leave the counter",
		steps: script(sessions(3), []applyStep{
			{cmd: acquire(1, "a", excl, withRequest(1)), want: withAttempt(granted(1, "a", 1, excl), 1)},
			{cmd: acquire(2, "a", excl, try, withRequest(1)), want: fails(fence.ErrLocked)},
			{cmd: acquire(2, "a", excl, withRequest(1)), want: withAttempt(queued(), 2)},
			{cmd: acquire(3, "a", excl, maxWaiters(1), withRequest(1)), want: fails(fence.ErrLimit)},
			{cmd: acquire(3, "a", excl, withRequest(2)), want: withAttempt(queued(), 3)},
		}),
		locks: []fsm.LockInfo{{Name: "a", Holders: []fsm.HolderInfo{holding(1, 1, excl)}, Waiters: []fsm.WaiterInfo{waiting(2, excl), waiting(3, excl)}}},
	}}, false)
}

// TestModelCheckerCatchesRequestViolations shows that the request half of
// the checker can fail: fed results, or states, that get a request's
// attempt, a cancel, a cancelled id or an idempotency key wrong, observe
// reports each.
func TestModelCheckerCatchesRequestViolations(t *testing.T) {
	// Session 1 holds a under request 7 (attempt 1), session 2 waits for it
	// under request 7 (attempt 2); session 3 gave up request 5; a put was
	// applied under key p.
	setup := func(t *testing.T) (*fsm.State, *modelChecker) {
		return observedState(t, newSession(), newSession(), newSession(),
			acquire(1, "a", excl, withRequest(7)), acquire(2, "a", excl, withRequest(7)), cancelAcquire(3, "a", 5, 0),
			keyedCmd("p", kvPut("k", "v")))
	}
	cases := []brokenCase{
		{"a retry answered without its new attempt", acquire(1, "a", excl, withRequest(7)), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.AcquireAnswer) { a.Attempt = 0 })
		}, nil, "want 3"},
		{"another request answered as a take-over", acquire(1, "a", excl, withRequest(8)), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.AcquireAnswer) { a.Attempt = 3 })
		}, nil, "want 0"},
		{"a take-over the state did not tag", acquire(2, "a", excl, withRequest(7)), nil, func(snap *fsmpb.Snapshot) {
			snap.Locks[0].Waiters[0].Attempt = 2
		}, "model {id:7 attempt:3}"},
		{"a release by cancel not reported", cancelAcquire(1, "a", 7, 1), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.CancelAcquireAnswer) { a.Released = false })
		}, nil, "want Released"},
		{"a dropped wait not reported", cancelAcquire(2, "a", 7, 0), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.CancelAcquireAnswer) { a.Dequeued = false })
		}, nil, "want Dequeued"},
		{"a cancel of an attempt taken over acting", cancelAcquire(1, "a", 7, 2), func(fsm.Result) fsm.Result {
			return fsm.Result{Answer: fsm.CancelAcquireAnswer{Released: true}}
		}, nil, "matches no wait or grant"},
		{"a cancel wait of another request answering the grant", cancelWaitOf(1, "a", 8, 0), func(fsm.Result) fsm.Result {
			return grantedBefore(1, "a", 1, excl)
		}, nil, "want {Err"},
		{"a cancel wait of a wait not reporting the drop", cancelWaitOf(2, "a", 7, 2), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.CancelWaitAnswer) { a.Dequeued = false })
		}, nil, "want Dequeued"},
		{"an acquire of a cancelled request queued", acquire(3, "a", excl, withRequest(5)), func(fsm.Result) fsm.Result {
			return queued()
		}, nil, "fails with fence: acquire cancelled"},
		{"a cancelled request forgotten by the state", cancelAcquire(3, "b", 6, 0), nil, func(snap *fsmpb.Snapshot) {
			snap.Sessions[2].Cancelled = []uint64{6}
		}, "cancelled requests [6], model [5 6]"},
		{"the attempt counter moved by a legacy cancel", cancelWait(2, "a"), nil, func(snap *fsmpb.Snapshot) {
			snap.LastAttempt++
		}, "last attempt 3, model 2"},
		{"a repeated keyed command applied again", keyedCmd("p", kvPut("k", "v")), func(fsm.Result) fsm.Result {
			return wrote(2, fsm.KeyValue{Key: "k", Value: val("v"), CreateRevision: 1, ModRevision: 2, Version: 2})
		}, nil, "want only Repeat"},
		{"a repeat with another revision", keyedCmd("p", kvPut("k", "w")), func(r fsm.Result) fsm.Result {
			return editAnswer(r, func(a *fsm.Repeat) { a.Revision++ })
		}, nil, "want only Repeat"},
		{"a repeat that changes the state", keyedCmd("p", kvPut("k", "v")), nil, func(snap *fsmpb.Snapshot) {
			snap.KvRevision, snap.Kvs[0].ModRevision, snap.Kvs[0].Version = 2, 2, 2
		}, "changed the state"},
		{"a failed keyed command keeps its key", keyedCmd("q", acquire(9, "a", excl)), nil, func(snap *fsmpb.Snapshot) {
			snap.Applied = append(snap.Applied, &fsmpb.Applied{Key: "q"})
		}, "changed the state"},
		{"a keyed command applied leaves no key", keyedCmd("q", kvPut("k", "w")), nil, func(snap *fsmpb.Snapshot) {
			snap.Applied = snap.Applied[:1]
		}, "remembers 1 idempotency keys, model 2"},
		{"an oversized key applied", keyedCmd(idempotencyKeys[5], kvPut("k", "w")), func(fsm.Result) fsm.Result {
			return wrote(2, fsm.KeyValue{Key: "k", Value: val("w"), CreateRevision: 1, ModRevision: 2, Version: 2})
		}, nil, "want ErrInvalidArgument"},
		{"a Repeat for a key never applied", keyedCmd("r", kvPut("k", "v")), func(fsm.Result) fsm.Result {
			return fsm.Result{Answer: fsm.Repeat{Revision: 1, Changed: true}}
		}, nil, "not applied before"},
	}
	runBrokenCases(t, setup, cases)
}
