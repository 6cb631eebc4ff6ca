package check_test

import (
	"testing"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/check"
)

func TestGrantGaps(t *testing.T) {
	grant := func(ms int) check.Op {
		return check.Op{Kind: "acquire", Result: check.OK, Start: at(ms - 1), End: at(ms)}
	}
	ops := []check.Op{grant(0), grant(10), grant(1010), grant(1020), grant(1320)}
	faults := []check.FaultEvent{
		{Kind: check.FaultKillLeader, Start: time.Unix(0, at(20)), End: time.Unix(0, at(30))},
		{Kind: check.FaultPause, Start: time.Unix(0, at(1100)), End: time.Unix(0, at(1200))},
	}
	got := check.GrantGaps(ops, faults)
	want := map[string]time.Duration{check.FaultKillLeader: time.Second, check.FaultPause: 300 * time.Millisecond, "none": 10 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("gaps %v, want %v", got, want)
	}
	for k, d := range want {
		if got[k] != d {
			t.Errorf("gap for %s = %v, want %v", k, got[k], d)
		}
	}
}
