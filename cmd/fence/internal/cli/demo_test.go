package cli

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// demoDeadline bounds a whole `fence demo`: the issue promises well under
// a minute.
const demoDeadline = 60 * time.Second

// demoResult is a finished `fence demo` process.
type demoResult struct {
	stdout, stderr string
	code           int
}

// runFenceDemo runs `fence demo` with args as a real process in a temp dir,
// killing it if it is still running after demoDeadline.
func runFenceDemo(t *testing.T, args ...string) demoResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, fenceBin, append([]string{"demo"}, args...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "FENCE_ENDPOINTS=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("fence demo %s did not finish within %v; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), demoDeadline, &stdout, &stderr)
	}
	res := demoResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running fence demo: %v", err)
	}
	if strings.Contains(res.stderr, "WARNING: DATA RACE") {
		t.Errorf("fence demo or a worker reported a data race:\n%s", res.stderr)
	}
	return res
}

var (
	grantLine = regexp.MustCompile(`(?m)^\s+\+\d+\.\d+s\s+([AB])\s+got lock orders, token (\d+)$`)
	dataDir   = regexp.MustCompile(`\(data in ([^)]+)\)`)
)

// demoRunOutput is one run's section of the demo's output.
type demoRunOutput struct {
	text           string
	tokenA, tokenB uint64
}

// splitRuns cuts the demo's stdout into its two runs and reads the tokens
// A and B were granted in each.
func splitRuns(t *testing.T, stdout string) [2]demoRunOutput {
	t.Helper()
	i1, i2 := strings.Index(stdout, "\nRun 1: "), strings.Index(stdout, "\nRun 2: ")
	if i1 < 0 || i2 < i1 {
		t.Fatalf("output lacks the sections Run 1 and Run 2:\n%s", stdout)
	}
	var runs [2]demoRunOutput
	for i, text := range []string{stdout[i1:i2], stdout[i2:]} {
		runs[i].text = text
		for _, m := range grantLine.FindAllStringSubmatch(text, -1) {
			token, _ := strconv.ParseUint(m[2], 10, 64)
			if m[1] == "A" {
				runs[i].tokenA = token
			} else {
				runs[i].tokenB = token
			}
		}
		if runs[i].tokenA == 0 || runs[i].tokenB == 0 {
			t.Fatalf("run %d: no grant lines for both A and B:\n%s", i+1, text)
		}
	}
	return runs
}

// checkStory asserts that run 1 lost B's update and run 2 rejected A's
// stale write, naming both tokens.
func checkStory(t *testing.T, stdout string) {
	t.Helper()
	runs := splitRuns(t, stdout)
	r1, r2 := runs[0], runs[1]
	if !(r1.tokenA < r1.tokenB && r1.tokenB < r2.tokenA && r2.tokenA < r2.tokenB) {
		t.Errorf("tokens do not strictly increase: run 1 A %d B %d, run 2 A %d B %d", r1.tokenA, r1.tokenB, r2.tokenA, r2.tokenB)
	}
	for _, want := range []string{
		`wrote "B", no token: accepted`,
		`wrote "A", no token: accepted`,
		`lost update: value is "A", B's write is gone`,
		fmt.Sprintf(`=> LOST UPDATE: A (token %d) was paused past its lease; B got lock orders (token %d)`, r1.tokenA, r1.tokenB),
	} {
		if !strings.Contains(r1.text, want) {
			t.Errorf("run 1 lacks %q:\n%s", want, r1.text)
		}
	}
	for _, want := range []string{
		fmt.Sprintf(`wrote "B" with token %d: accepted`, r2.tokenB),
		fmt.Sprintf(`A        write rejected: stale fencing token %d < %d`, r2.tokenA, r2.tokenB),
		`value is "B": B's write survived`,
		fmt.Sprintf(`=> SAFE: A (token %d) was paused past its lease`, r2.tokenA),
		fmt.Sprintf(`rejected it with 409: stale fencing token %d < %d`, r2.tokenA, r2.tokenB),
	} {
		if !strings.Contains(r2.text, want) {
			t.Errorf("run 2 lacks %q:\n%s", want, r2.text)
		}
	}
	if strings.Contains(stdout, "UNEXPECTED") {
		t.Errorf("a run went unexpectedly:\n%s", stdout)
	}
}

// checkCleanedUp asserts that the demo left no worker process and, when
// it ran an embedded server, no data directory.
func checkCleanedUp(t *testing.T, stdout string) {
	t.Helper()
	if pids := demoWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes left behind: %v", pids)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if m := dataDir.FindStringSubmatch(stdout); m != nil {
		if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the embedded server's data dir %s was not removed (stat: %v)", m[1], err)
		}
	}
}

// demoWorkerStates returns the running `fence demo worker` processes of
// this test's fence binary, and the state letter of each (R, S, T...).
func demoWorkerStates(t *testing.T) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc to look for processes: %v", err)
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(string(cmdline), "\x00")
		if len(argv) < 3 || argv[0] != fenceBin || argv[1] != "demo" || argv[2] != "worker" {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ...: the state follows the last ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 0 && fields[0] != "Z" {
			out[pid] = fields[0] + " " + strings.Join(argv[3:], " ")
		}
	}
	return out
}

func demoWorkers(t *testing.T) []int {
	t.Helper()
	var pids []int
	for pid := range demoWorkerStates(t) {
		pids = append(pids, pid)
	}
	return pids
}

func TestDemoHTML(t *testing.T) {
	res := runFenceDemo(t, "--out", "demo.html")
	if res.code != 0 {
		t.Fatalf("fence demo exited %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkStory(t, res.stdout)
	checkCleanedUp(t, res.stdout)
	if !strings.Contains(res.stdout, "Picture: demo.html") {
		t.Errorf("output does not say where the picture is:\n%s", res.stdout)
	}
}

func TestDemoSVG(t *testing.T) {
	out := filepath.Join(t.TempDir(), "demo.svg")
	res := runFenceDemo(t, "--out", out)
	if res.code != 0 {
		t.Fatalf("fence demo exited %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkStory(t, res.stdout)
	checkCleanedUp(t, res.stdout)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lanes, marks := readDemoSVG(t, data)
	if got, want := strings.Join(lanes, ","), "A,B,storage,A,B,storage"; got != want {
		t.Errorf("SVG lanes %q, want %q", got, want)
	}
	want := map[string]int{"grant": 4, "write-ok": 3, "write-rejected": 1, "lost-update": 1}
	for kind, n := range want {
		if marks[kind] != n {
			t.Errorf("SVG has %d %s marks, want %d (all: %v)", marks[kind], kind, n, marks)
		}
	}
	runs := splitRuns(t, res.stdout)
	for _, want := range []string{
		fmt.Sprintf("got lock orders, token %d", runs[0].tokenA),
		fmt.Sprintf("got lock orders, token %d", runs[1].tokenB),
		fmt.Sprintf("write rejected: stale fencing token %d &lt; %d", runs[1].tokenA, runs[1].tokenB),
	} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

// readDemoSVG parses the SVG with encoding/xml and returns the lane labels
// and the number of marks of each kind.
func readDemoSVG(t *testing.T, data []byte) (lanes []string, marks map[string]int) {
	t.Helper()
	marks = map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(data))
	inLane, root := false, true
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root && (tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg") {
				t.Fatalf("root element %v, want svg in the SVG namespace", tok.Name)
			}
			root = false
			attrs := map[string]string{}
			for _, a := range tok.Attr {
				attrs[a.Name.Local] = a.Value
			}
			inLane = attrs["class"] == "lane"
			if attrs["class"] == "mark" {
				marks[attrs["data-kind"]]++
			}
		case xml.CharData:
			if inLane {
				lanes = append(lanes, string(tok))
			}
		case xml.EndElement:
			inLane = false
		}
	}
	return lanes, marks
}

// TestDemoAgainstService runs the demo against a service given by
// --endpoints instead of its embedded one.
func TestDemoAgainstService(t *testing.T) {
	srv := fencetest.Start(t).Server
	res := runFenceDemo(t, "--endpoints", srv.Addr(), "--out", "demo.svg")
	if res.code != 0 {
		t.Fatalf("fence demo exited %d; stdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stdout, "lock service  "+srv.Addr()+"\n") {
		t.Errorf("the demo did not use the service at %s:\n%s", srv.Addr(), res.stdout)
	}
	checkStory(t, res.stdout)
	checkCleanedUp(t, res.stdout)
}

// The demo's tests run one at a time (none is parallel): they count the
// worker processes of the test's fence binary, and the demo's timeline is
// about timing.

func TestDemoServiceDown(t *testing.T) {
	res := runFenceDemo(t, "--endpoints", "127.0.0.1:1", "--out", "demo.html")
	if res.code == 0 {
		t.Fatalf("fence demo against no service exited 0:\n%s", res.stdout)
	}
	if !strings.Contains(res.stderr, "fence: the fence service at 127.0.0.1:1 does not answer") {
		t.Errorf("stderr does not explain:\n%s", res.stderr)
	}
}

// TestDemoInterrupted stops the demo with Ctrl-C while worker A is paused:
// the demo must resume and kill its workers, stop its server and remove its
// data before it exits.
func TestDemoInterrupted(t *testing.T) {
	var stdout, stderr syncbuf.Buffer // the test reads while exec copies
	cmd := exec.Command(fenceBin, "demo", "--ttl", "5s", "--out", "demo.html")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "FENCE_ENDPOINTS=")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()

	// Wait for worker A to be stopped by SIGSTOP (state T).
	deadline := time.Now().Add(demoDeadline)
	for stopped := false; !stopped; {
		for _, state := range demoWorkerStates(t) {
			if strings.HasPrefix(state, "T ") && strings.Contains(state, "--name A") {
				stopped = true
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker A was not paused within %v", demoDeadline)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred cleanup
		if cmd.ProcessState.ExitCode() == 0 {
			t.Errorf("an interrupted demo exited 0")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fence demo did not exit within 30s of SIGINT")
	}
	if !strings.Contains(stderr.String(), "demo interrupted") {
		t.Errorf("stderr does not say the demo was interrupted:\n%s", stderr.String())
	}
	checkCleanedUp(t, stdout.String())
}

func TestDemoJudge(t *testing.T) {
	wrote := demoEvent{Event: "wrote"}
	stale := demoEvent{Event: "rejected", Token: 3, Highest: 4, Message: "stale fencing token 3 < 4 for key orders"}
	for _, tc := range []struct {
		name string
		run  demoRun
		ok   bool
		want string
	}{
		{"lost update", demoRun{tokenA: 1, tokenB: 2, writeA: wrote, writeB: wrote, final: "A", present: true}, true, "LOST UPDATE: A (token 1)"},
		{"unfenced but B kept", demoRun{tokenA: 1, tokenB: 2, writeA: wrote, writeB: wrote, final: "B", present: true}, false, `UNEXPECTED: the storage does not check tokens`},
		{"fenced and rejected", demoRun{fenced: true, tokenA: 3, tokenB: 4, writeA: stale, writeB: wrote, final: "B", present: true}, true, "SAFE: A (token 3)"},
		{"fenced but accepted", demoRun{fenced: true, tokenA: 3, tokenB: 4, writeA: wrote, writeB: wrote, final: "A", present: true}, false, `A's write: wrote; the value is "A"`},
		{"B failed", demoRun{fenced: true, tokenA: 3, tokenB: 4, writeA: stale, writeB: demoEvent{Event: "write-failed", Message: "503"}, present: false}, false, "UNEXPECTED: B's write, under the lock, failed: 503"},
		{"tokens out of order", demoRun{tokenA: 5, tokenB: 4}, false, "UNEXPECTED: B's token 4 is not above A's 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run.judge(demoFlags{lock: "orders"})
			if tc.run.ok != tc.ok || !strings.Contains(tc.run.verdict, tc.want) {
				t.Errorf("ok %v, verdict %q; want ok %v and a verdict with %q", tc.run.ok, tc.run.verdict, tc.ok, tc.want)
			}
		})
	}
}
