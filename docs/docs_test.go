// Package docs_test runs the documentation: every shell block of README.md
// and docs/**/*.md, as written, against real fence nodes, and every Go
// program shown, so that a page cannot say what the program does not do.
//
// How a page is run (docs/README.md, "Pages are tests", says it for
// writers):
//
//   - A page's ```sh blocks run in order, in one bash (set -euo pipefail)
//     whose working directory is a new empty one, with the fence command
//     built from this checkout first on PATH. Variables and background
//     processes carry from one block to the next; everything the page
//     started is killed when it ends.
//   - A line "#> text" after a command shows what that command prints
//     (stdout and stderr as a terminal shows them): the lines are compared,
//     "..." matching any run of characters within a line. Several "#>"
//     lines are several lines of output, in order; others may come between.
//   - ```sh serve: the block starts a node in the background (it ends with
//     &); the page goes on once 127.0.0.1:7420 (or the address after
//     "serve=") answers /readyz.
//   - ```sh norun REASON: not run (a crontab line, a command for another
//     machine); REASON says why and how it is checked instead. A block with
//     neither is run.
//   - ```go blocks are whole programs (package main), built against this
//     checkout and run after the page's shell blocks so far (a node is
//     up); ```go norun REASON marks a fragment shown for reading, checked
//     elsewhere (an Example test, a file the page quotes).
//
// The test logs how many blocks of each kind it ran, and fails for a page
// whose blocks fail.
package docs_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testbin"
)

var fenceBin string

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &fenceBin)) }

// block is a fenced code block of a page.
type block struct {
	line  int    // of the opening fence, 1-based
	lang  string // sh, go, ...
	attrs string // the rest of the info string
	body  string
}

func (b block) attr(name string) (string, bool) {
	for _, f := range strings.Fields(b.attrs) {
		k, v, _ := strings.Cut(f, "=")
		if k == name {
			return v, true
		}
	}
	return "", false
}

// blocks returns the fenced code blocks of a markdown page.
func blocks(page string) []block {
	var out []block
	var cur *block
	for i, line := range strings.Split(page, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			info := strings.TrimPrefix(trimmed, "```")
			lang, attrs, _ := strings.Cut(info, " ")
			cur = &block{line: i + 1, lang: lang, attrs: attrs}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	return out
}

// pages lists README.md and docs/**/*.md, relative to the repository.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			out = append(out, filepath.Join("docs", path))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPagesRun runs every page.
func TestPagesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every page against real nodes")
	}
	var ran, marked int
	for _, page := range pages(t) {
		t.Run(page, func(t *testing.T) {
			r, m := runPage(t, page)
			ran += r
			marked += m
		})
	}
	t.Logf("ran %d blocks; %d marked norun", ran, marked)
}

// expectation is what a page shows a command printing.
type expectation struct {
	line  int // of the page
	lines []string
}

// script is a page's shell blocks, made into one bash script with a
// sentinel after each block and around each command whose output is shown.
type script struct {
	parts  []string // one per block
	checks map[int]expectation
}

// shellPart rewrites block b (the page's n-th runnable block) for the
// page's bash: sentinels around each command whose output the page shows.
func shellPart(b block, n int, checks map[int]expectation) string {
	var out strings.Builder
	lines := strings.Split(strings.TrimRight(b.body, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		var shown []string
		j := i + 1
		for ; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "#>"); j++ {
			shown = append(shown, strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(lines[j]), "#>"), " "))
		}
		if len(shown) == 0 {
			out.WriteString(lines[i] + "\n")
			continue
		}
		id := len(checks)
		checks[id] = expectation{line: b.line + 1 + i, lines: shown}
		fmt.Fprintf(&out, "echo '<<<OUT %d>>>'\n%s\necho '<<<END %d>>>'\n", id, lines[i], id)
		i = j - 1
	}
	fmt.Fprintf(&out, "echo '<<<BLOCK %d>>>'\n", n)
	return out.String()
}

// runPage runs one page and returns how many blocks it ran and how many
// are marked norun.
func runPage(t *testing.T, page string) (ran, marked int) {
	data, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sh := startShell(t, dir)
	checks := map[int]expectation{}
	for _, b := range blocks(string(data)) {
		if _, ok := b.attr("norun"); ok {
			if strings.TrimSpace(strings.TrimPrefix(b.attrs, "norun")) == "" {
				t.Errorf("%s:%d: a norun block says why it is not run, and how it is checked instead", page, b.line)
			}
			marked++
			continue
		}
		switch b.lang {
		case "sh", "bash":
			n := ran
			ran++
			if err := sh.run(shellPart(b, n, checks), n); err != nil {
				t.Fatalf("%s:%d: the block fails: %v\noutput:\n%s", page, b.line, err, sh.output())
			}
			if _, ok := b.attr("serve"); ok {
				addr, _ := b.attr("serve")
				waitReady(t, page, b.line, cmpOr(addr, "127.0.0.1:7420"), sh)
			}
		case "go":
			ran++
			runGo(t, page, b, dir)
		}
	}
	sh.close()
	for id, want := range checks {
		got, ok := sh.region(id)
		if !ok {
			t.Errorf("%s:%d: the command did not run to its end", page, want.line)
			continue
		}
		if !matches(got, want.lines) {
			t.Errorf("%s:%d: the page shows\n\t%s\nthe command printed\n\t%s", page, want.line,
				strings.Join(want.lines, "\n\t"), strings.ReplaceAll(strings.TrimRight(got, "\n"), "\n", "\n\t"))
		}
	}
	return ran, marked
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// matches reports whether the lines of want appear in got in order, each
// matching a whole line, "..." standing for any run of characters.
func matches(got string, want []string) bool {
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	i := 0
	for _, w := range want {
		re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(w), `\.\.\.`, ".*") + "$")
		for i < len(lines) && !re.MatchString(lines[i]) {
			i++
		}
		if i == len(lines) {
			return false
		}
		i++
	}
	return true
}

// shell is one bash that runs a page's blocks in turn.
type shell struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	out   strings.Builder
	seen  chan string // sentinel lines, as they come
	done  chan struct{}
}

func startShell(t *testing.T, dir string) *shell {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-s")
	cmd.Dir = dir
	cmd.Env = pageEnv(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	s := &shell{cmd: cmd, stdin: stdin, seen: make(chan string, 64), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		w.Close()
	}()
	go s.read(r)
	t.Cleanup(s.close)
	io.WriteString(stdin, "set -euo pipefail\nexec 2>&1\n")
	return s
}

func (s *shell) read(r io.Reader) {
	defer close(s.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		s.mu.Lock()
		s.out.WriteString(line + "\n")
		s.mu.Unlock()
		if strings.HasPrefix(line, "<<<BLOCK ") {
			s.seen <- line
		}
	}
}

// run sends a block and waits for its sentinel, or for bash to end.
func (s *shell) run(part string, n int) error {
	if _, err := io.WriteString(s.stdin, part); err != nil {
		return err
	}
	want := fmt.Sprintf("<<<BLOCK %d>>>", n)
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case line := <-s.seen:
			if line == want {
				return nil
			}
		case <-s.done:
			return fmt.Errorf("bash exited (%v)", s.cmd.ProcessState)
		case <-timeout:
			return fmt.Errorf("still running after 5 minutes")
		}
	}
}

func (s *shell) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// region returns what was printed between a check's sentinels.
func (s *shell) region(id int) (string, bool) {
	out := s.output()
	start := strings.Index(out, fmt.Sprintf("<<<OUT %d>>>\n", id))
	end := strings.Index(out, fmt.Sprintf("<<<END %d>>>\n", id))
	if start < 0 || end < start {
		return "", false
	}
	return out[start+len(fmt.Sprintf("<<<OUT %d>>>\n", id)) : end], true
}

// close ends bash and everything the page started.
func (s *shell) close() {
	if s.cmd.Process == nil {
		return
	}
	s.stdin.Close()
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGCONT)
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// pageEnv is a page's environment: the fence of this checkout first on
// PATH, a home of its own, nothing of the caller's fence settings.
func pageEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FENCE_") || k == "HOME" || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+dir, "PATH="+filepath.Dir(fenceBin)+":"+os.Getenv("PATH"))
}

// waitReady waits until the node a serve block started answers /readyz.
func waitReady(t *testing.T, page string, line int, addr string, sh *shell) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s:%d: the node at %s is not ready after 30s; output:\n%s", page, line, addr, sh.output())
}

// runGo builds the program of a go block against this checkout and runs
// it in the page's directory.
func runGo(t *testing.T, page string, b block, dir string) {
	t.Helper()
	if !strings.Contains(b.body, "package main") {
		t.Errorf("%s:%d: a go block is a whole program (package main), or is marked norun with a reason", page, b.line)
		return
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "prog")
	mod := "module docsprog\n\ngo 1.26\n\nrequire github.com/fencelock/fence v0.0.0\n\nreplace github.com/fencelock/fence => " + repo + "\n"
	for name, data := range map[string]string{"go.mod": mod, "main.go": b.body} {
		if err := os.MkdirAll(src, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tidy := exec.CommandContext(ctx, "go", "mod", "tidy")
	tidy.Dir = src
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("%s:%d: go mod tidy: %v\n%s", page, b.line, err, out)
	}
	bin := filepath.Join(src, "prog")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s:%d: the program does not build: %v\n%s", page, b.line, err, out)
	}
	run := exec.CommandContext(ctx, bin)
	run.Dir = dir
	run.Env = pageEnv(dir)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("%s:%d: the program fails: %v\n%s", page, b.line, err, out)
	}
}

// TestEveryBlockIsRunOrMarked is the fast half: every shell and Go block
// of every page is one the runner runs, or is marked norun with a reason.
func TestEveryBlockIsRunOrMarked(t *testing.T) {
	for _, page := range pages(t) {
		data, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks(string(data)) {
			_, marked := b.attr("norun")
			switch {
			case marked && strings.TrimSpace(strings.TrimPrefix(b.attrs, "norun")) == "":
				t.Errorf("%s:%d: norun without a reason", page, b.line)
			case !marked && b.lang == "go" && !strings.Contains(b.body, "package main"):
				t.Errorf("%s:%d: a go block that is not a whole program must be marked norun, with a reason", page, b.line)
			case !marked && b.lang == "" && looksLikeShell(b.body):
				t.Errorf("%s:%d: a block of commands without a language: mark it sh (run) or sh norun REASON", page, b.line)
			}
		}
	}
}

// looksLikeShell reports whether an unlabelled block holds commands.
func looksLikeShell(body string) bool {
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && slices.Contains([]string{"fence", "curl", "go", "kubectl", "systemctl", "openssl"}, f[0]) {
			return true
		}
	}
	return false
}
