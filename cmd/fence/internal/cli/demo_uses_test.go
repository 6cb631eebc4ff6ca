package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// useRunText cuts the output of `fence demo --use` into its runs.
func useRunText(t *testing.T, stdout string, runs int) []string {
	t.Helper()
	var out []string
	for i := 1; i <= runs; i++ {
		start := strings.Index(stdout, fmt.Sprintf("\nRun %d: ", i))
		if start < 0 {
			t.Fatalf("output lacks the section Run %d:\n%s", i, stdout)
		}
		end := strings.Index(stdout[start+1:], "\nRun ")
		if i == runs {
			end = strings.Index(stdout[start+1:], "\nEvery run went")
		}
		if end < 0 {
			t.Fatalf("run %d does not end as it should:\n%s", i, stdout)
		}
		out = append(out, stdout[start:start+1+end])
	}
	return out
}

// playUse runs `fence demo --use name`, drawing an SVG, and checks that it
// exited 0, that each run's text has the lines wanted of it (regular
// expressions), and that the demo cleaned up after itself; it returns the
// SVG's marks by kind.
func playUse(t *testing.T, name string, want [][]string) map[string]int {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".svg")
	res := runFenceDemo(t, "--use", name, "--out", out)
	if res.code != 0 {
		t.Fatalf("fence demo --use %s exited %d; stdout:\n%s\nstderr:\n%s", name, res.code, res.stdout, res.stderr)
	}
	if strings.Contains(res.stdout, "UNEXPECTED") {
		t.Errorf("a run went unexpectedly:\n%s", res.stdout)
	}
	for i, text := range useRunText(t, res.stdout, len(want)) {
		for _, w := range want[i] {
			if !regexp.MustCompile(w).MatchString(text) {
				t.Errorf("run %d lacks %q:\n%s", i+1, w, text)
			}
		}
	}
	checkCleanedUp(t, res.stdout)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lanes, marks := readDemoSVG(t, data)
	if len(lanes) != 3*len(want) {
		t.Errorf("SVG lanes %q, want 3 per run", lanes)
	}
	return marks
}

func TestDemoUseElection(t *testing.T) {
	marks := playUse(t, "election", [][]string{{
		`A\s+elected leader of scheduler, token \d+`,
		`B\s+wrote "jobs assigned by B", no token: accepted`,
		`A\s+wrote "jobs assigned by A", no token: accepted`,
		`kv\s+two leaders wrote; value is "jobs assigned by A", B's decision is gone`,
		`=> TWO LEADERS: A \(token \d+\) was elected and paused past its TTL; B was elected`,
	}, {
		`B\s+wrote "jobs assigned by B" with token \d+ \(strict\): accepted`,
		`A\s+write refused: stale fencing token (\d+) < (\d+)`,
		`kv\s+value is "jobs assigned by B": B's decision survived`,
		`=> REFUSED: .* and the KV store refused it in strict mode`,
	}})
	if marks["write-rejected"] != 1 || marks["lost-update"] != 1 || marks["grant"] != 4 {
		t.Errorf("SVG marks %v, want 4 grants, 1 write rejected, 1 lost update", marks)
	}
}

func TestDemoUseJobOnce(t *testing.T) {
	marks := playUse(t, "job-once", [][]string{{
		`A\s+got lock nightly, token \d+`,
		`B\s+ran the job: report of 2026-12-02 sent`,
		`A\s+ran the job: report of 2026-12-02 sent`,
		`jobs db\s+the job ran twice: sent by B and A`,
		`=> RAN TWICE: A \(token \d+\) took lock nightly and was paused past its TTL.* the report of 2026-12-02 was sent twice \(by B, A\)`,
	}, {
		`B\s+ran the job under nolock.Once: key report/2026-12-02 recorded, report sent`,
		`A\s+job skipped: nolock.Once found key report/2026-12-02 recorded, the job ran already`,
		`jobs db\s+the job ran once: sent by B`,
		`=> RAN ONCE: .* nolock.Once found job key report/2026-12-02 recorded.* the report of 2026-12-02 was sent once \(by B\)`,
	}})
	if marks["write-rejected"] != 1 || marks["lost-update"] != 1 || marks["grant"] != 4 {
		t.Errorf("SVG marks %v, want 4 grants, 1 write rejected, 1 lost update", marks)
	}
}

func TestDemoUseInventory(t *testing.T) {
	marks := playUse(t, "inventory", [][]string{{
		`A\s+got lock stock/A1, token \d+; read 1 in stock`,
		`B\s+got lock stock/A1, token \d+; read 1 in stock`,
		`B\s+sold 1: set qty to 0 \(read 1\)`,
		`A\s+sold 1: set qty to 0 \(read 1\)`,
		`stock db\s+oversold: 2 sales of the 1 item, qty 0`,
		`=> OVERSOLD: .* The database took both sales: 1 item to sell, 2 sold, 0 left`,
	}, {
		`B\s+sold 1: set qty to 0 \(read 1\), token \d+ admitted`,
		`A\s+sale refused: stale fencing token \d+ < \d+`,
		`stock db\s+1 sold \(by B\), 0 left`,
		`=> REFUSED: .* refused the sale: 1 item to sell, 1 sold, 0 left`,
	}, {
		`B\s+sold 1: UPDATE stock SET qty = qty - 1 WHERE qty >= 1, 0 left`,
		`A\s+sale refused: sold out, UPDATE ... WHERE qty >= 1 changed no row`,
		`stock db\s+1 sold \(by B\), 0 left`,
		`=> REFUSED: .* which changed no row: sold out. 1 item to sell, 1 sold, 0 left`,
	}})
	if marks["write-rejected"] != 2 || marks["lost-update"] != 1 || marks["grant"] != 6 {
		t.Errorf("SVG marks %v, want 6 grants, 2 writes rejected, 1 lost update", marks)
	}
}

func TestDemoUseJudge(t *testing.T) {
	wrote := demoEvent{Event: "wrote"}
	for _, tc := range []struct {
		name     string
		run      demoRun
		happened bool
		ok       bool
		want     string
	}{
		{"as told", demoRun{tokenA: 1, tokenB: 2, writeA: wrote, writeB: wrote}, true, true, "RAN TWICE: story"},
		{"not as told", demoRun{tokenA: 1, tokenB: 2, writeA: wrote, writeB: wrote}, false, false, "UNEXPECTED: the story ends RAN TWICE, but A's step: wrote; ran once"},
		{"B failed", demoRun{tokenA: 1, tokenB: 2, writeB: demoEvent{Event: "write-failed", Message: "disk"}}, true, false, "UNEXPECTED: B's step, under the lock, did not take effect: write-failed (disk)"},
		{"tokens out of order", demoRun{tokenA: 5, tokenB: 4, writeB: wrote}, true, false, "UNEXPECTED: B's token 4 is not above A's 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &demoPlay{run: &tc.run}
			p.judgeUse(tc.happened, "RAN TWICE: story", "ran once")
			if tc.run.ok != tc.ok || !strings.Contains(tc.run.verdict, tc.want) {
				t.Errorf("ok %v, verdict %q; want ok %v and a verdict with %q", tc.run.ok, tc.run.verdict, tc.ok, tc.want)
			}
		})
	}
}

func TestDemoUseList(t *testing.T) {
	res := runFenceDemo(t, "--use", "list")
	if res.code != 0 {
		t.Fatalf("fence demo --use list exited %d:\n%s%s", res.code, res.stdout, res.stderr)
	}
	for _, s := range useStories {
		if !regexp.MustCompile(`(?m)^` + s.name + `\s+.*` + regexp.QuoteMeta(s.page) + `$`).MatchString(res.stdout) {
			t.Errorf("the list lacks %s:\n%s", s.name, res.stdout)
		}
	}
	res = runFenceDemo(t, "--use", "no-such-use")
	if res.code == 0 {
		t.Fatalf("fence demo --use no-such-use exited 0:\n%s", res.stdout)
	}
	if !strings.Contains(res.stderr, `no story for --use "no-such-use"; these exist`) || !strings.Contains(res.stderr, "election  ") {
		t.Errorf("stderr does not list the stories:\n%s", res.stderr)
	}
}
