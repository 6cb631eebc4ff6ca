package check

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// Beliefs: every worker reports, for each grant, the interval in which it
// believed it held the lock (a "hold" op). The lock is exclusive, so two
// workers' holds must not overlap, and a worker must not start a write
// after its hold ended. The fenced resource refuses the writes of a holder
// whose belief outlived its grant, so these checks see what the stale-write
// check cannot: a client told it still holds a lock someone else holds.

// holdKey names one grant's hold in one worker process.
type holdKey struct {
	worker, run int
	token       uint64
}

// checkBeliefs counts the holds and reports overlapping holds and writes
// started after their hold ended. A hold of unknown end (its worker was
// killed) is counted, and checked against nothing.
func (a *Analysis) checkBeliefs(ops []Op) {
	var known []Op
	for _, op := range ops {
		if op.Kind != "hold" {
			continue
		}
		a.Holds++
		if op.Result != OK || op.End == 0 {
			a.HoldsUnknownEnd++
			continue
		}
		known = append(known, op)
	}
	a.checkOverlaps(known)
	a.checkWritesAfterHold(ops, known)
}

// checkOverlaps reports every two holds of one lock, by different worker
// processes, that overlap. Holds that ended before they started (the grant
// was lost as Lock returned it) are empty.
func (a *Analysis) checkOverlaps(holds []Op) {
	byLock := map[string][]Op{}
	for _, h := range holds {
		if h.End > h.Start {
			byLock[h.Key] = append(byLock[h.Key], h)
		}
	}
	for _, lock := range slices.Sorted(maps.Keys(byLock)) {
		hs := byLock[lock]
		sort.Slice(hs, func(i, j int) bool { return hs[i].Start < hs[j].Start })
		for i, x := range hs {
			for _, y := range hs[i+1:] {
				if y.Start >= x.End {
					break // and so do all that start later
				}
				if x.Worker != y.Worker || x.Run != y.Run {
					a.violate(ViolationBeliefOverlap, "lock %s: worker %d (run %d, token %d) and worker %d (run %d, token %d) both believed they held it for %v, from %s to %s; %s, %s",
						lock, x.Worker, x.Run, x.Token, y.Worker, y.Run, y.Token, overlap(x, y), clock(y.Start), clock(min(x.End, y.End)), describeHold(x), describeHold(y))
				}
			}
		}
	}
}

func overlap(x, y Op) time.Duration {
	return time.Duration(min(x.End, y.End) - max(x.Start, y.Start)).Round(time.Microsecond)
}

// describeHold says when a worker believed it held a grant, and what ended
// the belief.
func describeHold(h Op) string {
	why := "released"
	switch {
	case h.Err != "" && h.Learned > h.End:
		why = fmt.Sprintf("safe-until; learned %v later: %s", time.Duration(h.Learned-h.End).Round(time.Millisecond), h.Err)
	case h.Err != "":
		why = h.Err
	}
	return fmt.Sprintf("worker %d from %s to %s (%s)", h.Worker, clock(h.Start), clock(h.End), why)
}

// checkWritesAfterHold reports the writes a worker started after the hold
// of their grant had ended. Writes whose hold is unknown are not checked.
func (a *Analysis) checkWritesAfterHold(ops, holds []Op) {
	byGrant := map[holdKey][]Op{}
	for _, h := range holds {
		k := holdKey{h.Worker, h.Run, h.Token}
		byGrant[k] = append(byGrant[k], h)
	}
	for _, op := range ops {
		if op.Kind != "put" && op.Kind != "txn" && op.Kind != "sql-incr" {
			continue
		}
		h, ok := holdOf(byGrant[holdKey{op.Worker, op.Run, op.Token}], op)
		if ok && op.Start > h.End {
			a.violate(ViolationWriteAfterHold, "worker %d (run %d) started a %s of %s with token %d at %s, %v after its belief in that grant had ended (at %s)",
				op.Worker, op.Run, op.Kind, op.Key, op.Token, clock(op.Start), time.Duration(op.Start-h.End).Round(time.Microsecond), clock(h.End))
		}
	}
}

// holdOf returns the latest of a grant's holds that started before op (a
// worker whose release failed may be given the same grant again).
func holdOf(holds []Op, op Op) (Op, bool) {
	var best Op
	found := false
	for _, h := range holds {
		if h.Start <= op.Start && (!found || h.Start > best.Start) {
			best, found = h, true
		}
	}
	return best, found
}

// clock formats an instant of the run as a time of day, to the microsecond.
func clock(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000000") }
