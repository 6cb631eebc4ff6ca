package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `fence leader --watch` follows an election run by `fence elect`
// processes: a leader that is interrupted resigns at once; one killed with
// SIGKILL loses its leadership, and its record, when its session expires,
// and the waiting campaigner takes over.
func TestElectAndWatchProcesses(t *testing.T) {
	srv := startServer(t)
	watch := startFence(t, "fence leader --watch", append(srv.endpoints(), "leader", "--watch", "sched")...)
	seen := func(what string, lines ...string) {
		t.Helper()
		waitFor(t, 20*time.Second, what, func() bool {
			watch.failIfExited(t)
			return strings.HasSuffix(watch.stdout.String(), strings.Join(lines, ""))
		})
	}
	seen("the watch to report no leader", "(no leader)\n")

	a := startFence(t, "fence elect node-a", append(srv.endpoints(), "elect", "--ttl", "2s", "sched", "node-a")...)
	seen("node-a to lead", "node-a\ttoken 1\n")
	// The watch can see the grant before node-a's own answer reaches it:
	// it is interrupted as a leader only once it says it leads.
	waitFor(t, 20*time.Second, "node-a to say it leads", func() bool {
		a.failIfExited(t)
		return strings.Contains(a.stdout.String(), "elected leader of sched")
	})
	b := startFence(t, "fence elect node-b", append(srv.endpoints(), "elect", "--ttl", "2s", "sched", "node-b")...)
	a.signal(t, syscall.SIGTERM)
	if code := a.waitExit(t, 10*time.Second); code != 0 {
		t.Errorf("interrupted fence elect exited %d, want 0; stderr:\n%s", code, a.Stderr())
	}
	seen("node-b to follow node-a", "node-a\ttoken 1\n", "(no leader)\n", "node-b\ttoken 2\n")

	c := startFence(t, "fence elect node-c", append(srv.endpoints(), "elect", "--ttl", "2s", "sched", "node-c")...)
	_ = b.Kill() // SIGKILL: no resignation; the session expires
	start := time.Now()
	seen("node-c to follow node-b once its session expired", "node-b\ttoken 2\n", "(no leader)\n", "node-c\ttoken 3\n")
	if d := time.Since(start); d < time.Second {
		t.Errorf("node-c led %v after node-b was killed, before node-b's session could expire", d)
	}
	c.failIfExited(t)
}

// `fence kv put --hold` keeps a registration while it runs: the key goes
// at once when the process is interrupted, and when its session expires
// after a SIGKILL.
func TestHeldKeyGoesWithTheProcess(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.addr)
	present := func(key string) bool {
		kv, err := c.KV().Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return kv != nil
	}
	hold := func(key string) *process {
		p := startFence(t, "fence kv put --hold "+key, append(srv.endpoints(), "kv", "put", "--hold", "--ttl", "1s", key, "10.0.0.5:8080")...)
		waitFor(t, 20*time.Second, key+" to be registered", func() bool {
			p.failIfExited(t)
			return present(key)
		})
		return p
	}
	a := hold("svc/a")
	a.signal(t, syscall.SIGINT)
	if code := a.waitExit(t, 10*time.Second); code != 0 {
		t.Errorf("interrupted fence kv put --hold exited %d, want 0; stderr:\n%s", code, a.Stderr())
	}
	if present("svc/a") {
		t.Error("svc/a outlived its interrupted holder")
	}
	b := hold("svc/b")
	_ = b.Kill()
	killed := time.Now()
	waitFor(t, 20*time.Second, "svc/b to go with its expired session", func() bool { return !present("svc/b") })
	if d := time.Since(killed); d < 500*time.Millisecond {
		t.Errorf("svc/b went %v after its holder was killed, before its session could expire", d)
	}
}
