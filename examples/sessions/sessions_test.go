package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/internal/testutil/recipetest"
)

func TestMain(m *testing.M) {
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/sessions"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/sessions.md", "main.go")
}

// A server stopped with SIGSTOP between reading the cart and writing it,
// while another server adds an item, and one killed there: when the first
// wakes its write conflicts, it reads again, and both items are in the
// cart; the killed one wrote nothing.
func TestPausedServerLosesNoUpdate(t *testing.T) {
	dsn := pgtest.Schema(t)
	recipetest.Run(t, "setup", "setup", "--dsn", dsn).WantExit(t, 0, 20*time.Second)
	add := func(item, think string) *recipetest.Proc {
		return recipetest.Run(t, "server adding "+item, "add", "--dsn", dsn, "--item", item, "--think", think)
	}
	killed := add("lamp", "5s")
	killed.WaitLine(t, "lamp: read cart", 10*time.Second)
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	a := add("book", "300ms")
	a.WaitLine(t, "book: read cart", 10*time.Second)
	a.Pause(t)
	add("pen", "0s").WantExit(t, 0, 20*time.Second)
	a.Resume(t)
	lines, code := a.Output(t, 20*time.Second)
	if code != 0 || !strings.Contains(strings.Join(lines, "\n"), `book: read cart "pen;" at version 1`) {
		t.Fatalf("the paused server did not re-read the cart after the conflict (exit %d): %v", code, lines)
	}
	var items string
	pgtest.QueryRow(t, dsn, `SELECT items FROM carts`, &items)
	if items != "pen;book;" {
		t.Fatalf("cart %q, want \"pen;book;\"", items)
	}
}

// Every server computes the same owner for a session.
func TestRouteIsStable(t *testing.T) {
	a, _ := recipetest.Run(t, "route", "route", "--session", "u42", "--servers", "3").Output(t, 10*time.Second)
	b, _ := recipetest.Run(t, "route", "route", "--session", "u42", "--servers", "3").Output(t, 10*time.Second)
	if len(a) != 1 || len(b) != 1 || a[0] != b[0] || a[0] < "0" || a[0] > "2" {
		t.Fatalf("routes %v and %v", a, b)
	}
}
