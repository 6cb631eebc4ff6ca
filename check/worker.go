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
// counter, append to the list, release. Every operation is reported on out.
// A worker keeps writing after its lease may be lost, as a paused process
// would: it is the resource's job to refuse it.
func RunWorker(ctx context.Context, cfg WorkerConfig, out io.Writer) error {
	rep := &reporter{w: out, worker: cfg.ID, run: cfg.Run}
	// Locks may be retried (acquire is idempotent); writes must not be, or an
	// outcome the worker reports could hide an earlier attempt that applied.
	locks, err := client.New(client.WithEndpoints(cfg.Endpoints...))
	if err != nil {
		return err
	}
	defer locks.Close()
	writes, err := client.New(client.WithEndpoints(cfg.Endpoints...), client.WithRetryBudget(0))
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
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.Close(closeCtx)
			cancel()
		}
	}()
	for n := 0; ctx.Err() == nil; n++ {
		if s == nil || s.Err() != nil {
			if s, err = locks.NewSession(ctx, client.WithTTL(cfg.TTL), client.WithOwner("check worker "+strconv.Itoa(cfg.ID))); err != nil {
				s = nil
				sleep(ctx, 50*time.Millisecond)
				continue
			}
		}
		m := client.NewMutex(s, cfg.Lock)
		op := rep.invoke("acquire", cfg.Lock, 0, "")
		lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		g, err := m.Lock(lockCtx)
		cancel()
		if err != nil {
			op.Result, op.Err = Unknown, err.Error()
			rep.complete(op)
			continue
		}
		op.Result, op.Token = OK, g.Token()
		rep.complete(op)

		w.iteration(ctx, g.Token(), n)

		op = rep.invoke("release", cfg.Lock, g.Token(), "")
		op.Result = OK
		if err := m.Unlock(context.Background()); err != nil {
			op.Result, op.Err = Unknown, err.Error()
		}
		rep.complete(op)
	}
	return nil
}

type worker struct {
	cfg WorkerConfig
	rep *reporter
	kv  *client.KV
	rng *rand.Rand
}

// iteration is the protected work: read-modify-write of the counter, then
// of the list, with a little think time between read and write, which is
// where a pause does its damage.
func (w *worker) iteration(ctx context.Context, token uint64, n int) {
	counter, ok := w.get(ctx, w.cfg.Prefix+"counter", token)
	if ok {
		v, _ := strconv.Atoi(counter)
		w.think(ctx)
		w.put(ctx, w.cfg.Prefix+"counter", strconv.Itoa(v+1), token)
	}
	list, ok := w.get(ctx, w.cfg.Prefix+"list", token)
	if ok {
		item := "w" + strconv.Itoa(w.cfg.ID) + "." + strconv.Itoa(w.cfg.Run) + "." + strconv.Itoa(n)
		if list != "" {
			item = list + "," + item
		}
		w.think(ctx)
		w.put(ctx, w.cfg.Prefix+"list", item, token)
	}
	if w.cfg.SQL != nil {
		op := w.rep.invoke("sql-incr", "sql/counter", token, "")
		op.Result = OK
		if err := w.cfg.SQL.Increment(ctx, token, w.cfg.Unsafe); err != nil {
			op.Result, op.Err = classify(err), err.Error()
		}
		w.rep.complete(op)
	}
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

func (w *worker) put(ctx context.Context, key, value string, token uint64) {
	op := w.rep.invoke("put", key, token, value)
	var opts []client.WriteOption
	if !w.cfg.Unsafe {
		opts = append(opts, client.WithToken(w.cfg.Lock, token), client.Strict())
	}
	rev, err := w.kv.Put(ctx, key, []byte(value), opts...)
	op.Result, op.Rev = OK, rev
	if err != nil {
		op.Result, op.Err = classify(err), err.Error()
	}
	w.rep.complete(op)
}

// classify tells a refusal, which had no effect, from a failure whose
// outcome is unknown.
func classify(err error) string {
	for _, refused := range []error{fence.ErrStaleToken, fence.ErrNotHolder, fence.ErrRevisionMismatch, fence.ErrInvalidArgument, fence.ErrSessionNotFound, fence.ErrLimit} {
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
