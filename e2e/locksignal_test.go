package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// signalScript is the command of the signal tests, run as
// sh -c signalScript sh DIR: it records the signal it gets and exits with a
// status naming it, once its own child (a sleep, in the foreground, which
// writes its pid to DIR/grandchild) has exited.
const signalScript = `
trap 'echo INT > "$1/got"; exit 7' INT
trap 'echo TERM > "$1/got"; exit 8' TERM
trap 'echo HUP > "$1/got"; exit 9' HUP
sh -c 'echo $$ > "$0/grandchild.tmp"; mv "$0/grandchild.tmp" "$0/grandchild"; exec sleep 60' "$1"
`

// fence lock passes SIGINT, SIGTERM and SIGHUP on to its command's process
// group as they came, then releases the lock and exits with the command's
// status. SIGINT used to reach the command as SIGTERM, SIGHUP killed fence
// lock and left the lock held until its TTL ran out, and only the command
// was signalled, not what it started.
func TestLockForwardsSignalsToTheGroup(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.addr)
	for _, tc := range []struct {
		sig  syscall.Signal
		got  string
		code int
	}{
		{syscall.SIGINT, "INT", 7},
		{syscall.SIGTERM, "TERM", 8},
		{syscall.SIGHUP, "HUP", 9},
	} {
		t.Run(tc.got, func(t *testing.T) {
			name := "e2e/signal-" + tc.got
			dir := t.TempDir()
			// A TTL far longer than the test: only a release frees the lock.
			p := startFence(t, "fence lock", append(srv.endpoints(), "lock", "--ttl", "60s", "--grace", "10s", name, "--", "sh", "-c", signalScript, "sh", dir)...)
			waitFor(t, 20*time.Second, "fence lock to run its command", func() bool {
				p.failIfExited(t)
				_, err := os.Stat(filepath.Join(dir, "grandchild"))
				return err == nil
			})
			data, err := os.ReadFile(filepath.Join(dir, "grandchild"))
			if err != nil {
				t.Fatal(err)
			}
			grandchild, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				t.Fatal(err)
			}
			p.signal(t, tc.sig)
			if code := p.waitExit(t, 20*time.Second); code != tc.code {
				t.Errorf("fence lock got %v: exit %d, want the command's %d; stderr:\n%s", tc.sig, code, tc.code, p.Stderr())
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "got")); strings.TrimSpace(string(got)) != tc.got {
				t.Errorf("fence lock got %v, its command got %q, want %s", tc.sig, got, tc.got)
			}
			if h := lockInfo(t, c, name).GetHolders(); len(h) != 0 {
				t.Errorf("fence lock exited on %v, and %s is still held: %v", tc.sig, name, h)
			}
			waitFor(t, 10*time.Second, fmt.Sprintf("the command's own child (pid %d), in its group, to die", grandchild), func() bool {
				return !alive(grandchild)
			})
		})
	}
}

// A command that ignores the signal gets --grace to exit, then SIGKILL.
func TestLockGivesTheGraceThenKills(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.addr)
	const name = "e2e/signal-deaf"
	started := filepath.Join(t.TempDir(), "started")
	p := startFence(t, "fence lock", append(srv.endpoints(), "lock", "--ttl", "60s", "--grace", "500ms", name, "--",
		"sh", "-c", `trap '' INT HUP; touch "$0"; while :; do sleep 0.05; done`, started)...)
	waitFor(t, 20*time.Second, "fence lock to run its command", func() bool {
		p.failIfExited(t)
		_, err := os.Stat(started)
		return err == nil
	})
	p.signal(t, syscall.SIGHUP)
	if code := p.waitExit(t, 20*time.Second); code != 128+int(syscall.SIGKILL) {
		t.Errorf("fence lock exited %d, want %d (its command killed); stderr:\n%s", code, 128+int(syscall.SIGKILL), p.Stderr())
	}
	if !strings.Contains(p.Stderr(), "sending SIGKILL") {
		t.Errorf("fence lock does not say it killed its command:\n%s", p.Stderr())
	}
	if h := lockInfo(t, c, name).GetHolders(); len(h) != 0 {
		t.Errorf("%s is still held: %v", name, h)
	}
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: a zombie counts as alive
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
