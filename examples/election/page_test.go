package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/recipetest"
)

const page = "docs/uses/election.md"

// The page's shell block plays the paused leader the same way every time
// and prints what the page shows after it; the refusal the page names is
// the one the program printed.
func TestShellBlockIsRefused(t *testing.T) {
	script, want := recipetest.ShellBlock(t, page, "kill -STOP")
	sh := recipetest.NewShell(t, "election", recipetest.FreeAddr(t))
	lines, code := sh.Run(t, "the page's shell block", script).Output(t, 60*time.Second)
	got := strings.Join(lines, "\n")
	if code != 0 || got != strings.TrimSpace(want) {
		t.Fatalf("the shell block exited %d and printed:\n%s\nthe page shows:\n%s", code, got, want)
	}
	var refusal string
	for _, l := range lines {
		if _, msg, ok := strings.Cut(l, " REFUSED: "); ok {
			refusal = msg
		}
	}
	if refusal == "" {
		t.Fatalf("A's write was not refused:\n%s", got)
	}
	if prose := strings.Replace(recipetest.Page(t, page), want, "", 1); !strings.Contains(prose, "`"+refusal+"`") {
		t.Errorf("the page's text does not name the refusal printed, `%s`", refusal)
	}
}
