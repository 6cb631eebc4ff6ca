// Package recipetest runs the recipes of docs/uses as their pages promise:
// a real `fence serve` on loopback, the recipe's program as real processes
// that tests pause with SIGSTOP and kill with SIGKILL, and a check that the
// code a page shows is the program's own, word for word.
// It is test scaffolding (internal/testutil/): the tests of examples/ import
// it.
package recipetest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/internal/testutil/testbin"
)

var (
	fenceBin   string
	exampleBin string
)

// Main is the TestMain of a recipe's tests: it builds the fence command
// and the recipe's program (the package pkg), runs the tests, and removes
// the binaries. It returns the exit code for os.Exit.
func Main(m *testing.M, pkg string) int {
	dir, err := os.MkdirTemp("", "fence-recipe-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if fenceBin, err = testbin.Build(dir, "fence", "github.com/fencelock/fence/cmd/fence"); err == nil {
		exampleBin, err = testbin.Build(dir, "recipe", pkg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the recipe's programs:", err)
		return 1
	}
	return m.Run()
}

// FenceBin is the path of the fence command built by Main.
func FenceBin() string { return fenceBin }

// Serve starts `fence serve` on a temp dir and free loopback ports, and
// returns its API address once it serves. It stops when the test ends.
func Serve(t *testing.T) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addrs := freeAddrs(t, 2)
		p := Start(t, "fence serve", fenceBin, "serve", "--data-dir", t.TempDir(),
			"--listen", addrs[0], "--raft-listen", addrs[1],
			"--heartbeat-timeout", "100ms", "--election-timeout", "100ms")
		deadline := time.Now().Add(20 * time.Second)
		for !p.Exited() && !started(p.Stderr(), addrs[0]) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if !p.Exited() {
			waitHealthy(t, addrs[0])
			return addrs[0]
		}
		if attempt == 3 {
			t.Fatalf("fence serve did not start: %s", p.Stderr())
		}
	}
}

// started reports whether a fence serve's log says it serves at addr.
func started(log, addr string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="fence node started"`) && strings.Contains(line, " listen="+addr+" ") {
			return true
		}
	}
	return false
}

func waitHealthy(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			fmt.Fprintf(c, "GET /healthz HTTP/1.0\r\n\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.Contains(line, " 200 ") {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fence serve on %s did not become healthy", addr)
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// Proc is a process of a recipe, with its output lines collected.
type Proc struct {
	*proc.Process
	lines chan string
	all   chan []string // the lines read so far, handed between readers
}

// Start starts path with args, killed when the test ends.
func Start(t *testing.T, name, path string, args ...string) *Proc {
	t.Helper()
	return start(t, proc.Spec{Name: name, Path: path, Args: args, Lines: true, DieWithParent: true, StderrBytes: 64 << 10})
}

// start starts the process spec describes, which must have Lines.
func start(t *testing.T, spec proc.Spec) *Proc {
	t.Helper()
	name := spec.Name
	p, err := proc.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	r := &Proc{Process: p, lines: make(chan string, 1024), all: make(chan []string, 1)}
	r.all <- nil
	go func() {
		defer close(r.lines)
		for l := range p.Lines() {
			r.lines <- l.Text
		}
	}()
	t.Cleanup(func() {
		p.Resume()
		p.Kill()
		<-p.Done()
		if t.Failed() {
			t.Logf("%s's stderr:\n%s", name, proc.LastLines(p.Stderr(), 30))
		}
	})
	return r
}

// Run starts the recipe's program with args.
func Run(t *testing.T, name string, args ...string) *Proc {
	t.Helper()
	return Start(t, name, exampleBin, args...)
}

// WaitLine waits for an output line that contains want, and returns it.
// It fails the test if the process ends or timeout passes first.
func (p *Proc) WaitLine(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	seen, found, ended := p.read(timeout, func(l string) bool { return strings.Contains(l, want) })
	switch {
	case ended:
		t.Fatalf("%s ended without printing %q; it printed:\n%s\nstderr:\n%s", p.Name(), want, strings.Join(seen, "\n"), proc.LastLines(p.Stderr(), 20))
	case !found:
		t.Fatalf("%s did not print %q within %v; it printed:\n%s", p.Name(), want, timeout, strings.Join(seen, "\n"))
	}
	return seen[len(seen)-1]
}

// Output waits for the process to exit and returns every line it printed
// and its exit code.
func (p *Proc) Output(t *testing.T, timeout time.Duration) ([]string, int) {
	t.Helper()
	seen, _, ended := p.read(timeout, func(string) bool { return false })
	if !ended {
		t.Fatalf("%s did not exit within %v; it printed:\n%s", p.Name(), timeout, strings.Join(seen, "\n"))
	}
	<-p.Done()
	return seen, p.ExitCode()
}

// read reads output lines until one satisfies stop (found), the output
// ends (ended) or timeout passes, and returns every line the process
// printed so far.
func (p *Proc) read(timeout time.Duration, stop func(line string) bool) (seen []string, found, ended bool) {
	seen = <-p.all
	defer func() { p.all <- seen }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return seen, false, true
			}
			seen = append(seen, l)
			if stop(l) {
				return seen, true, false
			}
		case <-timer.C:
			return seen, false, false
		}
	}
}

// WantExit waits for the process to exit, fails the test unless it exits
// with code (or does not exit within timeout), and returns every line it
// printed.
func (p *Proc) WantExit(t *testing.T, code int, timeout time.Duration) []string {
	t.Helper()
	lines, got := p.Output(t, timeout)
	if got != code {
		t.Fatalf("%s exited %d, want %d; it printed:\n%s", p.Name(), got, code, strings.Join(lines, "\n"))
	}
	return lines
}

// Pause stops the process with SIGSTOP.
func (p *Proc) Pause(t *testing.T) {
	t.Helper()
	if err := p.Process.Pause(); err != nil {
		t.Fatal(err)
	}
}

// Resume continues it with SIGCONT.
func (p *Proc) Resume(t *testing.T) {
	t.Helper()
	if err := p.Process.Resume(); err != nil {
		t.Fatal(err)
	}
}

// fenced is a Go code block of a page.
var fenced = regexp.MustCompile("(?s)```go[^\n]*\n(.*?)```")

// CheckSnippets checks that every Go code block of the page (a path from
// the repository's root, such as docs/uses/election.md) appears in one of
// the sources (paths from the test's directory), line for line,
// indentation aside: the page shows the program's own code.
func CheckSnippets(t *testing.T, page string, sources ...string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), page))
	if err != nil {
		t.Fatal(err)
	}
	var src []string
	for _, s := range sources {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, trimLines(string(b))...)
	}
	blocks := fenced.FindAllStringSubmatch(string(doc), -1)
	if len(blocks) == 0 {
		t.Fatalf("%s has no Go code block", page)
	}
	for _, b := range blocks {
		if !contains(src, trimLines(b[1])) {
			t.Errorf("%s shows code that is not in %s:\n%s", filepath.Base(page), strings.Join(sources, ", "), b[1])
		}
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

func contains(src, block []string) bool {
	for i := 0; i+len(block) <= len(src); i++ {
		match := true
		for j := range block {
			if src[i+j] != block[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// Context returns a context that ends with the test.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// Bin is the path of the recipe's program built by Main.
func Bin() string { return exampleBin }

// repoRoot is the directory of the go.mod above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
