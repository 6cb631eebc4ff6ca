package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/recipetest"
)

func TestMain(m *testing.M) {
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/coordinate"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/coordinate.md", "main.go")
}

// Coordinator A is stopped with SIGSTOP in the middle of its rollout for
// longer than its TTL; B takes the lock and rolls out v3 in full; A wakes
// and its next step is refused. Every service ends at v3, and the service
// waiting at the barrier starts only after B's rollout.
func TestStaleCoordinatorIsRefused(t *testing.T) {
	addr := recipetest.Serve(t)
	rollout := func(name, version string) *recipetest.Proc {
		return recipetest.Run(t, "coordinator "+name, "rollout", "--endpoints", addr, "--name", name, "--version", version)
	}
	a := rollout("A", "v2")
	a.WaitLine(t, "A: step readers", 10*time.Second)
	svc := recipetest.Run(t, "readers", "service", "--endpoints", addr, "--name", "readers")
	svc.WaitLine(t, "waiting for the rollout", 10*time.Second)
	a.Pause(t)
	b := rollout("B", "v3")
	b.WantExit(t, 0, 20*time.Second)
	if l := svc.WaitLine(t, "readers: running", 10*time.Second); l[len("readers: running "):len("readers: running v3")] != "v3" {
		t.Fatalf("the service started with %q, want v3", l)
	}
	a.Resume(t)
	a.WantExit(t, 2, 10*time.Second) // refused: the stale coordinator
	c, err := client.New(client.WithEndpoints(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, step := range steps {
		kv, err := c.KV().Get(context.Background(), "services/"+step)
		if err != nil || kv == nil || string(kv.GetValue()) != "v3" {
			t.Fatalf("services/%s = %v (%v), want v3", step, kv, err)
		}
	}
}
