package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/recipetest"
)

func TestMain(m *testing.M) {
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/election"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/election.md", "main.go")
}

// The leader is paused past its TTL: the other node is elected and
// observers see it; the resumed old leader's next write is refused, so no
// write of the old leader lands after the new leader's first.
func TestPausedLeaderIsRefused(t *testing.T) {
	a, first := pauseLeader(t, false)
	lines, code := a.Output(t, 10*time.Second)
	if code != 2 && code != 3 {
		t.Fatalf("the resumed old leader exited %d, want 2 (refused) or 3 (knew it lost):\n%s", code, strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if strings.Contains(l, "written at revision") && revision(t, l) > first {
			t.Fatalf("the old leader wrote after the new one: %q, B's first write at %d", l, first)
		}
	}
}

// Without the token the resource cannot tell: the old leader's late write
// lands after the new leader's (what docs/uses/election.md says breaks).
func TestPausedLeaderUnfencedOverwrites(t *testing.T) {
	a, first := pauseLeader(t, true)
	late := revision(t, a.WaitLine(t, "written at revision", 10*time.Second))
	if late < first {
		t.Fatalf("the old leader's write at %d came before the new leader's at %d: the test did not catch the overlap", late, first)
	}
}

// pauseLeader starts an observer and nodes A and B, pauses A (the leader)
// in a step until B leads and has written, resumes it, and returns A and
// the revision of B's first write.
func pauseLeader(t *testing.T, unfenced bool) (a *recipetest.Proc, first uint64) {
	addr := recipetest.Serve(t)
	args := func(name string) []string {
		return []string{"node", "--endpoints", addr, "--name", name, "--ttl", "1s", "--work", "300ms", "--steps", "100", "--unfenced=" + strconv.FormatBool(unfenced)}
	}
	obs := recipetest.Run(t, "observer", "observe", "--endpoints", addr)
	obs.WaitLine(t, "observing", 10*time.Second)
	a = recipetest.Run(t, "node A", args("A")...)
	a.WaitLine(t, "A: leading", 10*time.Second)
	obs.WaitLine(t, "leader A", 10*time.Second)
	b := recipetest.Run(t, "node B", args("B")...)
	b.WaitLine(t, "B: campaigning", 10*time.Second)
	a.WaitLine(t, "A: step 2 working", 10*time.Second)
	a.Pause(t)
	b.WaitLine(t, "B: leading", 10*time.Second)
	obs.WaitLine(t, "leader B", 10*time.Second)
	first = revision(t, b.WaitLine(t, "B: step 1 written", 10*time.Second))
	a.Resume(t)
	return a, first
}

func revision(t *testing.T, line string) uint64 {
	t.Helper()
	i := strings.LastIndex(line, " ")
	n, err := strconv.ParseUint(line[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("no revision in %q", line)
	}
	return n
}
