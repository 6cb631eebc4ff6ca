package cli

import (
	"regexp"
	"strings"
	"testing"
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
