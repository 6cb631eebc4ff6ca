package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// fenceBin is the fence binary built by TestMain, for tests that run fence
// as a real process (and that fence runs again, as its workers).
var fenceBin string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fence-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	fenceBin = filepath.Join(dir, "fence")
	args := []string{"build", "-o", fenceBin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	args = append(args, "github.com/fencelock/fence/cmd/fence")
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "cli tests: go %s: %v\n", strings.Join(args, " "), err)
		return 1
	}
	return m.Run()
}

// raceEnabled reports whether this test binary was built with -race; the
// fence binary is then built with -race too.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
