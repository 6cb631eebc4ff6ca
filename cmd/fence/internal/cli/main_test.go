package cli

import (
	"context"
	"os"
	"testing"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/testbin"
)

// fenceBin is the fence binary built by TestMain, for tests that run fence
// as a real process (and that fence runs again, as its workers).
var fenceBin string

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &fenceBin)) }

// mustSession opens a session on c, and fails the test if it cannot.
func mustSession(t *testing.T, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	s, err := c.NewSession(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mustLock takes the mutex name in session s and returns its grant, and
// fails the test if it cannot.
func mustLock(t *testing.T, s *client.Session, name string, opts ...client.LockOption) *client.Grant {
	t.Helper()
	g, err := client.NewMutex(s, name, opts...).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return g
}
