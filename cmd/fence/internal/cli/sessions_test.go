package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
)

// fence sessions list shows each session's owner, TTL and locks; revoke
// closes one, and its lock goes to the next waiter.
func TestSessionsListAndRevoke(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	ctx := context.Background()
	holder := mustSession(t, node.Client(), client.WithTTL(30*time.Second), client.WithOwner("stuck job"))
	g := mustLock(t, holder, "orders")
	waiter := mustSession(t, node.Client(), client.WithOwner("next job"))
	granted := make(chan error, 1)
	go func() {
		_, err := client.NewMutex(waiter, "orders").Lock(ctx)
		granted <- err
	}()

	code, stdout, stderr := runFence(t, append(ep, "sessions", "list")...)
	lines := strings.Split(stdout, "\n")
	if code != 0 || len(lines) < 2 || !slices.Equal(strings.Fields(lines[1])[:2], []string{fmt.Sprint(holder.ID()), "30s"}) ||
		!strings.HasSuffix(lines[1], fmt.Sprintf("orders(%d)  stuck job", g.Token())) {
		t.Fatalf("sessions list: exit %d, stdout:\n%s\nstderr %s; want session %d of stuck job holding orders(%d)", code, stdout, stderr, holder.ID(), g.Token())
	}
	got := runJSON(t, 0, append(ep, "sessions", "list", "--json")...)
	list, _ := got["sessions"].([]any)
	if len(list) != 2 {
		t.Fatalf("sessions list --json = %v, want two sessions", got)
	}
	first := list[0].(map[string]any)
	held, _ := first["held"].([]any)
	if first["sessionId"] != jsonUint(holder.ID()) || first["owner"] != "stuck job" || first["ttl"] != "30s" || first["expiresIn"] == nil || len(held) != 1 || held[0].(map[string]any)["token"] != jsonUint(g.Token()) {
		t.Errorf("sessions list --json, first = %v", first)
	}

	// Bad input: a clear error, nothing revoked.
	for _, args := range [][]string{{"sessions", "revoke", "x"}, {"sessions", "revoke", "0"}, {"sessions", "revoke"}} {
		if code, _, stderr := runFence(t, append(ep, args...)...); code == 0 || stderr == "" {
			t.Errorf("fence %v: exit %d, stderr %q; want an error", args, code, stderr)
		}
	}
	if code, _, stderr := runFence(t, append(ep, "sessions", "revoke", "999")...); code != 1 || !strings.Contains(stderr, "no session 999") {
		t.Errorf("revoke of a session that does not exist: exit %d, stderr %q", code, stderr)
	}
	select {
	case err := <-granted:
		t.Fatalf("the waiter got orders before any revoke: %v", err)
	default:
	}

	code, stdout, stderr = runFence(t, append(ep, "sessions", "revoke", fmt.Sprint(holder.ID()), fmt.Sprint(holder.ID()))...)
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("revoked session %d (stuck job), released orders(%d)", holder.ID(), g.Token())) {
		t.Fatalf("sessions revoke: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if n := strings.Count(stdout, "revoked session"); n != 1 {
		t.Fatalf("a session named twice was reported revoked %d times:\n%s", n, stdout)
	}
	if err := <-granted; err != nil {
		t.Fatalf("after the holder's session was revoked, the waiter's Lock: %v", err)
	}
}
