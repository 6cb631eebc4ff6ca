package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
)

// runFence runs the fence command in this process and returns its exit
// code, standard output and standard error.
func runFence(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// runJSON runs fence with args, which must succeed (or exit with want),
// and decodes its standard output as JSON.
func runJSON(t *testing.T, want int, args ...string) map[string]any {
	t.Helper()
	code, stdout, stderr := runFence(t, args...)
	if code != want {
		t.Fatalf("fence %v: exit %d, want %d; stderr: %s", args, code, want, stderr)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("fence %v printed no JSON object: %v\n%s", args, err, stdout)
	}
	return out
}

// fence bench --json gives each run's measurements, and those of idle
// sessions; it leaves no session open. (Every --json's shape:
// TestEveryJSONIsTheAPIs.)
func TestBenchJSON(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	got := runJSON(t, 0, append(ep, "bench", "--json", "--duration", "200ms", "--clients", "1", "--workload", "own")...)
	results, _ := got["results"].([]any)
	if len(results) != 1 {
		t.Fatalf("bench --json = %v, want one result", got)
	}
	r := results[0].(map[string]any)
	if r["workload"] != "own" || r["clients"] != float64(1) || r["cyclesPerSecond"].(float64) <= 0 || !strings.HasSuffix(r["p50"].(string), "s") {
		t.Errorf("bench --json result = %v", r)
	}

	// With idle sessions: each run again while they are held, and the
	// server's memory before and after creating them.
	got = runJSON(t, 0, append(ep, "bench", "--json", "--duration", "200ms", "--clients", "1", "--workload", "own", "--idle-sessions", "40", "--idle-conns", "2")...)
	results, _ = got["results"].([]any)
	if len(results) != 2 || results[0].(map[string]any)["idleSessions"] != float64(0) || results[1].(map[string]any)["idleSessions"] != float64(40) {
		t.Fatalf("bench --idle-sessions --json = %v, want a run without and one with 40 idle sessions", got)
	}
	idle, _ := got["idle"].(map[string]any)
	if idle["sessions"] != float64(40) || idle["rssBefore"].(float64) <= 0 || idle["rssAfter"].(float64) <= 0 {
		t.Errorf("bench --idle-sessions --json idle = %v, want 40 sessions and the server's RSS", idle)
	}
	got = runJSON(t, 0, append(ep, "sessions", "list", "--json")...)
	sessions, _ := got["sessions"].([]any)
	for _, s := range sessions {
		if owner, _ := s.(map[string]any)["owner"].(string); strings.HasPrefix(owner, "fence bench") {
			t.Errorf("bench left session %v open", s)
		}
	}
}
