package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A scenario is a row of scenarios.json: what every client must do.
type scenario struct {
	ID   string
	Says string
}

func scenarios(t *testing.T) []scenario {
	t.Helper()
	data, err := os.ReadFile("scenarios.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct{ Scenarios []scenario }
	if err := json.Unmarshal(data, &table); err != nil {
		t.Fatalf("scenarios.json: %v", err)
	}
	if len(table.Scenarios) == 0 {
		t.Fatal("scenarios.json has no scenarios")
	}
	return table.Scenarios
}

// tool returns the path of a command a suite needs. Without it the test is
// skipped, but under CI, whose scripts install it, it fails.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := name + " is missing: " + install
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// suite runs another language's test suite in dir with the control's
// address in FENCE_TEST_CONTROL, and fails unless it passes and its output
// shows a passed test of every scenario (passed builds the pattern of one).
func suite(t *testing.T, dir string, passed func(id string) *regexp.Regexp, name string, args ...string) {
	t.Helper()
	ctl := newControl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	abs, err := filepath.Abs("scenarios.json")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "FENCE_TEST_CONTROL="+ctl.url, "FENCE_TEST_SCENARIOS="+abs, "FENCE_BIN="+fenceBin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	text := out.String()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, text)
	}
	for _, sc := range scenarios(t) {
		if !passed(sc.ID).MatchString(text) {
			t.Errorf("the suite shows no passed test of scenario %s", sc.ID)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("%s %s:\n%s", name, strings.Join(args, " "), text)
	}
}
