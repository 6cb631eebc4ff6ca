package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
)

// fence lock --try fails at once with 124 while the lock is held, without
// running the command, and runs it when the lock is free.
func TestLockTry(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	ran := filepath.Join(t.TempDir(), "ran")
	s, err := node.Client().NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := client.NewMutex(s, "job")
	if _, err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"lock", "--try", "job", "--", "touch", ran},
		{"lock", "--try", "--shared", "job", "--", "touch", ran},
	} {
		code, _, stderr := runFence(t, append(ep, args...)...)
		if code != exitTimeout || !strings.Contains(stderr, "held") {
			t.Errorf("fence %v while job is held: exit %d, want %d; stderr %q", args, code, exitTimeout, stderr)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("fence %v ran its command while job is held", args)
		}
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runFence(t, append(ep, "lock", "--try", "job", "--", "touch", ran)...); code != 0 {
		t.Fatalf("fence lock --try on a free lock: exit %d; stderr %q", code, stderr)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Errorf("fence lock --try on a free lock did not run its command: %v", err)
	}
	if code, _, stderr := runFence(t, append(ep, "lock", "--try", "--timeout", "1s", "job", "--", "true")...); code == 0 || !strings.Contains(stderr, "try") {
		t.Errorf("fence lock --try --timeout: exit %d, stderr %q; want them refused together", code, stderr)
	}
}

// Every mistake in fence lock's arguments gets the usage line.
func TestLockUsage(t *testing.T) {
	for _, args := range [][]string{
		{"lock"},
		{"lock", "job"},
		{"lock", "job", "true"},
		{"lock", "job", "--"},
		{"lock", "--", "true"},
		{"lock", "a", "b", "--", "true"},
	} {
		code, _, stderr := runFence(t, append([]string{"--endpoints", "127.0.0.1:1"}, args...)...)
		if code != exitFailure || !strings.Contains(stderr, "usage: fence lock [flags] NAME -- CMD [ARGS...]") {
			t.Errorf("fence %q: exit %d, stderr %q; want 1 and the usage line", args, code, stderr)
		}
	}
}
