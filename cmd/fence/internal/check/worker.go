package check

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
)

// WorkerConfig configures one worker process.
type WorkerConfig struct {
	Endpoints []string
	// ClusterID is the group's id; the worker talks to no other group.
	ClusterID string
	ID, Run   int
	TTL       time.Duration
	// Lock is the lock every worker contends for.
	Lock string
	// Prefix names the run's keys: Prefix+"counter" and Prefix+"list".
	Prefix string
	// Unsafe writes without tokens: a resource that ignores fencing.
	Unsafe bool
	// SQL, when set, also increments a counter through a fenced SQL store.
	SQL  SQLTarget
	Seed uint64
}

// SQLTarget is a fenced SQL resource a worker increments.
type SQLTarget interface {
	// Increment adds one to the counter, fenced by token (unless unsafe).
	Increment(ctx context.Context, token uint64, unsafe bool) error
	Close() error
}

// RunWorker loops until ctx ends: take the lock, read-modify-write the
// counter, append to the list, release. Every operation is reported on out,
// and so is each grant's hold: the interval in which the worker believed it
// held the lock. Before each write the worker checks, as a careful client
// does, that it still holds the grant (its context is live and its
// session's safe-until deadline has not passed); then it thinks a little
// and writes. A pause between that check and the write leaves a write with
// a token that may be stale: it is the resource's job to refuse it.
func RunWorker(ctx context.Context, cfg WorkerConfig, out io.Writer) error {
	rep := &reporter{w: out, worker: cfg.ID, run: cfg.Run}
	// Locks may be retried (acquire is idempotent); writes must not be, or an
	// outcome the worker reports could hide an earlier attempt that applied.
	locks, err := client.New(client.WithEndpoints(cfg.Endpoints...), client.WithClusterID(cfg.ClusterID))
	if err != nil {
		return err
	}
	defer locks.Close()
	writes, err := client.New(client.WithEndpoints(cfg.Endpoints...), client.WithClusterID(cfg.ClusterID), client.WithRetryBudget(0))
	if err != nil {
		return err
	}
	defer writes.Close()
	kv := writes.KV()
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ID)<<32|uint64(cfg.Run)))
	w := &worker{cfg: cfg, rep: rep, kv: kv, rng: rng}

	var s *client.Session
	defer func() {
		if s != nil {
			closeSession(s)
		}
	}()
	for n := 0; ctx.Err() == nil; n++ {
		if s == nil || s.Err() != nil {
			lost := s
			if s, err = locks.NewSession(ctx, client.WithTTL(cfg.TTL), client.WithOwner("check worker "+strconv.Itoa(cfg.ID))); err != nil {
				s = lost
				sleep(ctx, 50*time.Millisecond)
				continue
			}
			if lost != nil {
				// The client closes a lost session only on the node
				// that answered last, which may be down; now that a
				// node answers, close it there, so that its grant and
				// its waits do not hold up the others until it expires.
				closeSession(lost)
			}
		}
		m := client.NewMutex(s, cfg.Lock)
		h, err := w.acquire(ctx, s, m)
		if errors.Is(err, fence.ErrSessionNotFound) {
			// Expired on the server before the keepalives told the
			// client: start a new one rather than ask again.
			closeSession(s)
			s = nil
		}
		if err != nil {
			continue
		}
		w.iteration(ctx, h, n)
		w.release(m, h)
	}
	return nil
}

// closeSession closes a session, giving the service a second to hear it.
func closeSession(s *client.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.Close(ctx)
}

// acquire takes the lock and starts the grant's hold.
func (w *worker) acquire(ctx context.Context, s *client.Session, m *client.Mutex) (*hold, error) {
	op := w.rep.invoke("acquire", w.cfg.Lock, 0, "")
	lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	g, err := m.Lock(lockCtx)
	cancel()
	now := time.Now()
	if err != nil {
		op.Result, op.Err = Unknown, err.Error()
		w.rep.completeAt(now, op)
		return nil, err
	}
	op.Result, op.Token = OK, g.Token()
	w.rep.completeAt(now, op)
	return startHold(w.rep, now, s, g), nil
}

// release ends the hold, then releases the lock. A release that fails
// leaves the lock to expire with the session; the hold ended anyway.
func (w *worker) release(m *client.Mutex, h *hold) {
	h.release()
	op := w.rep.invoke("release", w.cfg.Lock, h.g.Token(), "")
	op.Result = OK
	if err := m.Unlock(context.Background()); err != nil {
		op.Result, op.Err = Unknown, err.Error()
	}
	w.rep.complete(op)
}

// hold is a worker's belief that it holds a grant, reported as a "hold"
// op from when Lock returned the grant until the worker begins to release
// it, or until the grant's context ends otherwise (the session was lost or
// expired). In that case the belief ended at the session's safe-until
// deadline, if it came before the worker learned of the end: a worker
// paused past that deadline learns late, but could believe no longer.
type hold struct {
	rep   *reporter
	op    Op
	s     *client.Session
	g     *client.Grant
	stop  func() bool   // stops watching the grant's context
	ended chan struct{} // closed once the hold is reported ended
}

func startHold(rep *reporter, start time.Time, s *client.Session, g *client.Grant) *hold {
	h := &hold{rep: rep, s: s, g: g, ended: make(chan struct{})}
	h.op = rep.invokeAt(start, "hold", g.Lock(), g.Token(), "")
	h.stop = context.AfterFunc(g.Context(), h.lost)
	return h
}

// errSafeUntilPassed ends a hold whose worker found its session's
// safe-until passed before the session was declared lost.
var errSafeUntilPassed = errors.New("the session's safe-until deadline passed")

// lost ends the hold when the grant's context ended before its release.
func (h *hold) lost() {
	learned := time.Now()
	h.finish(h.endAt(learned), learned, context.Cause(h.g.Context()))
}

// release ends the hold as the worker is about to release the grant, or
// waits until lost has reported the end that came first. A worker that
// stopped because its safe-until passed may get here before its session
// is declared lost: its belief ended at safe-until all the same.
func (h *hold) release() {
	if !h.stop() {
		<-h.ended
		return
	}
	now := time.Now()
	end := h.endAt(now)
	var cause error
	if end.Before(now) {
		cause = errSafeUntilPassed
	}
	h.finish(end, now, cause)
}

// endAt is when a belief learned to be over at now ended: now, or the
// session's safe-until deadline if that came first.
func (h *hold) endAt(now time.Time) time.Time {
	if safe := h.s.SafeUntil(); safe.Before(now) {
		return safe
	}
	return now
}

func (h *hold) finish(end, learned time.Time, cause error) {
	op := h.op
	op.Result, op.Learned = OK, learned.UnixNano()
	if cause != nil {
		op.Err = cause.Error()
	}
	h.rep.completeAt(end, op)
	close(h.ended)
}

// live reports whether the worker may still believe it holds the grant:
// its context has not ended and its session's safe-until deadline has not
// passed (the keepalive goroutine may not have noticed yet).
func (h *hold) live() bool {
	return h.g.Err() == nil && time.Now().Before(h.s.SafeUntil())
}

type worker struct {
	cfg WorkerConfig
	rep *reporter
	kv  *client.KV
	rng *rand.Rand
}

// iteration is the protected work: read-modify-write of the counter, then
// of the list, then a move between the txn workload's keys (txn.go). It stops at the first write the worker no longer holds the
// grant for.
func (w *worker) iteration(ctx context.Context, h *hold, n int) {
	token := h.g.Token()
	if counter, ok := w.get(ctx, w.cfg.Prefix+"counter", token); ok {
		v, _ := strconv.Atoi(counter)
		if !w.put(ctx, h, w.cfg.Prefix+"counter", strconv.Itoa(v+1)) {
			return
		}
	}
	if list, ok := w.get(ctx, w.cfg.Prefix+"list", token); ok {
		item := "w" + strconv.Itoa(w.cfg.ID) + "." + strconv.Itoa(w.cfg.Run) + "." + strconv.Itoa(n)
		if list != "" {
			item = list + "," + item
		}
		if !w.put(ctx, h, w.cfg.Prefix+"list", item) {
			return
		}
	}
	if !w.move(ctx, h) {
		return
	}
	if w.cfg.SQL != nil {
		w.sqlIncrement(ctx, h)
	}
}

// startWrite checks that the worker still holds the grant and, if so,
// reports a write as started then (the instant before the check, so that
// a write reported started after the hold's end is one the worker made
// knowing better), and thinks a little: between the check and the write
// is where a pause does its damage.
func (w *worker) startWrite(ctx context.Context, h *hold, kind, key, value string) (Op, bool) {
	start := time.Now()
	if !h.live() {
		return Op{}, false
	}
	op := w.rep.invokeAt(start, kind, key, h.g.Token(), value)
	w.think(ctx)
	return op, true
}

func (w *worker) sqlIncrement(ctx context.Context, h *hold) {
	op, ok := w.startWrite(ctx, h, "sql-incr", "sql/counter", "")
	if !ok {
		return
	}
	op.Result = OK
	if err := w.cfg.SQL.Increment(ctx, op.Token, w.cfg.Unsafe); err != nil {
		op.Result, op.Err = classify(err), err.Error()
	}
	w.rep.complete(op)
}

func (w *worker) think(ctx context.Context) {
	sleep(ctx, time.Duration(2+w.rng.IntN(10))*time.Millisecond)
}

func (w *worker) get(ctx context.Context, key string, token uint64) (string, bool) {
	op := w.rep.invoke("get", key, token, "")
	kv, err := w.kv.Get(ctx, key)
	if err != nil {
		op.Result, op.Err = Unknown, err.Error()
		w.rep.complete(op)
		return "", false
	}
	op.Result = OK
	if kv != nil {
		op.Value, op.Found, op.Rev = string(kv.GetValue()), true, kv.GetModRevision()
	}
	w.rep.complete(op)
	return op.Value, true
}

// fencing is the write options of a write under the grant of token: the
// token, in strict mode, or none with Unsafe.
func (w *worker) fencing(token uint64) []client.WriteOption {
	if w.cfg.Unsafe {
		return nil
	}
	return []client.WriteOption{client.FencedBy(w.cfg.Lock, token), client.Strict()}
}

// put writes under the grant, if the worker still holds it; it reports
// whether it did.
func (w *worker) put(ctx context.Context, h *hold, key, value string) bool {
	op, ok := w.startWrite(ctx, h, "put", key, value)
	if !ok {
		return false
	}
	rev, err := w.kv.Put(ctx, key, []byte(value), w.fencing(op.Token)...)
	op.Result, op.Rev = OK, rev
	if err != nil {
		op.Result, op.Err = classify(err), err.Error()
	}
	w.rep.complete(op)
	return true
}

// classify tells a refusal, which had no effect, from a failure whose
// outcome is unknown.
func classify(err error) string {
	for _, refused := range []error{fence.ErrStaleToken, fence.ErrNotHolder, fence.ErrRevisionMismatch, fence.ErrInvalidArgument, fence.ErrSessionNotFound, fence.ErrLimit,
		fence.ErrUnsupported} {
		if errors.Is(err, refused) {
			return Rejected
		}
	}
	return Unknown
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// listItems splits a list value into its items.
func listItems(list string) []string {
	if list == "" {
		return nil
	}
	return strings.Split(list, ",")
}
