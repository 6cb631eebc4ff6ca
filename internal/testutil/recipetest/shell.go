package recipetest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fencelock/fence/internal/proc"
)

// shellBlock is a shell code block of a page, and the text block that may
// follow it: what the shell block prints.
var shellBlock = regexp.MustCompile("(?s)```sh[^\\n]*\n(.*?)```(?:\\s*```text\n(.*?)```)?")

// ShellBlock returns the shell code block of the page (a path from the
// repository's root) that contains want, and the text block that follows
// it, if any ("" if none): what the page says it prints. It fails the test
// unless exactly one shell block contains want.
func ShellBlock(t *testing.T, page, want string) (script, output string) {
	t.Helper()
	found := 0
	for _, m := range shellBlock.FindAllStringSubmatch(Page(t, page), -1) {
		if strings.Contains(m[1], want) {
			script, output = m[1], m[2]
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%s has %d shell blocks with %q, want 1", page, found, want)
	}
	return script, output
}

// Page returns the text of the page, a path from the repository's root.
func Page(t *testing.T, page string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), page))
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// Shell runs a page's shell commands as a reader would paste them: bash,
// in a directory of its own, with the fence command and the recipe's
// program (under the name the page calls it) first on PATH, and
// FENCE_ENDPOINTS set to one fence node's address. A `fence serve` run by
// the commands serves at that address, on loopback ports that were free
// (fence serve's other flags are the commands' own).
type Shell struct {
	dir, bin, endpoint string
}

// NewShell prepares a Shell whose commands call the recipe's program
// program and reach fence at endpoint: a node's address, or a free one
// (FreeAddr) where a `fence serve` of the commands is to listen.
func NewShell(t *testing.T, program, endpoint string) *Shell {
	t.Helper()
	sh := &Shell{dir: t.TempDir(), bin: t.TempDir(), endpoint: endpoint}
	raft := freeAddrs(t, 1)[0]
	wrapper := fmt.Sprintf(`#!/bin/sh
# fence, with fence serve on the test's addresses
if [ "$1" = serve ]; then
	shift
	exec %q serve --listen %q --raft-listen %q "$@"
fi
exec %[1]q "$@"
`, fenceBin, endpoint, raft)
	if err := os.WriteFile(filepath.Join(sh.bin, "fence"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exampleBin, filepath.Join(sh.bin, program)); err != nil {
		t.Fatal(err)
	}
	return sh
}

// Dir is the directory the commands run in.
func (sh *Shell) Dir() string { return sh.dir }

// Run starts bash running script. When the script ends, whatever it left
// running in the background (a fence serve, a node) is killed, so that its
// output ends, and bash exits with the script's status; anything left is
// killed when the test ends.
func (sh *Shell) Run(t *testing.T, name, script string) *Proc {
	t.Helper()
	env := append(os.Environ(), "PATH="+sh.bin+string(os.PathListSeparator)+os.Getenv("PATH"), "FENCE_ENDPOINTS="+sh.endpoint)
	return start(t, proc.Spec{Name: name, Path: "bash", Args: []string{"-c", script + "\nstatus=$?\nkill -KILL $(jobs -p) 2>/dev/null\nwait\nexit $status"},
		Dir: sh.dir, Env: env, Lines: true, DieWithParent: true, StderrBytes: 64 << 10})
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}
