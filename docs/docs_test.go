// Package docs_test runs the documentation: every shell block of README.md,
// CHANGELOG.md and docs/**/*.md, as written, against real fence nodes, and every Go
// program shown, so that a page cannot say what the program does not do.
// This comment is the one description of the conventions; docs/README.md,
// "Writing docs", points here.
//
// How a page is run:
//
//   - A page's ```sh blocks run in order, in one bash (set -euo pipefail)
//     whose working directory is a new empty one and whose HOME is that
//     directory too. First on PATH are the fence command built from this
//     checkout and the programs of examples/ (fenced-storage, election,
//     job-once, ...), as "go install ./cmd/fence ./examples/..." would
//     leave them. Variables and background processes carry from one block
//     to the next; everything the page started is killed when it ends.
//     Pages run one after another.
//   - A command that fails stops the page, and the output says which one.
//     A command that is meant to fail is written so that the page goes on:
//     "fence kv put ... || echo "exit $?"".
//   - Timing is explicit, so that a page plays the same on a loaded machine
//     and under -race: a page waits for what it needs with a loop on a
//     state that lasts ("until [ -s a.log ]", "until fence kv get k"), not
//     with a bare sleep, nor on a state that may come and go before the
//     loop looks.
//   - A line "#> text" after a command shows what that command prints
//     (stdout and stderr as a terminal shows them): the lines are compared,
//     "..." matching any run of characters within a line. Several "#>"
//     lines are several lines of output, in order; others may come between.
//     A command continued with a backslash at the end of its lines is one
//     command; a loop or an if whose output is shown goes on one line.
//     A printed line that is a whole JSON value is compared in its compact
//     form (no spaces between tokens): the API's JSON encoder varies its
//     spacing from build to build on purpose, so write such lines compact.
//   - ```sh serve: the block starts nodes in the background (its commands
//     end with &); the page goes on once 127.0.0.1:7420, or each address
//     of "serve=ADDR,ADDR,...", answers /readyz over plain HTTP (for a TLS
//     node, name its --listen-metrics address). Before the block runs, none
//     of those addresses may answer already: a node left from elsewhere
//     would be tested in the page's place. A page that starts more than the
//     one default node gives its nodes fixed ports of its own in the range
//     17400-17999, and says so.
//   - ```sh norun REASON: not run (a crontab line, a manifest, a command for
//     another machine); REASON says why and how it is checked instead. A
//     block with neither is run.
//   - ```go blocks are whole programs (package main). Each is built in a
//     module of its own made as a user makes one before fence is published
//     ("go mod init", then "go mod edit -require=github.com/fencelock/fence@v0.0.0
//     -replace=github.com/fencelock/fence=CHECKOUT", then "go mod tidy"),
//     and run in the page's directory after the page's shell blocks so far
//     (a node is up). If the program ends with a comment "// Output:" and
//     comment lines after it, what it prints is compared with them as with
//     "#>".
//   - ```go norun REASON marks a fragment shown for reading and checked
//     elsewhere. When REASON starts with "quoted from PATH" (a file from the
//     repository's root), the fragment must be in that file word for word,
//     indentation aside, as recipetest.CheckSnippets checks docs/uses.
//
// The test logs how many blocks of each kind it ran, and fails for a page
// whose blocks fail. The fast half: TestEveryBlockIsRunOrMarked (every
// block is run or marked, and every quote is the file's) and
// TestLinksResolve (every relative link names a file, and an anchor a
// heading of the page it names).
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
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
	"unicode"

	"github.com/fencelock/fence/internal/testutil/testbin"
)

var (
	fenceBin      string
	examplesDir   string          // the examples' programs that pages run
	examplesMu    sync.Mutex      // guards examplesBuilt
	examplesBuilt map[string]bool // by name, those built into examplesDir
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fence-docs-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	examplesDir, examplesBuilt = dir, map[string]bool{}
	code := testbin.RunWithFence(m, &fenceBin)
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildExamples builds the programs of examples/ that the page's shell
// blocks run into examplesDir, as "go install ./examples/..." would name
// them; each is built once.
func buildExamples(t *testing.T, bs []block) {
	t.Helper()
	examplesMu.Lock()
	defer examplesMu.Unlock()
	dirs, err := os.ReadDir("../examples")
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, d := range dirs {
		name := d.Name()
		if !d.IsDir() || examplesBuilt[name] || !slices.ContainsFunc(bs, func(b block) bool { return runsCommand(b, name) }) {
			continue
		}
		pkgs = append(pkgs, "./examples/"+name)
		examplesBuilt[name] = true
	}
	if len(pkgs) == 0 {
		return
	}
	args := []string{"build", "-o", examplesDir + string(filepath.Separator)}
	if testbin.Race() {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
	}
}

// runsCommand reports whether a runnable shell block runs the command
// name: at the start of a line, or after ;, &, |, ( or $(.
func runsCommand(b block, name string) bool {
	if _, marked := b.norun(); marked || (b.lang != "sh" && b.lang != "bash") {
		return false
	}
	re := regexp.MustCompile(`(^|[;&|(]|\$\()\s*` + regexp.QuoteMeta(name) + `(\s|$)`)
	for _, line := range strings.Split(b.body, "\n") {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}

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

// norun returns the reason of a block marked norun.
func (b block) norun() (reason string, marked bool) {
	f := strings.Fields(b.attrs)
	if len(f) == 0 || f[0] != "norun" {
		return "", false
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(b.attrs), "norun")), true
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

// pages lists README.md, CHANGELOG.md and docs/**/*.md, relative to the
// repository.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"README.md", "CHANGELOG.md"}
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

// tally counts a page's blocks.
type tally struct{ sh, goProgs, marked int }

func (a *tally) add(b tally) { a.sh += b.sh; a.goProgs += b.goProgs; a.marked += b.marked }

func (a tally) String() string {
	return fmt.Sprintf("ran %d shell blocks and %d Go programs; %d marked norun", a.sh, a.goProgs, a.marked)
}

// TestPagesRun runs every page.
func TestPagesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every page against real nodes")
	}
	var all tally
	for _, page := range pages(t) {
		t.Run(page, func(t *testing.T) {
			start := time.Now()
			n := runPage(t, page)
			t.Logf("%s: %v (%.1fs)", page, n, time.Since(start).Seconds())
			all.add(n)
		})
	}
	t.Logf("all pages: %v", all)
}

// expectation is what a page shows a command printing.
type expectation struct {
	line  int // of the page
	lines []string
}

// shellPart rewrites block b (the page's n-th runnable block) for the
// page's bash: sentinels around each command whose output the page shows.
// A command continued with a backslash is one command.
func shellPart(b block, n int, checks map[int]expectation) string {
	type command struct {
		line int // of the page
		text string
	}
	var cmds []command
	for i, l := range strings.Split(strings.TrimRight(b.body, "\n"), "\n") {
		if k := len(cmds); k > 0 && strings.HasSuffix(cmds[k-1].text, "\\") {
			cmds[k-1].text += "\n" + l
			continue
		}
		cmds = append(cmds, command{line: b.line + 1 + i, text: l})
	}
	var out strings.Builder
	for i := 0; i < len(cmds); i++ {
		var shown []string
		j := i + 1
		for ; j < len(cmds) && strings.HasPrefix(strings.TrimSpace(cmds[j].text), "#>"); j++ {
			shown = append(shown, strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(cmds[j].text), "#>"), " "))
		}
		if len(shown) == 0 {
			out.WriteString(cmds[i].text + "\n")
			continue
		}
		id := len(checks)
		checks[id] = expectation{line: cmds[i].line, lines: shown}
		fmt.Fprintf(&out, "echo '<<<OUT %d>>>'\n%s\necho '<<<END %d>>>'\n", id, cmds[i].text, id)
		i = j - 1
	}
	fmt.Fprintf(&out, "echo '<<<BLOCK %d>>>'\n", n)
	return out.String()
}

// runPage runs one page and counts its blocks.
func runPage(t *testing.T, page string) (n tally) {
	data, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	bs := blocks(string(data))
	if !slices.ContainsFunc(bs, func(b block) bool { _, m := b.norun(); return !m && (b.lang == "sh" || b.lang == "go") }) {
		for _, b := range bs {
			if _, m := b.norun(); m {
				n.marked++
			}
		}
		return n
	}
	buildExamples(t, bs)
	dir := t.TempDir()
	sh := startShell(t, dir)
	checks := map[int]expectation{}
	for _, b := range bs {
		if reason, ok := b.norun(); ok {
			if reason == "" {
				t.Errorf("%s:%d: a norun block says why it is not run, and how it is checked instead", page, b.line)
			}
			n.marked++
			continue
		}
		switch b.lang {
		case "sh", "bash":
			addrs, serve := serveAddrs(b)
			if serve {
				for _, a := range addrs {
					if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
						c.Close()
						t.Fatalf("%s:%d: something already listens on %s, which the page's node needs: stop it (another fence?)", page, b.line, a)
					}
				}
			}
			start := time.Now()
			if err := sh.run(shellPart(b, n.sh, checks), n.sh); err != nil {
				t.Fatalf("%s:%d: the block fails: %v\noutput:\n%s", page, b.line, err, sh.output())
			}
			n.sh++
			for _, a := range addrs {
				waitReady(t, page, b.line, a, sh)
			}
			logSlow(t, page, b, start)
		case "go":
			start := time.Now()
			n.goProgs++
			runGo(t, page, b, dir, sh)
			logSlow(t, page, b, start)
		}
	}
	sh.close()
	for id := range len(checks) {
		want := checks[id]
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
	return n
}

// logSlow logs a block that took more than two seconds, to keep the
// pages' time in view.
func logSlow(t *testing.T, page string, b block, start time.Time) {
	if d := time.Since(start); d > 2*time.Second {
		t.Logf("%s:%d: %s block took %.1fs", page, b.line, b.lang, d.Seconds())
	}
}

// serveAddrs returns the addresses a serve block's nodes answer /readyz on.
func serveAddrs(b block) ([]string, bool) {
	v, ok := b.attr("serve")
	if !ok {
		return nil, false
	}
	if v == "" {
		return []string{"127.0.0.1:7420"}, true
	}
	return strings.Split(v, ","), true
}

// matches reports whether the lines of want appear in got in order, each
// matching a whole line, "..." standing for any run of characters; a line
// that is a whole JSON value is compared in its compact form.
func matches(got string, want []string) bool {
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	for i := range lines {
		lines[i] = compactJSON(lines[i])
	}
	i := 0
	for _, w := range want {
		w = compactJSON(w)
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

// compactJSON returns line compacted if it is a JSON object or array.
func compactJSON(line string) string {
	trimmed := strings.TrimSpace(line)
	if !strings.HasPrefix(trimmed, "{") && !strings.HasPrefix(trimmed, "[") {
		return line
	}
	var buf bytes.Buffer
	if json.Compact(&buf, []byte(trimmed)) != nil {
		return line
	}
	return buf.String()
}

// shell is one bash that runs a page's blocks in turn.
type shell struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	mu     sync.Mutex
	out    strings.Builder
	seen   chan string   // sentinel lines, as they come
	exited chan struct{} // closed when bash has exited
	done   chan struct{} // closed when no process of the page holds its output open
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
	// An os.Pipe, so that Wait returns when bash exits, even while the
	// nodes it started in the background still write to it.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	s := &shell{cmd: cmd, stdin: stdin, seen: make(chan string, 64), exited: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		cmd.Wait()
		close(s.exited)
	}()
	go s.read(r)
	t.Cleanup(s.close)
	io.WriteString(stdin, "set -euo pipefail\nexec 2>&1\ntrap 'echo \"stopped: $BASH_COMMAND failed with exit status $?\"' ERR\n")
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
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case line := <-s.seen:
			if line == want {
				return nil
			}
		case <-s.exited:
			s.close() // and read what everything printed until then
			return fmt.Errorf("bash exited (%v)", s.cmd.ProcessState)
		case <-timeout:
			return fmt.Errorf("still running after 2 minutes")
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

// pageEnv is a page's environment: the fence of this checkout and the
// examples' programs first on PATH, a home of its own, nothing of the
// caller's fence settings.
func pageEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FENCE_") || k == "HOME" || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	path := filepath.Dir(fenceBin) + string(os.PathListSeparator) + examplesDir + string(os.PathListSeparator) + os.Getenv("PATH")
	return append(env, "HOME="+dir, "PATH="+path)
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

// runGo builds the program of a go block against this checkout, in a
// module made as a user makes one, and runs it in the page's directory.
func runGo(t *testing.T, page string, b block, dir string, sh *shell) {
	t.Helper()
	if !strings.Contains(b.body, "package main") {
		t.Fatalf("%s:%d: a go block is a whole program (package main), or is marked norun with a reason", page, b.line)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.MkdirAll(src, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(b.body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"mod", "init", "example.com/docsprog"},
		{"mod", "edit", "-require=github.com/fencelock/fence@v0.0.0", "-replace=github.com/fencelock/fence=" + repo},
		{"mod", "tidy"},
		{"build", "-o", "prog", "."},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s:%d: go %s: %v\n%s", page, b.line, strings.Join(args, " "), err, out)
		}
	}
	runCtx, cancelRun := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelRun()
	run := exec.CommandContext(runCtx, filepath.Join(src, "prog"))
	run.Dir = dir
	run.Env = pageEnv(dir)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("%s:%d: the program fails: %v\n%s\nthe page's shell so far:\n%s", page, b.line, err, out, sh.output())
	}
	if want := programOutput(b.body); want != nil && !matches(string(out), want) {
		t.Errorf("%s:%d: the program's // Output: comment shows\n\t%s\nthe program printed\n\t%s", page, b.line,
			strings.Join(want, "\n\t"), strings.ReplaceAll(strings.TrimRight(string(out), "\n"), "\n", "\n\t"))
	}
}

// programOutput returns the lines of a program's "// Output:" comment, or
// nil if it has none.
func programOutput(body string) []string {
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "// Output:" {
			continue
		}
		want := []string{}
		for _, l := range lines[i+1:] {
			l = strings.TrimSpace(l)
			if !strings.HasPrefix(l, "//") {
				break
			}
			want = append(want, strings.TrimPrefix(strings.TrimPrefix(l, "//"), " "))
		}
		return want
	}
	return nil
}

// TestEveryBlockIsRunOrMarked is the fast half: every shell and Go block
// of every page is one the runner runs, or is marked norun with a reason,
// and a fragment "quoted from PATH" is in that file.
func TestEveryBlockIsRunOrMarked(t *testing.T) {
	for _, page := range pages(t) {
		data, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks(string(data)) {
			reason, marked := b.norun()
			switch {
			case marked && reason == "":
				t.Errorf("%s:%d: norun without a reason", page, b.line)
			case marked && strings.HasPrefix(reason, "quoted from "):
				checkQuote(t, page, b, reason)
			case !marked && b.lang == "go" && !strings.Contains(b.body, "package main"):
				t.Errorf("%s:%d: a go block that is not a whole program must be marked norun, with a reason", page, b.line)
			case !marked && b.lang == "" && looksLikeShell(b.body):
				t.Errorf("%s:%d: a block of commands without a language: mark it sh (run) or sh norun REASON", page, b.line)
			}
		}
	}
}

// checkQuote checks that block b, marked "norun quoted from PATH ...", is
// in the file PATH line for line, indentation and blank lines aside.
func checkQuote(t *testing.T, page string, b block, reason string) {
	t.Helper()
	path := strings.TrimRight(strings.Fields(strings.TrimPrefix(reason, "quoted from "))[0], ",;:")
	src, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Errorf("%s:%d: the block is quoted from %s: %v", page, b.line, path, err)
		return
	}
	if !containsLines(trimLines(string(src)), trimLines(b.body)) {
		t.Errorf("%s:%d: the block is not in %s word for word:\n%s", page, b.line, path, b.body)
	}
}

func trimLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func containsLines(src, block []string) bool {
	for i := 0; i+len(block) <= len(src); i++ {
		if slices.Equal(src[i:i+len(block)], block) {
			return true
		}
	}
	return false
}

// looksLikeShell reports whether an unlabelled block holds commands.
func looksLikeShell(body string) bool {
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && slices.Contains([]string{"fence", "curl", "go", "kubectl", "systemctl", "openssl", "docker"}, f[0]) {
			return true
		}
	}
	return false
}

// TestLinksResolve checks that every relative link of every page names a
// file of the repository, and a heading of it when it has an anchor.
func TestLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages(t) {
		data, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(prose(string(data)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join("..", filepath.Dir(page), file)
			if file == "" {
				path = filepath.Join("..", page)
			}
			info, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s: the link %s names nothing: %v", page, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: the link %s has an anchor into what is not a page", page, target)
				continue
			}
			linked, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(headingAnchors(string(linked)), anchor) {
				t.Errorf("%s: the link %s names no heading of %s", page, m[1], file)
			}
		}
	}
}

// prose returns a page without its fenced code blocks.
func prose(page string) string {
	var out strings.Builder
	in := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if !in {
			out.WriteString(line + "\n")
		}
	}
	return out.String()
}

// headingAnchors returns the anchors GitHub makes of a page's headings:
// lower case, punctuation dropped, spaces as hyphens.
func headingAnchors(page string) []string {
	var out []string
	for _, line := range strings.Split(prose(page), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var a strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		out = append(out, a.String())
	}
	return out
}
