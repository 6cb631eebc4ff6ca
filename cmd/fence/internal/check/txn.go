package check

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencelock/fence/client"
)

// The txn workload: under the lock, a worker reads two keys, Prefix+
// "move/from" and Prefix+"move/to", in one txn of two gets ("txn-read"),
// then moves a unit from one to the other in a fenced txn of two puts
// ("txn"): from -= 1, to += 1, written blind, as the counter is. Both
// keys start absent (0), so that they always sum to 0, in every read and
// at the end, unless a txn applied in part; and to counts the moves, so
// that it lies between the acknowledged moves and those plus the moves of
// unknown outcome, unless a stale txn was accepted (or, without fencing,
// two holders' moves crossed).

// ViolationTornTxn: the two keys a txn writes do not sum to 0, at the end
// or in a read: a txn applied in part, or a read saw part of one.
const ViolationTornTxn = "torn-txn"

// moveKeys are the keys the txn workload moves a unit between.
func moveKeys(prefix string) (from, to string) { return prefix + "move/from", prefix + "move/to" }

// move reads the two keys and moves a unit between them under the grant,
// if the worker still holds it; it reports whether it started the move
// (false: the worker no longer holds the grant).
func (w *worker) move(ctx context.Context, h *hold) bool {
	from, to := moveKeys(w.cfg.Prefix)
	read := w.rep.invoke("txn-read", from, h.g.Token(), "")
	resp, err := w.kv.Txn(ctx).Then(client.OpGet(from), client.OpGet(to)).Commit()
	var a, b int
	if err == nil && len(resp.GetResults()) != 2 {
		err = fmt.Errorf("the read was answered as a retry, without its gets")
	}
	if err == nil {
		a, err = strconv.Atoi(orZero(string(resp.GetResults()[0].GetGet().GetKv().GetValue())))
	}
	if err == nil {
		b, err = strconv.Atoi(orZero(string(resp.GetResults()[1].GetGet().GetKv().GetValue())))
	}
	if err != nil {
		read.Result, read.Err = classify(err), err.Error()
		w.rep.complete(read)
		return true
	}
	read.Result, read.Value, read.Rev = OK, strconv.Itoa(a)+","+strconv.Itoa(b), resp.GetRevision()
	w.rep.complete(read)

	op, ok := w.startWrite(ctx, h, "txn", from, strconv.Itoa(a-1)+","+strconv.Itoa(b+1))
	if !ok {
		return false
	}
	resp, err = w.kv.Txn(ctx, w.fencing(op.Token)...).Then(client.OpPut(from, []byte(strconv.Itoa(a-1))), client.OpPut(to, []byte(strconv.Itoa(b+1)))).Commit()
	op.Result, op.Rev = OK, resp.GetRevision()
	if err != nil {
		op.Result, op.Err = classify(err), err.Error()
	}
	w.rep.complete(op)
	return true
}

// movePair reads a "from,to" pair of the txn workload.
func movePair(s string) (from, to int, ok bool) {
	a, b, found := strings.Cut(s, ",")
	x, errA := strconv.Atoi(orZero(a))
	y, errB := strconv.Atoi(orZero(b))
	return x, y, found && errA == nil && errB == nil
}

// checkMoves: every read of the two keys, and the final state, sums to 0;
// and the final "to" counts the acknowledged moves, allowing for those of
// unknown outcome.
func (a *Analysis) checkMoves(ops []Op, final Final) {
	for _, op := range ops {
		switch {
		case op.Kind == "txn" && op.Result == OK:
			a.AckedMoves++
		case op.Kind == "txn" && op.Result == Unknown:
			a.UnknownMoves++
		case op.Kind == "txn-read" && op.Result == OK:
			if x, y, ok := movePair(op.Value); !ok || x+y != 0 {
				a.violate(ViolationTornTxn, "worker %d read the txn's keys as %s at revision %d: they sum to %d, not 0", op.Worker, op.Value, op.Rev, x+y)
			}
		}
	}
	from, errA := strconv.Atoi(orZero(final.MoveFrom))
	to, errB := strconv.Atoi(orZero(final.MoveTo))
	switch {
	case errA != nil || errB != nil:
		a.violate(ViolationTornTxn, "the txn's keys end as %q and %q, which are no numbers", final.MoveFrom, final.MoveTo)
	case from+to != 0:
		a.violate(ViolationTornTxn, "the txn's keys end as %d and %d: they sum to %d, not 0", from, to, from+to)
	case to < a.AckedMoves || to > a.AckedMoves+a.UnknownMoves:
		a.violate(ViolationLostIncrement, "the txn's count is %d after %d acknowledged moves (and %d of unknown outcome)", to, a.AckedMoves, a.UnknownMoves)
	}
}

// txnWrites returns the writes an accepted move made, as puts of its two
// keys at its revision, for checkStaleWrites.
func txnWrites(op Op, prefix string) []Op {
	from, to := moveKeys(prefix)
	a, b := op, op
	a.Kind, a.Key = "put", from
	b.Kind, b.Key = "put", to
	return []Op{a, b}
}
