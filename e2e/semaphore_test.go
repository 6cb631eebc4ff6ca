package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
)

// inSemaphore is run by every `fence lock --permits 2` of the semaphore
// test, as sh -c inSemaphore sh DIR. Each holder marks itself inside, then
// counts the holders inside: the last to enter sees them all.
const inSemaphore = `
mkdir "$1/in-$FENCE_TOKEN" || exit 98
n=$(ls -d "$1"/in-* | wc -l)
echo "$FENCE_TOKEN $n" >> "$1/log"
[ "$n" -le 2 ] || { echo "$n holders inside a semaphore of 2" >&2; exit 99; }
sleep 0.5
rmdir "$1/in-$FENCE_TOKEN"
`

// Six `fence lock --permits 2` processes on one semaphore: never more than
// two run at once, two do run together, and every one runs with a token of
// its own.
func TestSemaphoreProcesses(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.addr)
	ctx := context.Background()
	const n = 6
	const name = "e2e/pool"
	dir := t.TempDir()

	// Hold both permits while the processes queue, then free them together.
	var gates []*client.Semaphore
	for i := range 2 {
		g := client.NewSemaphore(newSession(t, c, 30*time.Second, fmt.Sprintf("e2e gate %d", i)), name, 2)
		if _, err := g.Acquire(ctx); err != nil {
			t.Fatalf("gate %d: %v", i, err)
		}
		gates = append(gates, g)
	}
	procs := make([]*process, n)
	for i := range procs {
		args := append(srv.endpoints(), "lock", "--permits", "2", name, "--", "sh", "-c", inSemaphore, "sh", dir)
		procs[i] = startFence(t, fmt.Sprintf("fence lock --permits 2 #%d", i), args...)
	}
	waitFor(t, 20*time.Second, "six processes to queue for the semaphore", func() bool {
		for _, p := range procs {
			p.failIfExited(t)
		}
		return len(lockInfo(t, c, name).GetWaiters()) == n
	})
	if got := lockInfo(t, c, name).GetPermits(); got != 2 {
		t.Fatalf("the lock lists %d permits, want 2", got)
	}
	for _, g := range gates {
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAllExitZero(t, procs, 30*time.Second)
	lines, data := readLog(t, dir)
	tokens := map[uint64]bool{}
	most := 0
	for _, line := range lines {
		var token uint64
		var inside int
		if _, err := fmt.Sscanf(line, "%d %d", &token, &inside); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if tokens[token] {
			t.Errorf("token %d was handed out twice", token)
		}
		tokens[token] = true
		most = max(most, inside)
	}
	if len(tokens) != n {
		t.Errorf("%d holders ran, want %d:\n%s", len(tokens), n, data)
	}
	if most != 2 {
		t.Errorf("at most %d holders were inside at once, want 2 (a semaphore of 2, not a mutex):\n%s", most, data)
	}
	checkNotListed(t, c, name, "after every process exited")
}
