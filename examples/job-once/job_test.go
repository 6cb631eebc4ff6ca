package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/internal/testutil/recipetest"
)

func TestMain(m *testing.M) {
	os.Exit(recipetest.Main(m, "github.com/fencelock/fence/examples/job-once"))
}

func TestPageShowsTheProgram(t *testing.T) {
	recipetest.CheckSnippets(t, "docs/uses/job-once.md", "main.go")
}

// Efficiency: two cron runs at once run the job once; a holder paused past
// its TTL lets a second run start, the one duplicate the page documents,
// and the paused run's job is stopped once it learns it lost the lock.
func TestCronUnderLeaseLock(t *testing.T) {
	addr := recipetest.Serve(t)
	out := filepath.Join(t.TempDir(), "report.txt")
	cron := func(worker, timeout string) *recipetest.Proc {
		return recipetest.Start(t, "cron "+worker, recipetest.FenceBin(), "lock", "--endpoints", addr,
			"--ttl", "1s", "--timeout", timeout, "--grace", "100ms", "nightly", "--",
			recipetest.Bin(), "cheap", "--out", out, "--worker", worker, "--work", "3s")
	}
	a := cron("A", "1s")
	a.WaitLine(t, "A: running", 10*time.Second)
	cron("B", "200ms").WantExit(t, 124, 10*time.Second) // not granted: the first holds the lock
	a.Pause(t)                                          // fence lock stops renewing; its job runs on
	c := cron("C", "5s")
	c.WaitLine(t, "C: running", 10*time.Second)
	a.Resume(t)
	a.WantExit(t, 75, 10*time.Second) // lock lost, job stopped
	c.WantExit(t, 0, 10*time.Second)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if starts := strings.Count(string(data), "start "); starts != 2 {
		t.Fatalf("the job started %d times, want 2 (one run and the documented duplicate):\n%s", starts, data)
	}
	if strings.Contains(string(data), "done A") {
		t.Fatalf("the paused run's job finished after its lock was lost:\n%s", data)
	}
}

// Correctness: workers racing for one day's report write it once.
func TestReportOnceRacing(t *testing.T) {
	dsn := pgtest.Schema(t)
	first := runReport(t, dsn, "A", "500ms")
	first.WaitLine(t, "A: running", 10*time.Second) // its tables exist now
	others := []*recipetest.Proc{runReport(t, dsn, "B", "0s"), runReport(t, dsn, "C", "0s")}
	ran := 0
	for _, p := range append(others, first) {
		lines := p.WantExit(t, 0, 20*time.Second)
		if strings.HasSuffix(lines[len(lines)-1], ": ran") {
			ran++
		}
	}
	if ran != 1 {
		t.Fatalf("%d workers report they ran the job, want 1", ran)
	}
	wantReports(t, dsn, 1)
}

// Correctness: a worker killed in the middle of the job leaves nothing;
// the next one runs it, once. A worker paused in the middle holds the
// others back until it finishes: no second run either.
func TestReportWorkerKilledOrPaused(t *testing.T) {
	dsn := pgtest.Schema(t)
	a := runReport(t, dsn, "A", "5s")
	a.WaitLine(t, "A: running", 10*time.Second)
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	wantReports(t, dsn, 0)
	b := runReport(t, dsn, "B", "300ms")
	b.WaitLine(t, "B: running", 10*time.Second)
	b.Pause(t)
	c := runReport(t, dsn, "C", "0s")
	time.Sleep(500 * time.Millisecond) // C waits on B's job key
	b.Resume(t)
	if lines, _ := b.Output(t, 20*time.Second); lines[len(lines)-1] != "B: ran" {
		t.Fatalf("B: %v", lines)
	}
	if lines, _ := c.Output(t, 20*time.Second); lines[len(lines)-1] != "C: already done" {
		t.Fatalf("C: %v", lines)
	}
	wantReports(t, dsn, 1)
}

func runReport(t *testing.T, dsn, worker, work string) *recipetest.Proc {
	return recipetest.Run(t, "worker "+worker, "report", "--dsn", dsn, "--day", "2026-12-02", "--worker", worker, "--work", work)
}

func wantReports(t *testing.T, dsn string, want int) {
	t.Helper()
	var n int
	pgtest.QueryRow(t, dsn, `SELECT count(*) FROM reports`, &n)
	if n != want {
		t.Fatalf("%d report rows, want %d", n, want)
	}
}
