package check

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Outcomes of an operation.
const (
	// OK: the operation took effect and the worker was told so.
	OK = "ok"
	// Rejected: the service refused it; it had no effect.
	Rejected = "rejected"
	// Unknown: the worker never learned the outcome (a timeout, a lost
	// connection, a kill); it may or may not have taken effect.
	Unknown = "unknown"
)

// Op is one operation of a worker, as it reports it: once when it invokes
// the operation (End 0, no Result) and once when it completes. An
// invocation without a completion (the worker was killed) has an unknown
// outcome.
//
// A hold is not a call but the worker's belief that it holds a grant
// (Key is the lock, Token the grant's): it starts when Lock returned the
// grant and ends when the worker began to release it, or, when the grant
// ended otherwise (its session was lost or expired), at the session's
// safe-until deadline if that came before the worker learned of the end
// (a paused worker learns late). Learned is when the worker learned that
// the grant had ended, and Err why, if not by its release. A hold that
// never completed (the worker was killed) has an unknown end.
type Op struct {
	// ID is unique per worker process run.
	ID     int    `json:"id"`
	Worker int    `json:"w"`
	Run    int    `json:"run"` // which process of the worker (it is restarted after a kill)
	Kind   string `json:"op"`  // acquire, hold, release, get, put, sql-incr, txn-read, txn
	Key    string `json:"key,omitempty"`
	// Value is what a put wrote, or what a get read.
	Value string `json:"value,omitempty"`
	Found bool   `json:"found,omitempty"`
	// Token is the grant the operation was made under.
	Token  uint64 `json:"token,omitempty"`
	Rev    uint64 `json:"rev,omitempty"`
	Start  int64  `json:"start"`
	End    int64  `json:"end,omitempty"`
	Result string `json:"result,omitempty"`
	Err    string `json:"err,omitempty"`
	// Learned is, for a hold, when the worker learned that it had ended.
	Learned int64 `json:"learned,omitempty"`
}

func (o Op) String() string {
	s := fmt.Sprintf("worker %d %s", o.Worker, o.Kind)
	if o.Key != "" {
		s += " " + o.Key
	}
	if o.Value != "" {
		s += fmt.Sprintf(" %q", o.Value)
	}
	if o.Token != 0 {
		s += fmt.Sprintf(" token %d", o.Token)
	}
	if o.Result != "" {
		s += " -> " + o.Result
	}
	if o.Err != "" {
		s += " (" + o.Err + ")"
	}
	return s
}

// reporter writes a worker's operations as JSON lines, one write a line,
// so that a line survives the worker's SIGKILL once written.
type reporter struct {
	mu     sync.Mutex
	w      io.Writer
	worker int
	run    int
	next   int
}

func (r *reporter) invoke(kind, key string, token uint64, value string) Op {
	return r.invokeAt(time.Now(), kind, key, token, value)
}

// invokeAt reports an operation that started at the given instant.
func (r *reporter) invokeAt(start time.Time, kind, key string, token uint64, value string) Op {
	r.mu.Lock()
	r.next++
	op := Op{ID: r.next, Worker: r.worker, Run: r.run, Kind: kind, Key: key, Token: token, Value: value, Start: start.UnixNano()}
	r.mu.Unlock()
	r.emit(op)
	return op
}

func (r *reporter) complete(op Op) { r.completeAt(time.Now(), op) }

// completeAt reports an operation that ended at the given instant.
func (r *reporter) completeAt(end time.Time, op Op) {
	op.End = end.UnixNano()
	r.emit(op)
}

func (r *reporter) emit(op Op) {
	data, _ := json.Marshal(op)
	data = append(data, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(data)
}

// History collects the operations of every worker, pairing invocations
// with completions.
type History struct {
	mu  sync.Mutex
	ops map[opKey]*Op
	seq []opKey
}

type opKey struct{ worker, run, id int }

func newHistory() *History { return &History{ops: map[opKey]*Op{}} }

func (h *History) add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := opKey{op.Worker, op.Run, op.ID}
	if prev, ok := h.ops[k]; ok {
		*prev = op
		return
	}
	h.ops[k] = &op
	h.seq = append(h.seq, k)
}

// Ops returns every operation in invocation order; operations that never
// completed get Result Unknown and End 0.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, 0, len(h.seq))
	for _, k := range h.seq {
		op := *h.ops[k]
		if op.Result == "" {
			op.Result, op.End = Unknown, 0
		}
		out = append(out, op)
	}
	return out
}

// holder returns the worker granted the highest token so far, which holds
// the lock unless it has released it since.
func (h *History) holder() (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var best *Op
	for i := len(h.seq) - 1; i >= 0 && i >= len(h.seq)-200; i-- {
		op := h.ops[h.seq[i]]
		if op.Kind == "acquire" && op.Result == OK && (best == nil || op.Token > best.Token) {
			best = op
		}
	}
	if best == nil {
		return 0, false
	}
	return best.Worker, true
}
