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
	m := client.NewMutex(mustSession(t, node.Client()), "job")
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

// fence lock refuses a command that cannot be run before it creates a
// session or takes the lock, with a shell's status: 127 not found, 126
// not executable.
func TestLockRefusesACommandItCannotRun(t *testing.T) {
	node := fencetest.Start(t)
	notExecutable := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  string
		code int
	}{
		{"/nonexistent", exitNotFound},
		{"no-such-command-for-fence", exitNotFound},
		{notExecutable, exitNoExec},
	} {
		code, _, stderr := runFence(t, "--endpoints", node.Endpoint(), "lock", "job", "--", tc.cmd, "arg")
		if code != tc.code || !strings.Contains(stderr, "fence: cannot run "+tc.cmd) || !strings.Contains(stderr, "no lock was taken") {
			t.Errorf("fence lock job -- %s: exit %d, stderr %q; want %d, refused", tc.cmd, code, stderr, tc.code)
		}
	}
	st, err := node.Client().Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.GetLastToken() != 0 || st.GetSessions() != 0 {
		t.Errorf("after refused commands, the node has handed out token %d and has %d sessions; want none", st.GetLastToken(), st.GetSessions())
	}
}
