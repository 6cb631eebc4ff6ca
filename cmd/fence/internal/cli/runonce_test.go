package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// fence run-once exits as its help says, and records KEY done only when
// its command succeeded under a lock it still held.
func TestRunOnceExitStatus(t *testing.T) {
	node := fencetest.Start(t)
	ep := node.Endpoint()
	kv := node.Client().KV()
	dir := t.TempDir()
	marker := func(name string) string { return filepath.Join(dir, name) }
	notExecutable := marker("not-executable")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// revokeOwnSession is a command that ends its own fence run-once's
	// session, as an operator's fence sessions revoke would: the lock is
	// lost while the command runs (then it sleeps) or just as it exits.
	revokeOwnSession := func(then string) []string {
		return []string{"sh", "-c", `"$0" --endpoints "$1" sessions revoke "$FENCE_SESSION" >/dev/null; ` + then, fenceBin, ep}
	}
	holdLock(t, node, runOnceLock("held"))

	for _, tc := range []struct {
		name    string
		args    []string // after --endpoints; KEY is the first argument after the flags
		key     string
		code    int
		stderr  string
		absent  string // stderr must not say this
		done    bool   // KEY is recorded done afterwards
		ran     string // a marker the command creates, which must exist afterwards
		skipped string // a marker the command would create, which must not exist
	}{
		{name: "ran", key: "ran", args: []string{"run-once", "ran", "--", "sh", "-c", `echo "$FENCE_LOCK $FENCE_TOKEN" > "$0"`, marker("ran")},
			code: 0, stderr: "fence run-once: sh succeeded; ran is recorded done (token ", done: true, ran: marker("ran")},
		{name: "already done", key: "ran", args: []string{"run-once", "ran", "--", "touch", marker("ran-again")},
			code: 0, stderr: "fence run-once: ran is already done (ran on ", done: true, skipped: marker("ran-again")},
		{name: "command fails", key: "fails", args: []string{"run-once", "fails", "--", "sh", "-c", "exit 3"},
			code: 3, stderr: "sh failed (exit status 3); fails is not recorded done, the next run runs sh again"},
		{name: "failed key stays open", key: "fails", args: []string{"run-once", "fails", "--", "touch", marker("fails")},
			code: 0, stderr: "is recorded done", done: true, ran: marker("fails")},
		{name: "record deleted under the lock", key: "fails", args: []string{"lock", runOnceLock("fails"), "--", fenceBin, "--endpoints", ep, "kv", "del", runOnceDoneKey("fails")},
			code: 0},
		{name: "runs again once deleted", key: "fails", args: []string{"run-once", "fails", "--", "touch", marker("fails-again")},
			code: 0, stderr: "is recorded done", done: true, ran: marker("fails-again")},
		{name: "command killed", key: "killed", args: []string{"run-once", "killed", "--", "sh", "-c", "kill -KILL $$"},
			code: 128 + 9, stderr: "sh failed (signal: killed)"},
		{name: "not found", key: "missing", args: []string{"run-once", "missing", "--", "no-such-command-for-fence", "x"},
			code: exitNotFound, stderr: `fence: cannot run no-such-command-for-fence: exec: "no-such-command-for-fence": executable file not found in $PATH (nothing was run, no lock was taken)`},
		{name: "not executable", key: "missing", args: []string{"run-once", "missing", "--", notExecutable},
			code: exitNoExec, stderr: "permission denied (nothing was run, no lock was taken)"},
		{name: "try while held", key: "held", args: []string{"run-once", "--try", "held", "--", "touch", marker("held")},
			code: exitTimeout, stderr: `lock "run-once/held" is held by session `, skipped: marker("held")},
		{name: "timeout while held", key: "held", args: []string{"run-once", "--timeout", "200ms", "held", "--", "touch", marker("held")},
			code: exitTimeout, stderr: `lock "run-once/held" was not granted within 200ms`, skipped: marker("held")},
		{name: "lock lost while running", key: "lost", args: append([]string{"run-once", "--ttl", "1s", "--grace", "100ms", "lost", "--"}, revokeOwnSession("sleep 30")...),
			code: exitLockLost, stderr: "fence run-once: lost is not recorded done; the next run runs sh again", absent: "fence lock:"},
		{name: "lock lost as it exits", key: "lost", args: append([]string{"run-once", "--ttl", "1s", "--grace", "100ms", "lost", "--"}, revokeOwnSession("exit 0")...),
			code: exitLockLost, stderr: "the next run runs sh again"},
		{name: "lost key stays open", key: "lost", args: []string{"run-once", "lost", "--", "touch", marker("lost")},
			code: 0, stderr: "is recorded done", done: true, ran: marker("lost")},
		{name: "usage", key: "usage", args: []string{"run-once", "usage", "true"},
			code: exitFailure, stderr: runOnceUsage},
		{name: "empty key", key: "", args: []string{"run-once", "", "--", "true"},
			code: exitFailure, stderr: "a KEY that is not empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoints := ep
			if tc.code == exitNotFound || tc.code == exitNoExec {
				endpoints = "127.0.0.1:1" // nothing listens: no lock can be taken
			}
			code, stderr := runFenceWithCommand(append([]string{"--endpoints", endpoints}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("fence %q: exit %d, stderr:\n%s\nwant exit %d and %q", tc.args, code, stderr, tc.code, tc.stderr)
			}
			if tc.absent != "" && strings.Contains(stderr, tc.absent) {
				t.Errorf("fence %q: stderr says %q, of another command:\n%s", tc.args, tc.absent, stderr)
			}
			if tc.ran != "" {
				if _, err := os.Stat(tc.ran); err != nil {
					t.Errorf("the command did not run: %v", err)
				}
			}
			if tc.skipped != "" {
				if _, err := os.Stat(tc.skipped); err == nil {
					t.Errorf("the command ran")
				}
			}
			if tc.key == "" {
				return
			}
			done, err := kv.Get(context.Background(), runOnceDoneKey(tc.key))
			if err != nil {
				t.Fatal(err)
			}
			if (done != nil) != tc.done {
				t.Fatalf("%s recorded done: %v, want %v (%v)", tc.key, done != nil, tc.done, done)
			}
		})
	}

	// The record is written with the lock and token the command was given.
	env, err := os.ReadFile(marker("ran"))
	if err != nil {
		t.Fatal(err)
	}
	done, err := kv.Get(context.Background(), runOnceDoneKey("ran"))
	if err != nil || done == nil {
		t.Fatalf("reading the record: %v, %v", done, err)
	}
	if got := fmt.Sprintf("%s %d\n", done.GetLock(), done.GetToken()); got != string(env) {
		t.Errorf("the record is fenced by %q, the command had FENCE_LOCK and FENCE_TOKEN %q", got, env)
	}
}

// runFenceWithCommand runs the fence command in this process, as runFence
// does, with one standard error (a syncbuf.Buffer) that fence and the command it runs both
// write to (exec copies the command's output from a goroutine of its own),
// and returns the exit code and what fence and the command wrote there.
func runFenceWithCommand(args ...string) (int, string) {
	var stdout, stderr syncbuf.Buffer
	code := Run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return code, stderr.String()
}

// holdLock takes the lock name for the rest of the test.
func holdLock(t *testing.T, node *fencetest.Node, name string) {
	t.Helper()
	mustLock(t, mustSession(t, node.Client()), name)
}
