package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/recipetest"
)

func TestMain(m *testing.M) {
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/allocation"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/allocation.md", "main.go")
}

// A pool of two devices. A takes dev0 and is stopped with SIGSTOP past its
// TTL; B takes dev1 and is killed with SIGKILL. C and D, waiting for a free
// device, get both devices once the two sessions expire; A wakes and its
// write to dev0 is refused.
func TestHoldersPausedAndKilled(t *testing.T) {
	addr := recipetest.Serve(t)
	worker := func(name, work string) *recipetest.Proc {
		return recipetest.Run(t, "worker "+name, "use", "--endpoints", addr, "--name", name, "--work", work)
	}
	a := worker("A", "300ms")
	a.WaitLine(t, "A: using dev0", 10*time.Second)
	a.Pause(t)
	b := worker("B", "10s")
	b.WaitLine(t, "B: using dev1", 10*time.Second)
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	c, d := worker("C", "1s"), worker("D", "1s") // both at once, each needs a device of its own
	for _, p := range []*recipetest.Proc{c, d} {
		for _, l := range p.WantExit(t, 0, 20*time.Second) {
			if _, dev, ok := strings.Cut(l, ": wrote to "); ok {
				got[dev] = p.Name()
			}
		}
	}
	if len(got) != 2 {
		t.Fatalf("C and D used %v, want one device each", got)
	}
	a.Resume(t)
	a.WantExit(t, 2, 10*time.Second) // refused: paused past its TTL
}
