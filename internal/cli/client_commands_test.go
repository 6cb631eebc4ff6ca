package cli

import (
	"bytes"
	"context"
	"net"
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
	s, err := c.NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, err := client.NewMutex(s, name).Lock(context.Background()); err != nil {
			t.Fatal(err)
		}
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
