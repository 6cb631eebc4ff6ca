package clients_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestTypeScriptClient builds the TypeScript client (clients/typescript)
// and runs its node:test suite against real nodes through the control
// service. It installs the dependencies from the committed lockfile when
// node_modules is missing or older than the lockfile.
func TestTypeScriptClient(t *testing.T) {
	node, dir := buildTypeScript(t)
	tests, err := filepath.Glob(filepath.Join(dir, "build", "test", "*.test.js"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("npm run build made no tests in %s/build/test (%v)", dir, err)
	}
	// A test that hangs fails after a minute, rather than the suite after eight.
	args := []string{"--test", "--test-reporter=tap", "--test-timeout=60000"}
	for _, f := range tests {
		rel, err := filepath.Rel(dir, f)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, rel)
	}
	suite(t, dir, func(id string) *regexp.Regexp {
		// A TAP line of a passed test, not a skipped or todo one.
		return regexp.MustCompile(`(?m)^\s*ok \d+ - scenario ` + regexp.QuoteMeta(id) + `\s*$`)
	}, node, args...)
}

// buildTypeScript builds the TypeScript client, its tests and examples,
// and returns node and the client's folder.
func buildTypeScript(t *testing.T) (node, dir string) {
	t.Helper()
	node = tool(t, "node", "install Node 20 or newer (Debian: apt-get install nodejs npm; scripts/test.sh does)")
	npm := tool(t, "npm", "install npm (Debian: apt-get install npm; scripts/test.sh does)")
	dir = "typescript"
	if tsDepsStale(t, filepath.Join(dir, "package-lock.json"), filepath.Join(dir, "node_modules", ".package-lock.json")) {
		tsRun(t, dir, npm, "ci", "--no-audit", "--no-fund")
	}
	tsRun(t, dir, npm, "run", "build")
	return node, dir
}

// tsDepsStale reports whether the installed tree (npm's record of it) is missing
// or older than the lockfile.
func tsDepsStale(t *testing.T, lockfile, installed string) bool {
	t.Helper()
	want, err := os.Stat(lockfile)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.Stat(installed)
	return err != nil || have.ModTime().Before(want.ModTime())
}

// tsRun runs a command in dir and fails the test with its output if it fails.
func tsRun(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out.String())
	}
}
