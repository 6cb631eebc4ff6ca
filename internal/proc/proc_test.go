//go:build unix

package proc_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/proc"
)

// childEnv makes the test binary act as a child process; its value names
// what the child does (see child).
const childEnv = "FENCE_PROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child is the test binary run as a child process:
//   - echo: writes "ready" to stdout and "started" to stderr, then answers
//     each line on stdin with "got LINE"; "exit N" exits with status N;
//   - tick: writes a line every 5ms;
//   - parent: starts a "tick" child of its own, with its output discarded,
//     writes the child's pid and waits. With the argument "group" the
//     child runs in this process's group; with "die-with-parent" it runs
//     in a group of its own, with DieWithParent.
func child(mode string) int {
	switch mode {
	case "echo":
		fmt.Println("ready")
		fmt.Fprintln(os.Stderr, "started")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if code, ok := strings.CutPrefix(in.Text(), "exit "); ok {
				n, _ := strconv.Atoi(code)
				return n
			}
			fmt.Println("got " + in.Text())
		}
	case "tick":
		for i := 0; ; i++ {
			fmt.Println(i)
			time.Sleep(5 * time.Millisecond)
		}
	case "parent":
		pid, err := startGrandchild(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(pid)
		// A sleep, not select {}: with no goroutine left to wake it, the
		// runtime takes a bare select for a deadlock and exits with
		// status 2, sometimes before the test's SIGKILL arrives.
		time.Sleep(time.Hour)
	}
	return 0
}

// startGrandchild starts a "tick" child of a "parent" child, as how says.
func startGrandchild(how string) (pid int, err error) {
	env := append(os.Environ(), childEnv+"=tick")
	if how == "group" {
		cmd := exec.Command(os.Args[0])
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	}
	p, err := proc.Start(proc.Spec{Name: "grandchild", Path: os.Args[0], Env: env, DieWithParent: true})
	if err != nil {
		return 0, err
	}
	return p.Pid(), nil
}

// startChild starts the test binary as a child in mode.
func startChild(mode string, dieWithParent bool, args ...string) (*proc.Process, error) {
	return proc.Start(proc.Spec{
		Name:          "child " + mode,
		Path:          os.Args[0],
		Args:          args,
		Env:           append(os.Environ(), childEnv+"="+mode),
		Stdin:         true,
		Lines:         true,
		DieWithParent: dieWithParent,
	})
}

// mustStart starts a child and kills it at cleanup.
func mustStart(t *testing.T, mode string, args ...string) *proc.Process {
	t.Helper()
	p, err := startChild(mode, true, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Kill()
		for range p.Lines() {
		}
	})
	return p
}

// nextLine waits for p's next line of stdout.
func nextLine(t *testing.T, p *proc.Process) string {
	t.Helper()
	select {
	case l, ok := <-p.Lines():
		if !ok {
			t.Fatalf("%s exited (%v); stderr: %s", p.Name(), p.State(), p.Stderr())
		}
		return l.Text
	case <-time.After(10 * time.Second):
		t.Fatalf("%s wrote no line within 10s", p.Name())
		return ""
	}
}

func TestLinesStdinAndExit(t *testing.T) {
	p := mustStart(t, "echo")
	if got := nextLine(t, p); got != "ready" {
		t.Fatalf("first line %q, want ready", got)
	}
	if err := p.WriteLine("hello"); err != nil {
		t.Fatal(err)
	}
	if got := nextLine(t, p); got != "got hello" {
		t.Fatalf("answer %q, want %q", got, "got hello")
	}
	if p.Exited() || p.State() != nil || p.ExitCode() != -1 {
		t.Fatalf("a running process: Exited %v, State %v, ExitCode %d", p.Exited(), p.State(), p.ExitCode())
	}
	if err := p.WriteLine("exit 3"); err != nil {
		t.Fatal(err)
	}
	for range p.Lines() {
	}
	if err := p.Wait(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() || p.ExitCode() != 3 {
		t.Errorf("Exited %v, ExitCode %d; want true and 3", p.Exited(), p.ExitCode())
	}
	if got := p.Stderr(); got != "started\n" {
		t.Errorf("Stderr %q, want %q", got, "started\n")
	}
}

func TestWaitTimesOutAndEndsWithContext(t *testing.T) {
	p := mustStart(t, "echo")
	if err := p.Wait(context.Background(), 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), "did not exit within 20ms") {
		t.Errorf("Wait of a running process: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with an ended context: %v, want context.Canceled", err)
	}
}

// TestPauseResume stops a ticking child: no line comes while it is paused,
// and lines come again once it is resumed.
func TestPauseResume(t *testing.T) {
	if err := proc.CanPause(); err != nil {
		t.Fatal(err)
	}
	p := mustStart(t, "tick")
	nextLine(t, p)
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // lines in the pipe arrive now
	for len(p.Lines()) > 0 {
		<-p.Lines()
	}
	select {
	case l := <-p.Lines():
		t.Fatalf("a paused process wrote %q", l.Text)
	case <-time.After(200 * time.Millisecond):
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	nextLine(t, p)
}

// TestPauseWhile resumes the process after during, also when it fails.
func TestPauseWhile(t *testing.T) {
	p := mustStart(t, "tick")
	nextLine(t, p)
	failed := errors.New("during failed")
	paused, resumed, err := p.PauseWhile(context.Background(), func(context.Context) error {
		time.Sleep(50 * time.Millisecond)
		return failed
	})
	if !errors.Is(err, failed) {
		t.Errorf("PauseWhile: %v, want during's error", err)
	}
	if d := resumed.Sub(paused); d < 50*time.Millisecond {
		t.Errorf("paused for %v, want at least 50ms", d)
	}
	time.Sleep(20 * time.Millisecond)
	for len(p.Lines()) > 0 {
		<-p.Lines()
	}
	nextLine(t, p) // it runs again
}

// TestKillReachesTheGroup kills a child whose own child runs in its group:
// both die.
func TestKillReachesTheGroup(t *testing.T) {
	p := mustStart(t, "parent", "group")
	grandchild, err := strconv.Atoi(nextLine(t, p))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for range p.Lines() {
	}
	if p.ExitCode() != -1 {
		t.Errorf("ExitCode %d after SIGKILL, want -1", p.ExitCode())
	}
	waitGone(t, grandchild)
}

// TestTerminate ends a paused child with SIGCONT and SIGTERM.
func TestTerminate(t *testing.T) {
	p := mustStart(t, "tick")
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(); err != nil {
		t.Fatal(err)
	}
	for range p.Lines() {
	}
	if ws, ok := p.State().Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGTERM {
		t.Errorf("state %v, want ended by SIGTERM", p.State())
	}
}

// waitGone waits until pid has exited: no such process, or a zombie.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			return
		}
		if fields := strings.Fields(string(stat)); err == nil && len(fields) > 2 && fields[2] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	tail := &proc.Tail{Max: 5}
	fmt.Fprint(tail, "abc")
	fmt.Fprint(tail, "defg")
	if got := tail.String(); got != "cdefg" {
		t.Errorf("bounded tail %q, want cdefg", got)
	}
	all := &proc.Tail{}
	fmt.Fprint(all, "abc")
	fmt.Fprint(all, "defg")
	if got := all.String(); got != "abcdefg" {
		t.Errorf("unbounded tail %q, want abcdefg", got)
	}
	if got := proc.LastLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("LastLines %q, want %q", got, "b\nc")
	}
}

func TestPrefixWriterWritesWholeLines(t *testing.T) {
	out := &proc.Tail{}
	w := proc.NewPrefixWriter(out, "> ")
	fmt.Fprint(w, "one\ntw")
	if got := out.String(); got != "> one\n" {
		t.Errorf("after a line and a half: %q", got)
	}
	fmt.Fprint(w, "o\nthree")
	if got := out.String(); got != "> one\n> two\n" {
		t.Errorf("after two lines and a half: %q", got)
	}
}

// TestDieWithParentOnLinux kills a child with SIGKILL alone: its own child,
// in another group, dies with it on Linux.
func TestDieWithParentOnLinux(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux has a parent-death signal")
	}
	p := mustStart(t, "parent", "die-with-parent")
	grandchild, err := strconv.Atoi(nextLine(t, p))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, grandchild)
}
