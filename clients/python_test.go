package clients_test

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPythonClient runs the Python client's suite (clients/python/tests)
// against real nodes, through the control service: every scenario of
// scenarios.json as test_scenario_ID, and the unit tests of the rest. The
// package is imported from its source folder with python3 -S, which reads
// no site-packages: the client needs nothing but the standard library.
func TestPythonClient(t *testing.T) {
	python := tool(t, "python3", "install Debian's python3 (apt-get install python3; scripts/test.sh does)")
	src, err := filepath.Abs(filepath.Join("python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", src)
	suite(t, "python", pythonPassed, python, "-S", "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
}

// pythonPassed matches unittest's verbose line of a passed
// test_scenario_ID: "test_scenario_x (module.Class.test_scenario_x) ... ok".
func pythonPassed(id string) *regexp.Regexp {
	name := "test_scenario_" + strings.ReplaceAll(id, "-", "_")
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` \([^)]*\) \.\.\. ok$`)
}
