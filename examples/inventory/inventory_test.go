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
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/inventory"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/inventory.md", "main.go")
}

func setupDB(t *testing.T, qty string) string {
	dsn := pgtest.Schema(t)
	recipetest.Run(t, "setup", "setup", "--dsn", dsn, "--qty", qty).WantExit(t, 0, 20*time.Second)
	return dsn
}

func query(t *testing.T, dsn, q string) int64 {
	t.Helper()
	var n int64
	pgtest.QueryRow(t, dsn, q, &n)
	return n
}

// Six buyers at once for three items, one of them stopped with SIGSTOP
// in the middle: exactly three sell, the stock ends at zero.
func TestBuyersNeverOversell(t *testing.T) {
	dsn := setupDB(t, "3")
	var buyers []*recipetest.Proc
	for _, name := range []string{"A", "B", "C", "D", "E", "F"} {
		buyers = append(buyers, recipetest.Run(t, "buyer "+name, "buy", "--dsn", dsn, "--buyer", name))
	}
	buyers[0].Pause(t)
	time.Sleep(200 * time.Millisecond)
	buyers[0].Resume(t)
	sold := 0
	for _, b := range buyers {
		lines, code := b.Output(t, 20*time.Second)
		switch code {
		case 0:
			sold++
		case 4:
		default:
			t.Fatalf("%s exited %d: %v", b.Name(), code, lines)
		}
	}
	if left := query(t, dsn, `SELECT qty FROM stock`); sold != 3 || left != 0 {
		t.Fatalf("sold %d, %d left; want 3 sold, 0 left", sold, left)
	}
}

// Transfers both ways at once, one stopped between its read and its write
// and one killed there: no money is made or lost.
func TestTransfersConserveMoney(t *testing.T) {
	dsn := setupDB(t, "1")
	paused := recipetest.Run(t, "paused", "transfer", "--dsn", dsn, "--from", "a", "--to", "b", "--amount", "10", "--think", "300ms")
	killed := recipetest.Run(t, "killed", "transfer", "--dsn", dsn, "--from", "b", "--to", "a", "--amount", "50", "--think", "5s")
	paused.WaitLine(t, "read versions", 10*time.Second)
	paused.Pause(t)
	killed.WaitLine(t, "read versions", 10*time.Second)
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	other := recipetest.Run(t, "other", "transfer", "--dsn", dsn, "--from", "b", "--to", "a", "--amount", "30")
	other.WantExit(t, 0, 20*time.Second)
	paused.Resume(t)
	lines := paused.WantExit(t, 0, 20*time.Second)
	if !strings.Contains(strings.Join(lines, "\n"), "read versions 1, 1") {
		t.Fatalf("the paused transfer did not retry after the other wrote: %v", lines)
	}
	a, b := query(t, dsn, `SELECT amount FROM balances WHERE id = 'a'`), query(t, dsn, `SELECT amount FROM balances WHERE id = 'b'`)
	if a != 100-10+30 || b != 100+10-30 {
		t.Fatalf("balances a=%d b=%d, want 120 and 80", a, b)
	}
}

// The lock-based version: a buyer paused past its TTL after taking the
// lock is refused by pgfence when it wakes; the next buyer's sale stands
// and nothing is sold twice.
func TestLockedBuyerPausedIsRefused(t *testing.T) {
	dsn := setupDB(t, "10")
	addr := recipetest.Serve(t)
	locked := func(name, think string) *recipetest.Proc {
		return recipetest.Run(t, "buyer "+name, "locked-buy", "--dsn", dsn, "--endpoints", addr, "--buyer", name, "--think", think)
	}
	a := locked("A", "300ms")
	a.WaitLine(t, "A: locked", 10*time.Second)
	a.Pause(t)
	b := locked("B", "0s")
	b.WantExit(t, 0, 20*time.Second)
	a.Resume(t)
	a.WantExit(t, 2, 20*time.Second) // refused: the paused buyer
	if left := query(t, dsn, `SELECT qty FROM stock`); left != 9 {
		t.Fatalf("%d left, want 9: one sale", left)
	}
}
