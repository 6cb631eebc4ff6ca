package check_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/check"
)

// move is an accepted move of the txn workload, at revision rev with token.
func move(worker int, token, rev uint64, value string, ms int, result string) check.Op {
	return check.Op{Worker: worker, Run: 1, Kind: "txn", Key: "p/move/from", Value: value, Token: token, Rev: rev, Start: at(ms), End: at(ms + 1), Result: result}
}

func moveRead(worker int, value string, ms int) check.Op {
	return check.Op{Worker: worker, Run: 1, Kind: "txn-read", Key: "p/move/from", Value: value, Start: at(ms), End: at(ms + 1), Result: check.OK}
}

// The analysis of the txn workload, on constructed histories: a read or
// an end that does not sum to 0 (a txn applied in part), a move lost, a
// stale txn accepted, and the moves of unknown outcome it allows for.
func TestAnalyzeMoves(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ops   []check.Op
		final check.Final
		want  []string // the violations' kinds, with a word of their detail
	}{{
		name:  "moves that all landed",
		ops:   []check.Op{moveRead(1, "0,0", 0), move(1, 5, 3, "-1,1", 1, check.OK), moveRead(2, "-1,1", 5), move(2, 6, 4, "-2,2", 6, check.OK)},
		final: check.Final{MoveFrom: "-2", MoveTo: "2"},
	}, {
		name:  "a move of unknown outcome that did not land",
		ops:   []check.Op{move(1, 5, 3, "-1,1", 1, check.OK), move(2, 6, 0, "-2,2", 6, check.Unknown)},
		final: check.Final{MoveFrom: "-1", MoveTo: "1"},
	}, {
		name:  "no move at all (a group at an older protocol refuses them)",
		ops:   []check.Op{move(1, 5, 0, "-1,1", 1, check.Rejected)},
		final: check.Final{},
	}, {
		name:  "a read that saw half a move",
		ops:   []check.Op{moveRead(1, "-1,0", 0)},
		final: check.Final{},
		want:  []string{check.ViolationTornTxn + " sum to -1"},
	}, {
		name:  "a move applied in half",
		ops:   []check.Op{move(1, 5, 3, "-1,1", 1, check.OK)},
		final: check.Final{MoveFrom: "-1", MoveTo: "0"},
		want:  []string{check.ViolationTornTxn + " sum to -1"},
	}, {
		name:  "a move lost",
		ops:   []check.Op{move(1, 5, 3, "-1,1", 1, check.OK), move(2, 6, 4, "-1,1", 6, check.OK)},
		final: check.Final{MoveFrom: "-1", MoveTo: "1"},
		want:  []string{check.ViolationLostIncrement + " 2 acknowledged moves"},
	}, {
		name:  "a stale move accepted after a newer one",
		ops:   []check.Op{move(1, 6, 3, "-1,1", 1, check.OK), move(2, 5, 4, "-2,2", 6, check.OK)},
		final: check.Final{MoveFrom: "-2", MoveTo: "2"},
		want:  []string{check.ViolationStaleWrite + " p/move/from", check.ViolationStaleWrite + " p/move/to"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			a := check.Analyze(tc.ops, tc.final, "p/", time.Second)
			got := a.Violations
			if len(got) != len(tc.want) {
				t.Fatalf("violations %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				kind, word, _ := strings.Cut(w, " ")
				if got[i].Kind != kind || !strings.Contains(got[i].Detail, word) {
					t.Errorf("violation %d: %s: %s; want %s saying %q", i, got[i].Kind, got[i].Detail, kind, word)
				}
			}
		})
	}
}
