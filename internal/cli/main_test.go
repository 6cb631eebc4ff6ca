package cli

import (
	"fmt"
	"os"
	"testing"

	"github.com/fencelock/fence/internal/testbin"
)

// fenceBin is the fence binary built by TestMain, for tests that run fence
// as a real process (and that fence runs again, as its workers).
var fenceBin string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	bin, cleanup, err := testbin.Fence()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli tests:", err)
		return 1
	}
	defer cleanup()
	fenceBin = bin
	return m.Run()
}
