package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
)

// With nothing listening, a client command fails after --dial-timeout,
// saying what it tried and how to start a node; it used to wait out the
// whole 15 s retry budget.
func TestNothingListeningFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, args := range [][]string{
		{"status"},
		{"kv", "get", "k"},
		{"lock", "--timeout", "2s", "x", "--", "true"},
	} {
		var stdout, stderr bytes.Buffer
		start := time.Now()
		code := Run(context.Background(), append([]string{"--endpoints", addr, "--dial-timeout", "500ms"}, args...), strings.NewReader(""), &stdout, &stderr)
		took := time.Since(start)
		if code == 0 {
			t.Errorf("fence %v with nothing listening exited 0", args)
		}
		if took > 3*time.Second {
			t.Errorf("fence %v with nothing listening took %v to fail", args, took)
		}
		for _, want := range []string{addr, "fence serve", "--endpoints"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("fence %v: stderr does not say %q:\n%s", args, want, stderr.String())
			}
		}
	}
}

// --command-timeout bounds a command that answers at once.
func TestCommandTimeoutBoundsACommand(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := Run(context.Background(), []string{"--endpoints", ln.Addr().String(), "--command-timeout", "700ms", "kv", "get", "k"}, strings.NewReader(""), &stdout, &stderr)
	if code == 0 || time.Since(start) > 3*time.Second {
		t.Fatalf("kv get against a node that never answers: exit %d after %v (stderr %s)", code, time.Since(start), stderr.String())
	}
}

// fence locks --limit lists the first locks and says that more follow.
func TestLocksLimit(t *testing.T) {
	node := fencetest.Start(t)
	c := node.Client()
	s := mustSession(t, c)
	for _, name := range []string{"a", "b", "c"} {
		mustLock(t, s, name)
	}
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"--endpoints", node.Endpoint(), "locks", "--limit", "2"}, strings.NewReader(""), &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "a ") || !strings.HasPrefix(lines[2], "b ") {
		t.Fatalf("locks --limit 2: exit %d, stdout:\n%s", code, stdout.String())
	}
	if !strings.Contains(stderr.String(), "more locks follow") {
		t.Errorf("locks --limit 2 of 3 does not say more follow: %q", stderr.String())
	}
}

// fence locks shows who holds each lock as a person knows them: the
// holder's owner, with the session id that fence sessions revoke takes.
func TestLocksShowsWhoHolds(t *testing.T) {
	node := fencetest.Start(t)
	job := mustSession(t, node.Client(), client.WithOwner("nightly job on db1"))
	g := mustLock(t, job, "orders")
	anonymous := mustSession(t, node.Client())
	h := mustLock(t, anonymous, "reports")
	code, stdout, stderr := runFence(t, "--endpoints", node.Endpoint(), "locks")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("locks: exit %d, stdout\n%s\nstderr %s", code, stdout, stderr)
	}
	for i, want := range [][]string{
		{"LOCK", "TOKEN", "WAITERS", "HOLDER"},
		{"orders", fmt.Sprint(g.Token()), "0", fmt.Sprintf("nightly job on db1 (session %d)", job.ID())},
		{"reports", fmt.Sprint(h.Token()), "0", fmt.Sprintf("session %d", anonymous.ID())},
	} {
		if got := regexp.MustCompile(`\s{2,}`).Split(lines[i], -1); !slices.Equal(got, want) {
			t.Errorf("locks line %d = %q, want %q", i, got, want)
		}
	}
}

// fence status lists a node once, however its endpoint is spelled: here
// as localhost, while the node advertises 127.0.0.1.
func TestStatusListsANodeOnce(t *testing.T) {
	node := fencetest.Start(t)
	_, port, err := net.SplitHostPort(node.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	ep := []string{"--endpoints", "localhost:" + port}
	code, stdout, stderr := runFence(t, append(ep, "status")...)
	_, nodes, _ := strings.Cut(stdout, "NODE")
	if rows := strings.Split(strings.TrimSpace(nodes), "\n"); code != 0 || len(rows) != 2 || !strings.Contains(rows[1], " ok") {
		t.Errorf("status: exit %d, stderr %s, the node's rows:\nNODE%s\nwant one, healthy", code, stderr, nodes)
	}
	got := runJSON(t, 0, append(ep, "status", "--json")...)
	if list, _ := got["nodes"].([]any); len(list) != 1 {
		t.Errorf("status --json lists nodes %v, want one", got["nodes"])
	}
}

// fence sessions revoke says when a lock it released is held back by its
// lock-delay, rather than "released" as though the next waiter had it:
// nobody gets it until the delay passes.
func TestRevokeSaysALockIsHeldBackByItsDelay(t *testing.T) {
	node := fencetest.Start(t)
	s := mustSession(t, node.Client(), client.WithOwner("job"))
	delayed := mustLock(t, s, "orders", client.WithLockDelay(time.Minute))
	plain := mustLock(t, s, "reports")
	code, stdout, stderr := runFence(t, "--endpoints", node.Endpoint(), "sessions", "revoke", fmt.Sprint(s.ID()))
	if code != 0 {
		t.Fatalf("sessions revoke: exit %d, stderr %s", code, stderr)
	}
	want := fmt.Sprintf("revoked session %d (job), released orders(%d) (held back by its lock-delay), reports(%d)\n", s.ID(), delayed.Token(), plain.Token())
	if stdout != want {
		t.Errorf("sessions revoke said\n%q\nwant\n%q", stdout, want)
	}
}
