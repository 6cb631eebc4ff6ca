package check_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/check"
	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/internal/testutil/testbin"
)

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &check.FenceBinary)) }

func run(t *testing.T, cfg check.Config) *check.Result {
	t.Helper()
	cfg.Binary = check.FenceBinary
	cfg.DataDir = t.TempDir()
	cfg.Log = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+2*time.Minute)
	defer cancel()
	res, err := check.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations, %d faults, %d acknowledged increments, linearizability %s",
		res.Analysis.Ops, len(res.Faults), res.Analysis.AckedIncrements, res.Analysis.Linearizability)
	return res
}

// With fencing, pauses past the TTL, worker kills and server kills break
// nothing: zero violations, txns' moves included.
func TestCheckFindsNoViolationWithFencing(t *testing.T) {
	res := run(t, check.Config{Workers: 4, Duration: 20 * time.Second, Seed: 1, TTL: time.Second, FaultInterval: 1500 * time.Millisecond})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	kinds := map[string]int{}
	for _, f := range res.Faults {
		kinds[f.Kind]++
	}
	if len(res.Faults) < 5 || res.Analysis.Acquires < 50 || res.Analysis.AckedMoves < 20 || res.Analysis.Linearizability != "Ok" {
		t.Errorf("the run proved little: faults %v, %d grants, %d txn moves, linearizability %q", kinds, res.Analysis.Acquires, res.Analysis.AckedMoves, res.Analysis.Linearizability)
	}
	refused := 0
	for _, op := range res.Ops {
		if op.Kind == "txn" && op.Result == check.Rejected {
			refused++
		}
	}
	t.Logf("txn moves: %d acknowledged, %d of unknown outcome, %d refused; the keys end at %s and %s",
		res.Analysis.AckedMoves, res.Analysis.UnknownMoves, refused, res.Final.MoveFrom, res.Final.MoveTo)
	var svg bytes.Buffer
	if err := res.ReportSVG(&svg); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	lanes := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the report is not well-formed SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "text" {
			for _, a := range se.Attr {
				if a.Name.Local == "class" && a.Value == "lane" {
					lanes++
				}
			}
		}
	}
	if lanes != 5 { // 4 workers and the server
		t.Errorf("the report has %d lanes, want 5", lanes)
	}
}

// Without fencing, the same pauses lose updates, and the checker says so:
// it can fail.
func TestCheckFindsLostUpdatesWithoutFencing(t *testing.T) {
	// About ten pauses: each lands in a holder's read-modify-write about
	// half the time, so that the test cannot miss them all by chance.
	res := run(t, check.Config{Workers: 4, Duration: 25 * time.Second, Seed: 2, TTL: time.Second, FaultInterval: 500 * time.Millisecond,
		Faults: []string{check.FaultPause}, Unsafe: true})
	kinds := map[string]int{}
	for _, v := range res.Analysis.Violations {
		kinds[v.Kind]++
	}
	if kinds[check.ViolationLostIncrement]+kinds[check.ViolationLostAppend] == 0 || kinds[check.ViolationStaleWrite] == 0 {
		t.Fatalf("no lost update found without fencing: violations %v after %d pauses", kinds, len(res.Faults))
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// The same with a fenced PostgreSQL counter: every acknowledged increment
// is there, through pauses and kills.
func TestCheckPostgres(t *testing.T) {
	dsn := pgtest.DSN(t)
	res := run(t, check.Config{Workers: 3, Duration: 10 * time.Second, Seed: 3, TTL: time.Second, FaultInterval: 1500 * time.Millisecond, Postgres: dsn})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	if !res.Final.HaveSQL || res.Final.SQLCounter == 0 {
		t.Fatalf("the SQL counter was not exercised: %+v", res.Final)
	}
}

// A three-node group through leader kills and partitions of the leader
// from the majority: zero violations.
func TestCheckClusterLeaderFaults(t *testing.T) {
	res := run(t, check.Config{Nodes: 3, Workers: 3, Duration: 15 * time.Second, Seed: 4, TTL: time.Second, FaultInterval: time.Second,
		Faults: []string{check.FaultKillLeader, check.FaultPartition, check.FaultPause}})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	kinds := map[string]int{}
	for _, f := range res.Faults {
		kinds[f.Kind]++
	}
	if kinds[check.FaultKillLeader]+kinds[check.FaultPartition] == 0 || res.Analysis.Acquires < 20 {
		t.Errorf("the run proved little: faults %v, %d grants", kinds, res.Analysis.Acquires)
	}
}

// A three-node group whose leader is paused past the election of another
// and then continued. The fault must have been injected and the workload
// must have gone on around it. Until the server stops answering
// keepalives as a deposed leader, two workers may believe they hold the
// lock at once (belief-overlap); those are logged, not failed on.
func TestCheckClusterPauseLeader(t *testing.T) {
	res := run(t, check.Config{Nodes: 3, Workers: 4, Duration: 15 * time.Second, Seed: 5, FaultInterval: time.Second,
		Faults: []string{check.FaultPauseLeader}})
	for _, v := range res.Analysis.Violations {
		if v.Kind == check.ViolationBeliefOverlap {
			t.Logf("%s: %s", v.Kind, v.Detail)
			continue
		}
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	paused := 0
	for _, f := range res.Faults {
		if f.Kind == check.FaultPauseLeader && f.End.Sub(f.Start) > time.Second {
			paused++
		}
	}
	if paused == 0 || res.Analysis.Acquires < 20 || res.Analysis.Holds < 20 || res.Analysis.Linearizability != "Ok" {
		t.Errorf("the run proved little: %d leader pauses of %d faults, %d grants, %d holds, linearizability %q",
			paused, len(res.Faults), res.Analysis.Acquires, res.Analysis.Holds, res.Analysis.Linearizability)
	}
}

// A three-node group whose leader's or followers' disks fill up and are
// freed again: the full node says so, and nothing is lost.
func TestCheckClusterDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the disk-full fault mounts a tmpfs per node, which needs root")
	}
	res := run(t, check.Config{Nodes: 3, Workers: 3, Duration: 12 * time.Second, Seed: 6, TTL: time.Second, FaultInterval: 1500 * time.Millisecond,
		Faults: []string{check.FaultDiskFull}})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	reported := 0
	for _, f := range res.Faults {
		if f.Kind == check.FaultDiskFull && f.Note != "" {
			reported++
		}
	}
	if reported == 0 || res.Analysis.Acquires < 20 || res.Analysis.Linearizability != "Ok" {
		t.Errorf("the run proved little: %d disk-full faults of %d reported by their node, %d grants, linearizability %q",
			reported, len(res.Faults), res.Analysis.Acquires, res.Analysis.Linearizability)
	}
}

// A three-node group whose followers, and leader, lose their data dirs and
// are started again with their flags: each is added again and is a voter
// again by itself, even when the leader that adds it again is killed
// halfway (a later leader finishes), no node answers for another group,
// and nothing is lost. Seed 40 draws a wipe of the leader, one of a
// follower, and one of a follower whose leader is killed as it adds it
// again, first.
func TestCheckClusterWipe(t *testing.T) {
	res := run(t, check.Config{Nodes: 3, Workers: 3, Duration: 20 * time.Second, Seed: 40, TTL: time.Second, FaultInterval: time.Second,
		Faults: []string{check.FaultWipe}})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	var back, leaders, interrupted int
	for _, f := range res.Faults {
		if f.Kind != check.FaultWipe {
			continue
		}
		switch {
		case strings.HasSuffix(f.Target, "(leader)"):
			leaders++
		case strings.Contains(f.Note, "the leader, killed"):
			interrupted++
		}
		if f.Outcome == check.OutcomeRejoined {
			back++
		} else {
			t.Errorf("%s %s: %s (%s)", f.Kind, f.Target, f.Outcome, f.Note)
		}
	}
	if back < 2 || leaders == 0 || interrupted == 0 || res.Analysis.Acquires < 20 || res.Analysis.Linearizability != "Ok" {
		t.Errorf("the run proved little: %d wiped nodes back as voters of %d faults, %d of them the leader, %d with the leader killed as it added one again, %d grants, linearizability %q",
			back, len(res.Faults), leaders, interrupted, res.Analysis.Acquires, res.Analysis.Linearizability)
	}
}

// A three-node group asked to add a node of another group, as a voter or
// a non-voter, refuses it every time, naming both groups.
func TestCheckClusterForeignAdd(t *testing.T) {
	res := run(t, check.Config{Nodes: 3, Workers: 3, Duration: 10 * time.Second, Seed: 8, TTL: time.Second, FaultInterval: time.Second,
		Faults: []string{check.FaultForeignAdd}})
	for _, v := range res.Analysis.Violations {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	refused := map[bool]int{}
	for _, f := range res.Faults {
		if f.Kind == check.FaultForeignAdd && f.Outcome != check.OutcomeRefused {
			t.Errorf("%s %s: %s (%s)", f.Kind, f.Target, f.Outcome, f.Note)
		}
		refused[strings.HasSuffix(f.Target, "as a voter")]++
	}
	if refused[true] == 0 || refused[false] == 0 || res.Analysis.Acquires < 20 {
		t.Errorf("the run proved little: %d additions as a voter and %d as a non-voter refused, %d grants", refused[true], refused[false], res.Analysis.Acquires)
	}
}

// The check's nodes are set by their flags alone: fence serve settings in
// the user's environment (a config file that would stop a node, an address
// it cannot listen on) are not theirs.
func TestCheckNodesTakeNoSettingsFromTheEnvironment(t *testing.T) {
	bad := t.TempDir() + "/fence.yaml"
	if err := os.WriteFile(bad, []byte("no-such-setting: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FENCE_CONFIG", bad)
	t.Setenv("FENCE_LISTEN_METRICS", "256.0.0.1:1")
	res := run(t, check.Config{Workers: 1, Duration: 2 * time.Second, Seed: 3, TTL: time.Second, Faults: []string{check.FaultPause}, FaultInterval: time.Hour})
	if res.Analysis.Acquires == 0 {
		t.Error("no grant in the run")
	}
}
