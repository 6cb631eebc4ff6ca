package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/recipetest"
)

const page = "docs/uses/job-once.md"

// The page's cron line, pasted in three shells at once, runs the job once:
// one shell runs it and records the day done, the two others wait for the
// lock, find the record and skip, exiting 0.
func TestCronLineRunsOnce(t *testing.T) {
	line, _ := recipetest.ShellBlock(t, page, "fence run-once")
	addr := recipetest.Serve(t)
	sh := recipetest.NewShell(t, "job-once", addr)
	shells := make([]*recipetest.Proc, 3)
	for i := range shells {
		shells[i] = sh.Run(t, fmt.Sprintf("shell %d", i+1), line)
	}
	var ran []string
	skipped := 0
	for _, p := range shells {
		lines, code := p.Output(t, 30*time.Second)
		if code != 0 {
			t.Fatalf("%s exited %d: %v\n%s", p.Name(), code, lines, p.Stderr())
		}
		switch {
		case strings.Contains(p.Stderr(), "fence run-once: job-once succeeded;"):
			ran = append(ran, tokenIn(t, p.Stderr()))
		case strings.Contains(p.Stderr(), "is already done") && !strings.Contains(p.Stderr(), "job-once succeeded"):
			skipped++
		default:
			t.Fatalf("%s says neither that it ran the job nor that it skipped it:\n%s", p.Name(), p.Stderr())
		}
	}
	if len(ran) != 1 || skipped != 2 {
		t.Fatalf("%d shells ran the job and %d skipped it, want 1 and 2", len(ran), skipped)
	}
	wantStarts(t, filepath.Join(sh.Dir(), "report.txt"), 1)
	if token := recordToken(t, addr); token != ran[0] {
		t.Fatalf("the day is recorded with token %s, the run that did the job had %s", token, ran[0])
	}
}

// A fence run-once paused past its TTL while its job runs: the next run
// takes the lock, finds no record and runs the job (the duplicate the page
// documents), and records the day. The paused one, resumed, records
// nothing: a job that finished during the pause gets its record refused,
// one still running is stopped; it exits 75 either way. Later runs skip.
func TestRunOnceHolderPaused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		work    string // how long A's job takes
		finishA bool   // A's job finishes during the pause
	}{
		{name: "job finished during the pause", work: "300ms", finishA: true},
		{name: "job still running when resumed", work: "60s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := recipetest.Serve(t)
			out := filepath.Join(t.TempDir(), "report.txt")
			run := func(worker, work string) *recipetest.Proc {
				return recipetest.Start(t, "run-once "+worker, recipetest.FenceBin(), "run-once", "--endpoints", addr,
					"--ttl", "1s", "--grace", "100ms", "nightly-2026-12-02", "--",
					recipetest.Bin(), "cheap", "--out", out, "--worker", worker, "--work", work)
			}
			a := run("A", tc.work)
			a.WaitLine(t, "A: running", 10*time.Second)
			a.Pause(t) // fence run-once stops renewing; its job runs on
			c := run("C", "300ms")
			c.WaitLine(t, "C: running", 10*time.Second)
			c.WantExit(t, 0, 20*time.Second)
			cToken := tokenIn(t, c.Stderr())
			if finished := strings.Contains(readFile(t, out), "done A"); finished != tc.finishA {
				t.Fatalf("A's job finished during the pause: %v, want %v", finished, tc.finishA)
			}
			a.Resume(t)
			a.WantExit(t, 75, 20*time.Second) // lock lost
			aToken := tokenIn(t, a.Stderr())
			if tc.finishA && !strings.Contains(a.Stderr(), "succeeded, but recording nightly-2026-12-02 done was refused") {
				t.Fatalf("the paused run's record was not refused:\n%s", a.Stderr())
			}
			if !tc.finishA && strings.Contains(readFile(t, out), "done A") {
				t.Fatalf("the paused run's job finished after its lock was lost:\n%s", readFile(t, out))
			}
			wantStarts(t, out, 2) // one run and the documented duplicate
			if token := recordToken(t, addr); token != cToken || token == aToken {
				t.Fatalf("the day is recorded with token %s; the next run had %s, the paused one %s", token, cToken, aToken)
			}
			run("D", "0s").WantExit(t, 0, 20*time.Second)
			wantStarts(t, out, 2)
		})
	}
}

// token is the token a fence run-once names on stderr: its record's, or
// its lost lock's.
var token = regexp.MustCompile(`\(token (\d+)\)`)

func tokenIn(t *testing.T, stderr string) string {
	t.Helper()
	m := token.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no token in:\n%s", stderr)
	}
	return m[1]
}

// recordToken returns the token of the one record of a run-once key.
func recordToken(t *testing.T, addr string) string {
	t.Helper()
	lines, code := recipetest.Start(t, "fence kv list", recipetest.FenceBin(), "kv", "list", "--endpoints", addr, "run-once/").Output(t, 20*time.Second)
	if code != 0 || len(lines) != 1 {
		t.Fatalf("fence kv list run-once/ exited %d, want 1 record:\n%s", code, strings.Join(lines, "\n"))
	}
	for _, f := range strings.Split(lines[0], "\t") {
		if n, ok := strings.CutPrefix(f, "token "); ok {
			return n
		}
	}
	t.Fatalf("no token in %q", lines[0])
	return ""
}

func wantStarts(t *testing.T, report string, want int) {
	t.Helper()
	data := readFile(t, report)
	if starts := strings.Count(data, "start "); starts != want {
		t.Fatalf("the job started %d times, want %d:\n%s", starts, want, data)
	}
	if dones := strings.Count(data, "done "); dones > want {
		t.Fatalf("the job finished %d times, more than it started:\n%s", dones, data)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
