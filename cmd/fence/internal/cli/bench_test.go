package cli

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
)

// fence bench --idle-procs holds its idle sessions in processes of their
// own, and --expire kills some of those with SIGKILL: the service expires
// exactly their sessions, and the bench closes the rest when it ends.
func TestBenchExpiryStorm(t *testing.T) {
	node := fencetest.Start(t)
	cmd := exec.Command(fenceBin, "--endpoints", node.Endpoint(), "bench", "--json", "--workload", "own",
		"--clients", "2", "--duration", "200ms", "--idle-sessions", "30", "--idle-procs", "3", "--idle-ttl", "1s", "--expire", "20")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fence bench: %v\n%s", err, out)
	}
	var got struct {
		Results []benchJSON `json:"results"`
		Storm   *struct {
			Sessions, Expired int
			ExpiredIn         string
			Before, During    benchJSON
		} `json:"storm"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("fence bench printed no JSON: %v\n%s", err, out)
	}
	if len(got.Results) != 2 || got.Results[1].Idle != 30 {
		t.Errorf("results = %+v, want a run without and one with 30 idle sessions", got.Results)
	}
	s := got.Storm
	if s == nil || s.Sessions != 20 || s.Expired != 20 || s.ExpiredIn == "" {
		t.Fatalf("storm = %+v, want 20 sessions expired, and when", s)
	}
	if s.Before.Rate <= 0 || s.During.Rate <= 0 || s.During.Clients != 2 || s.During.Idle != 30 {
		t.Errorf("storm = %+v, want the 2 workers' runs before and during the storm", s)
	}
	// The 10 sessions of the holder left alive were closed, not left to
	// expire: none of the bench's sessions remain.
	sessions, err := node.Client().Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range sessions {
		if strings.HasPrefix(info.GetOwner(), "fence bench") {
			t.Errorf("bench left session %d (%s) open", info.GetSessionId(), info.GetOwner())
		}
	}
}

// Bad combinations of the storm's flags are refused before anything runs.
func TestBenchStormFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--expire", "10"},
		{"--idle-sessions", "10", "--idle-procs", "3"},
		{"--idle-sessions", "30", "--idle-procs", "3", "--expire", "15"},
		{"--idle-sessions", "30", "--idle-procs", "3", "--expire", "40"},
		{"--idle-sessions", "-1"},
		{"--clients", "0"},
	} {
		code, _, stderr := runFence(t, append([]string{"--endpoints", "127.0.0.1:1", "bench"}, args...)...)
		if code == 0 || !strings.Contains(stderr, "--") {
			t.Errorf("fence bench %v: exit %d, stderr %q; want a refusal naming the flag", args, code, stderr)
		}
	}
}
