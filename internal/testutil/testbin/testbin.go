// Package testbin builds the programs that tests run as real processes:
// the fence binary (and the example), with the race detector when the test
// binary itself has it, so that races in the child processes are caught too.
// It is test scaffolding (internal/testutil/): only tests import it.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// Race reports whether the running binary was built with -race.
func Race() bool {
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

// Build builds the package (an import path) into dir/name, with -race when
// the caller runs with it, and returns the binary's path.
func Build(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if Race() {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// Fence builds the fence command into a new temporary directory and
// returns the binary and a function that removes the directory.
func Fence() (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "fence-test-bin-")
	if err != nil {
		return "", nil, err
	}
	bin, err = Build(dir, "fence", "github.com/fencelock/fence/cmd/fence")
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// RunWithFence is the TestMain of tests that run fence as a real process:
// it builds the fence command, sets *bin to its path, runs the tests and
// removes the binary. It returns the exit code for os.Exit.
func RunWithFence(m *testing.M, bin *string) int {
	path, cleanup, err := Fence()
	if err != nil {
		fmt.Fprintln(os.Stderr, "building fence for the tests:", err)
		return 1
	}
	defer cleanup()
	*bin = path
	return m.Run()
}
