package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
)

// helpSection returns the lines of a section of cobra's help ("Flags:",
// "Available Commands:"), up to the blank line that ends it.
func helpSection(help, title string) []string {
	_, rest, ok := strings.Cut(help, "\n"+title+"\n")
	if !ok {
		return nil
	}
	section, _, _ := strings.Cut(rest, "\n\n")
	return strings.Split(section, "\n")
}

var (
	flagLine    = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)`)
	commandLine = regexp.MustCompile(`^\s+([a-z][a-z0-9-]*)\s`)
)

// A flag means one thing: no command declares a flag of its own under the
// name of a global one (fence demo's --key once took the place of the TLS
// key, --key, for fence demo --endpoints).
func TestNoFlagShadowsAGlobalOne(t *testing.T) {
	help := func(path []string) string {
		t.Helper()
		code, stdout, stderr := runFence(t, append(path, "--help")...)
		if code != 0 {
			t.Fatalf("fence %q --help: exit %d, %s", path, code, stderr)
		}
		return stdout
	}
	global := map[string]bool{}
	for _, l := range helpSection(help(nil), "Flags:") {
		if m := flagLine.FindStringSubmatch(l); m != nil && m[1] != "help" && m[1] != "version" {
			global[m[1]] = true
		}
	}
	if !global["key"] || !global["endpoints"] {
		t.Fatalf("fence --help lists the global flags %v; want --key and --endpoints among them", global)
	}
	var walk func(path []string)
	walk = func(path []string) {
		out := help(path)
		if len(path) > 0 {
			for _, l := range helpSection(out, "Flags:") {
				if m := flagLine.FindStringSubmatch(l); m != nil && global[m[1]] {
					t.Errorf("fence %s declares its own --%s, which is a global flag", strings.Join(path, " "), m[1])
				}
			}
		}
		for _, l := range helpSection(out, "Available Commands:") {
			if m := commandLine.FindStringSubmatch(l); m != nil && m[1] != "help" && m[1] != "completion" {
				walk(append(append([]string{}, path...), m[1]))
			}
		}
	}
	walk(nil)
}

// fence locks takes a PREFIX as fence kv list does, and --prefix as before.
func TestLocksTakesAPrefix(t *testing.T) {
	node := fencetest.Start(t)
	s := mustSession(t, node.Client())
	for _, name := range []string{"jobs/a", "orders/1"} {
		mustLock(t, s, name)
	}
	ep := []string{"--endpoints", node.Endpoint()}
	for _, args := range [][]string{{"locks", "orders/"}, {"locks", "--prefix", "orders/"}, {"locks", "--prefix", "orders/", "orders/"}} {
		code, stdout, stderr := runFence(t, append(ep, args...)...)
		if code != 0 || !strings.Contains(stdout, "orders/1") || strings.Contains(stdout, "jobs/a") {
			t.Errorf("fence %q: exit %d, stdout\n%s\nstderr %s; want orders/1 alone", args, code, stdout, stderr)
		}
	}
	if code, _, stderr := runFence(t, append(ep, "locks", "--prefix", "jobs/", "orders/")...); code != exitFailure || !strings.Contains(stderr, "--prefix") {
		t.Errorf("fence locks --prefix jobs/ orders/: exit %d, stderr %q; want them refused together", code, stderr)
	}
}
