package cli

import (
	"os"
	"testing"

	"github.com/fencelock/fence/internal/testutil/testbin"
)

// fenceBin is the fence binary built by TestMain, for tests that run fence
// as a real process (and that fence runs again, as its workers).
var fenceBin string

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &fenceBin)) }
