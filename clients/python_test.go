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
	python, dir := pythonClient(t)
	t.Setenv("PYTHONPATH", filepath.Join(dir, "src"))
	suite(t, "python", pythonPassed, python, "-S", "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
}

// pythonClient returns python3 and the Python client's folder,
// clients/python, as an absolute path; its package is in src.
func pythonClient(t *testing.T) (python, dir string) {
	t.Helper()
	python = tool(t, "python3", "install Python 3.9 or newer (Debian: apt-get install python3; scripts/test.sh does)")
	dir, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	return python, dir
}

// pythonPassed matches unittest's verbose report of a passed
// test_scenario_ID: "test_scenario_x (module.Class.test_scenario_x) ... ok",
// where lines that Python printed to stderr meanwhile (a warning) may come
// between the "..." and the "ok", which then stands on a line of its own.
// Those lines (a path, an indented source line, "ResourceWarning: ...")
// never start with "t", as the next test's report does, so a skipped or
// failed test is not taken for passed by the "ok" of the next one.
func pythonPassed(id string) *regexp.Regexp {
	name := "test_scenario_" + strings.ReplaceAll(id, "-", "_")
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` \([^)]*\) \.\.\. (?:(?:[^t\n][^\n]*)?\n)*?ok$`)
}

func TestPythonPassed(t *testing.T) {
	re := pythonPassed("paused-holder")
	for _, tc := range []struct {
		out  string
		want bool
	}{
		{"test_scenario_paused_holder (tests.test_scenarios.ScenarioTest.test_scenario_paused_holder) ... ok\n", true},
		{"test_scenario_paused_holder (tests.test_scenarios.ScenarioTest) ... ok\n", true}, // Python 3.9
		{"test_scenario_paused_holder (m.C.test_scenario_paused_holder) ... /x.py:1: ResourceWarning: unclosed\n  del x\nok\n", true},
		{"test_scenario_paused_holder (m.C.test_scenario_paused_holder) ... skipped 'no control'\ntest_y (m.C.test_y) ... warn\nok\n", false},
		{"test_scenario_paused_holder (m.C.test_scenario_paused_holder) ... FAIL\n\nRan 6 tests\n\nOK\n", false},
		{"test_scenario_paused_holder_too (m.C.test_scenario_paused_holder_too) ... ok\n", false},
	} {
		if got := re.MatchString(tc.out); got != tc.want {
			t.Errorf("%q: matched %v, want %v", tc.out, got, tc.want)
		}
	}
}
