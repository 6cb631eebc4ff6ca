package check_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/check"
)

// at is an instant of a constructed history, ms milliseconds into it.
func at(ms int) int64 {
	return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(ms) * time.Millisecond).UnixNano()
}

// released is a hold that ended with its release.
func released(worker, run int, token uint64, from, to int) check.Op {
	return check.Op{Worker: worker, Run: run, Kind: "hold", Key: "check", Token: token, Start: at(from), End: at(to), Learned: at(to), Result: check.OK}
}

// lost is a hold whose grant ended with its session, at safe-until, which
// the worker learned at learned.
func lost(worker, run int, token uint64, from, safeUntil, learned int) check.Op {
	h := released(worker, run, token, from, safeUntil)
	h.Learned, h.Err = at(learned), "fence: session lost"
	return h
}

// killed is a hold whose worker was killed: History.Ops gives it an
// unknown result and no end.
func killed(worker, run int, token uint64, from int) check.Op {
	return check.Op{Worker: worker, Run: run, Kind: "hold", Key: "check", Token: token, Start: at(from), Result: check.Unknown}
}

func write(kind string, worker, run int, token uint64, ms int) check.Op {
	return check.Op{Worker: worker, Run: run, Kind: kind, Key: "other/key", Token: token, Start: at(ms), End: at(ms + 1), Result: check.Rejected}
}

// The analysis of holds, on constructed histories: overlapping beliefs,
// writes after a belief ended, and the holds it cannot judge.
func TestAnalyzeBeliefs(t *testing.T) {
	const overlap, afterHold = check.ViolationBeliefOverlap, check.ViolationWriteAfterHold
	for _, tc := range []struct {
		name string
		ops  []check.Op
		// want is, for each violation, its kind and what its detail says.
		want               [][]string
		holds, unknownEnds int
	}{{
		name:  "a lost session's safe-until overlaps the next holder",
		ops:   []check.Op{lost(1, 1, 41, 0, 300, 900), released(3, 2, 43, 250, 400)},
		want:  [][]string{{overlap, "lock check", "worker 1 (run 1, token 41)", "worker 3 (run 2, token 43)", "for 50ms", "safe-until; learned 600ms later: fence: session lost", "(released)"}},
		holds: 2,
	}, {
		name:  "holds that touch do not overlap",
		ops:   []check.Op{released(1, 1, 41, 0, 200), released(2, 1, 42, 200, 300), lost(3, 1, 43, 300, 400, 400)},
		holds: 3,
	}, {
		name:  "a worker learning late does not stretch its belief past safe-until",
		ops:   []check.Op{lost(1, 1, 41, 0, 200, 2000), released(2, 1, 42, 500, 600)},
		holds: 2,
	}, {
		name:        "a killed worker's hold has an unknown end and is checked against nothing",
		ops:         []check.Op{killed(1, 1, 41, 0), released(2, 1, 42, 500, 600), write("put", 1, 1, 41, 700)},
		holds:       2,
		unknownEnds: 1,
	}, {
		name:  "the same worker process holds one grant after another",
		ops:   []check.Op{released(1, 1, 41, 0, 100), released(1, 1, 42, 100, 200)},
		holds: 2,
	}, {
		name:  "a restarted worker is another process",
		ops:   []check.Op{lost(1, 1, 41, 0, 300, 300), released(1, 2, 42, 200, 400)},
		want:  [][]string{{overlap, "worker 1 (run 1, token 41)", "worker 1 (run 2, token 42)", "for 100ms"}},
		holds: 2,
	}, {
		name:  "a grant lost as it was returned is empty",
		ops:   []check.Op{lost(1, 1, 41, 100, 50, 100), released(2, 1, 42, 60, 200)},
		holds: 2,
	}, {
		name:  "three holds at once: each pair",
		ops:   []check.Op{released(1, 1, 41, 0, 300), released(2, 1, 42, 100, 400), released(3, 1, 43, 200, 500)},
		want:  [][]string{{overlap, "token 41", "token 42", "for 200ms"}, {overlap, "token 41", "token 43", "for 100ms"}, {overlap, "token 42", "token 43", "for 200ms"}},
		holds: 3,
	}, {
		name:  "writes within their hold",
		ops:   []check.Op{released(1, 1, 41, 0, 300), write("put", 1, 1, 41, 100), write("sql-incr", 1, 1, 41, 299)},
		holds: 1,
	}, {
		name: "writes started after their hold ended",
		ops: []check.Op{lost(1, 1, 41, 0, 300, 800), write("put", 1, 1, 41, 100), write("put", 1, 1, 41, 350),
			released(2, 1, 42, 400, 500), write("sql-incr", 2, 1, 42, 520)},
		want: [][]string{
			{afterHold, "worker 1 (run 1) started a put of other/key with token 41", "50ms after its belief in that grant had ended"},
			{afterHold, "worker 2 (run 1) started a sql-incr", "token 42", "20ms after"}},
		holds: 2,
	}, {
		name: "a release that failed, then the same grant again",
		ops: []check.Op{released(1, 1, 41, 0, 100), {Worker: 1, Run: 1, Kind: "release", Key: "check", Token: 41, Start: at(100), End: at(150), Result: check.Unknown},
			released(1, 1, 41, 200, 300), write("put", 1, 1, 41, 250)},
		holds: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			a := check.Analyze(tc.ops, check.Final{}, "prefix/", time.Second)
			var got []check.Violation
			for _, v := range a.Violations {
				if v.Kind == check.ViolationBeliefOverlap || v.Kind == check.ViolationWriteAfterHold {
					got = append(got, v)
				} else {
					t.Errorf("unexpected %s: %s", v.Kind, v.Detail)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d violations, want %d: %v", len(got), len(tc.want), got)
			}
			for i, parts := range tc.want {
				if got[i].Kind != parts[0] {
					t.Errorf("violation %d is %s, want %s: %s", i, got[i].Kind, parts[0], got[i].Detail)
				}
				for _, p := range parts[1:] {
					if !strings.Contains(got[i].Detail, p) {
						t.Errorf("violation %d does not say %q: %s", i, p, got[i].Detail)
					}
				}
			}
			if a.Holds != tc.holds || a.HoldsUnknownEnd != tc.unknownEnds {
				t.Errorf("counted %d holds, %d of unknown end; want %d, %d", a.Holds, a.HoldsUnknownEnd, tc.holds, tc.unknownEnds)
			}
		})
	}
}
