package check

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one broken guarantee found in a history.
type Violation struct {
	// Kind is one of the Violation* constants.
	Kind   string
	Detail string
}

// Kinds of violation.
const (
	// ViolationStaleWrite: a write was accepted with a token lower than one
	// accepted before it on the same key.
	ViolationStaleWrite = "stale-write-accepted"
	// ViolationLostIncrement: the final counter is not the number of
	// acknowledged increments (allowing for those of unknown outcome).
	ViolationLostIncrement = "lost-increment"
	// ViolationLostAppend: an acknowledged append is missing from the list,
	// or an item appears twice.
	ViolationLostAppend = "lost-append"
	// ViolationTokenOrder: grants' tokens are not strictly increasing in
	// real-time order, or a token was granted twice.
	ViolationTokenOrder = "token-order"
	// ViolationNotLinearizable: the KV history has no linearization.
	ViolationNotLinearizable = "not-linearizable"
	// ViolationNodeDied: a server the checker restarted exited by itself
	// (it could not reopen its data after a kill, for example).
	ViolationNodeDied = "node-died"
	// ViolationBeliefOverlap: two workers believed they held the exclusive
	// lock at once (their holds overlap), though the resource may have
	// refused one of them.
	ViolationBeliefOverlap = "belief-overlap"
	// ViolationWriteAfterHold: a worker started a write after its belief in
	// the grant had ended: the client wrote under a grant it knew, or could
	// have known, to be gone.
	ViolationWriteAfterHold = "write-after-hold"
	// ViolationCorruptionMissed: a server started on a raft log damaged in
	// the middle, or stopped without saying why.
	ViolationCorruptionMissed = "corruption-missed"
	// ViolationTornTailRefused: a server would not start after a write
	// torn at the end of its log, which it must drop.
	ViolationTornTailRefused = "torn-tail-refused"
	// ViolationOtherGroup: a node of the run answers for another group than
	// the one the run began with: a second group was founded (by a node
	// whose data dir was wiped, say), which counts tokens of its own.
	ViolationOtherGroup = "other-group"
	// ViolationForeignMember: the group took a node of another group as a
	// member, or that node stopped leading its own group when asked to.
	ViolationForeignMember = "foreign-member-accepted"
)

// Final is the state read at the end of a run.
type Final struct {
	Counter string
	List    string
	// MoveFrom and MoveTo are the txn workload's keys (see txn.go).
	MoveFrom, MoveTo string
	SQLCounter       int64
	HaveSQL          bool
}

// Analysis is what the checker concluded from a history.
type Analysis struct {
	Ops, Acquires, Writes, Rejected, Unknown int
	AckedIncrements, UnknownIncrements       int
	// AckedMoves and UnknownMoves count the txn workload's moves.
	AckedMoves, UnknownMoves int
	// Holds counts the workers' beliefs that they held a grant; those of
	// unknown end (the worker was killed) are checked against nothing.
	Holds, HoldsUnknownEnd int
	Violations             []Violation
	// Linearizability is porcupine's verdict: "ok", "illegal" or "unknown" (timed out).
	Linearizability string
	// LinearizationInfo is porcupine's, for its visualization.
	LinearizationInfo porcupine.LinearizationInfo
}

// Analyze checks a history and the final state against fence's guarantees,
// and the workers' holds against exclusion: no two workers believe they
// hold the lock at once, and none starts a write after its belief ended.
func Analyze(ops []Op, final Final, prefix string, timeout time.Duration) Analysis {
	var a Analysis
	for _, op := range ops {
		if op.Kind == "hold" {
			continue // not a call: counted by checkBeliefs
		}
		a.Ops++
		switch op.Result {
		case Rejected:
			a.Rejected++
		case Unknown:
			a.Unknown++
		}
		if op.Kind == "acquire" && op.Result == OK {
			a.Acquires++
		}
		if (op.Kind == "put" || op.Kind == "txn") && op.Result == OK {
			a.Writes++
		}
	}
	a.checkTokenOrder(ops)
	a.checkBeliefs(ops)
	a.checkStaleWrites(ops, prefix)
	a.checkCounter(ops, final, prefix+"counter")
	a.checkList(ops, final, prefix+"list")
	a.checkMoves(ops, final)
	if final.HaveSQL {
		a.checkSQL(ops, final)
	}
	a.checkLinearizable(ops, final, prefix, timeout)
	return a
}

func (a *Analysis) violate(kind, format string, args ...any) {
	a.Violations = append(a.Violations, Violation{Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// checkTokenOrder: no token granted twice (to different grants), and a
// grant that completed before another was invoked has the lower token.
func (a *Analysis) checkTokenOrder(ops []Op) {
	var grants []Op
	seen := map[uint64]Op{}
	for _, op := range ops {
		if op.Kind != "acquire" || op.Result != OK {
			continue
		}
		if prev, dup := seen[op.Token]; dup && (prev.Worker != op.Worker || prev.Run != op.Run) {
			a.violate(ViolationTokenOrder, "token %d was granted to worker %d and to worker %d", op.Token, prev.Worker, op.Worker)
		}
		seen[op.Token] = op
		grants = append(grants, op)
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].End < grants[j].End })
	// For each grant, every grant completed before it was invoked must have
	// a lower token: compare with the highest token completed so far.
	byStart := append([]Op(nil), grants...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start < byStart[j].Start })
	var maxDone uint64
	var maxOp Op
	k := 0
	for _, g := range byStart {
		for k < len(grants) && grants[k].End < g.Start {
			if grants[k].Token > maxDone {
				maxDone, maxOp = grants[k].Token, grants[k]
			}
			k++
		}
		if g.Token < maxDone && !sameGrant(g, maxOp) {
			a.violate(ViolationTokenOrder, "worker %d was granted token %d after worker %d had been granted %d", g.Worker, g.Token, maxOp.Worker, maxDone)
		}
	}
}

// sameGrant: a re-acquire by the same process returns the same grant.
func sameGrant(x, y Op) bool { return x.Worker == y.Worker && x.Run == y.Run && x.Token == y.Token }

// checkStaleWrites: on each key, the writes that were accepted, in commit
// (revision) order, carry non-decreasing tokens of the grants they were
// made under; a move's (txn's) writes are two, at its revision.
func (a *Analysis) checkStaleWrites(ops []Op, prefix string) {
	byKey := map[string][]Op{}
	for _, op := range ops {
		switch {
		case op.Kind == "put" && op.Result == OK:
			byKey[op.Key] = append(byKey[op.Key], op)
		case op.Kind == "txn" && op.Result == OK:
			for _, w := range txnWrites(op, prefix) {
				byKey[w.Key] = append(byKey[w.Key], w)
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		puts := byKey[key]
		sort.Slice(puts, func(i, j int) bool { return puts[i].Rev < puts[j].Rev })
		var highest Op
		for _, p := range puts {
			if p.Token < highest.Token {
				a.violate(ViolationStaleWrite, "%s: worker %d's write with token %d (revision %d) was accepted after worker %d's with token %d (revision %d)",
					key, p.Worker, p.Token, p.Rev, highest.Worker, highest.Token, highest.Rev)
			} else {
				highest = p
			}
		}
	}
}

func (a *Analysis) checkCounter(ops []Op, final Final, key string) {
	for _, op := range ops {
		if op.Kind == "put" && op.Key == key {
			switch op.Result {
			case OK:
				a.AckedIncrements++
			case Unknown:
				a.UnknownIncrements++
			}
		}
	}
	got, _ := strconv.Atoi(final.Counter)
	if got < a.AckedIncrements || got > a.AckedIncrements+a.UnknownIncrements {
		a.violate(ViolationLostIncrement, "the counter is %d after %d acknowledged increments (and %d of unknown outcome): %d lost",
			got, a.AckedIncrements, a.UnknownIncrements, a.AckedIncrements-got)
	}
}

func (a *Analysis) checkList(ops []Op, final Final, key string) {
	have := map[string]int{}
	for _, item := range listItems(final.List) {
		have[item]++
		if have[item] == 2 {
			a.violate(ViolationLostAppend, "%s: item %s appears twice", key, item)
		}
	}
	lost := 0
	var example string
	for _, op := range ops {
		if op.Kind != "put" || op.Key != key || op.Result != OK {
			continue
		}
		items := listItems(op.Value)
		if len(items) == 0 {
			continue
		}
		if item := items[len(items)-1]; have[item] == 0 {
			lost++
			example = item
		}
	}
	if lost > 0 {
		a.violate(ViolationLostAppend, "%s: %d acknowledged appends are missing from the final list (for example %s)", key, lost, example)
	}
}

func (a *Analysis) checkSQL(ops []Op, final Final) {
	acked, unknown := 0, 0
	for _, op := range ops {
		if op.Kind == "sql-incr" {
			switch op.Result {
			case OK:
				acked++
			case Unknown:
				unknown++
			}
		}
	}
	if got := int(final.SQLCounter); got < acked || got > acked+unknown {
		a.violate(ViolationLostIncrement, "the SQL counter is %d after %d acknowledged increments (and %d of unknown outcome)", got, acked, unknown)
	}
}

// register is porcupine's model of one key: a string register, where a put
// of unknown outcome may or may not have happened.
var register = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, output interface{}) []interface{} {
		in, out, st := input.(regInput), output.(regOutput), state.(string)
		switch {
		case !in.put:
			if out.value == st {
				return []interface{}{st}
			}
			return nil
		case out.unknown:
			return []interface{}{st, in.value}
		}
		return []interface{}{in.value}
	},
	Equal: func(a, b interface{}) bool { return a.(string) == b.(string) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(regInput), output.(regOutput)
		if in.put {
			if out.unknown {
				return fmt.Sprintf("put(%q)?", in.value)
			}
			return fmt.Sprintf("put(%q)", in.value)
		}
		return fmt.Sprintf("get() -> %q", out.value)
	},
}

type regInput struct {
	key   string
	put   bool
	value string
}

type regOutput struct {
	value   string
	unknown bool
}

// checkLinearizable feeds the KV operations to porcupine: gets and puts
// that completed, puts of unknown outcome as open-ended, refused puts left
// out (they had no effect), and the final reads.
func (a *Analysis) checkLinearizable(ops []Op, final Final, prefix string, timeout time.Duration) {
	var hist []porcupine.Operation
	var last int64
	for _, op := range ops {
		last = max(last, op.Start, op.End)
	}
	for _, op := range ops {
		if op.Key != prefix+"counter" && op.Key != prefix+"list" {
			continue
		}
		switch {
		case op.Kind == "get" && op.Result == OK:
			hist = append(hist, porcupine.Operation{ClientId: op.Worker*1000 + op.Run, Input: regInput{key: op.Key}, Call: op.Start, Output: regOutput{value: op.Value}, Return: op.End})
		case op.Kind == "put" && op.Result == OK:
			hist = append(hist, porcupine.Operation{ClientId: op.Worker*1000 + op.Run, Input: regInput{key: op.Key, put: true, value: op.Value}, Call: op.Start, Output: regOutput{}, Return: op.End})
		case op.Kind == "put" && op.Result == Unknown:
			hist = append(hist, porcupine.Operation{ClientId: op.Worker*1000 + op.Run, Input: regInput{key: op.Key, put: true, value: op.Value}, Call: op.Start, Output: regOutput{unknown: true}, Return: math.MaxInt64})
		}
	}
	// The final reads, after everything else.
	for key, value := range map[string]string{prefix + "counter": final.Counter, prefix + "list": final.List} {
		hist = append(hist, porcupine.Operation{ClientId: -1, Input: regInput{key: key}, Call: last + 1, Output: regOutput{value: value}, Return: last + 2})
	}
	res, info := porcupine.CheckOperationsVerbose(register.ToModel(), hist, timeout)
	a.Linearizability, a.LinearizationInfo = string(res), info
	if res == porcupine.Illegal {
		a.violate(ViolationNotLinearizable, "the KV history of %d operations has no linearization", len(hist))
	}
}
