package fence_test

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The resource side and the lock-free patterns are imported by services
// that never talk to the lock service: they must not pull in its client,
// raft, Connect or the API (docs/design.md, Parts).
func TestResourcePackagesStayLight(t *testing.T) {
	forbidden := []string{
		"github.com/fencelock/fence/client",
		"github.com/fencelock/fence/api/",
		"github.com/fencelock/fence/server",
		"github.com/hashicorp/raft",
		"connectrpc.com/connect",
		"google.golang.org/grpc",
	}
	for _, pkg := range []string{"./nolock", "./fencing", "./fencing/boltfence", "./fencing/pgfence", "./fencing/sqlitefence"} {
		out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

// Comments and tests cite documents by path ("docs/design.md, Lock-delay");
// every document cited must ship with the code.
func TestCitedDocumentsExist(t *testing.T) {
	cite := regexp.MustCompile(`[A-Za-z0-9_./-]+\.md\b`)
	ignored := ignoredFolders(t)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && ignored[path] {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range cite.FindAllString(string(data), -1) {
			if _, err := os.Stat(doc); err != nil {
				t.Errorf("%s cites %s, which is not in the repository", path, doc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ignoredFolders returns the folders git ignores (what a build or an
// install leaves: the TypeScript client's node_modules, dist and build),
// which are not the repository's.
func ignoredFolders(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	ignored := map[string]bool{}
	for _, line := range strings.Fields(string(out)) {
		if dir, ok := strings.CutSuffix(line, "/"); ok {
			ignored[filepath.FromSlash(dir)] = true
		}
	}
	return ignored
}

// The layout table of docs/architecture.md names every folder of the
// repository that holds code, so that a newcomer finds each one explained.
func TestLayoutNamesEveryFolder(t *testing.T) {
	page, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(page), "\n## Layout\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Layout" section`)
	}
	if i := strings.Index(layout, "\n## "); i >= 0 {
		layout = layout[:i]
	}
	ignored := ignoredFolders(t)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == "." {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || ignored[path] {
			return filepath.SkipDir
		}
		if !strings.Contains(layout, "`"+path+"/`") && !strings.Contains(layout, "`"+path+"`") {
			t.Errorf("the layout table of docs/architecture.md does not name %s/", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// module is the import path of this repository's module.
const module = "github.com/fencelock/fence"

// floors are the repository's floors, from the ground up, as the layout of
// docs/architecture.md tells them. The production code of a package (its
// files other than tests) imports only packages of its own floor and of the
// floors below, so that every import arrow runs down. Tests stand above
// their package and may import what Go's internal rule lets them. Paths are
// relative to the module; "p/..." is p and every package under it.
var floors = []struct {
	name     string
	packages []string
}{
	{"ground: what the libraries share", []string{
		".", "api/...",
		"internal/buildinfo", "internal/clock", "internal/fsm", "internal/fsmpb",
		"internal/ops", "internal/rpcerr", "internal/sqlgen", "internal/walfmt", "internal/wire",
	}},
	{"product: what users import", []string{"client", "fencetest", "fencing/...", "nolock", "server/..."}},
	{"process control: the tool's, shared with tests", []string{"internal/proc"}},
	{"test scaffolding", []string{"internal/testutil/..."}},
	{"the tool: what only cmd/fence uses", []string{"cmd/fence/..."}},
	{"programs and checks of the whole", []string{"examples/...", "e2e", "docs", "deploy", "clients"}},
}

// within reports whether the package at path is named by pattern, an
// entry of floors.
func within(path, pattern string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// floorOf returns the index in floors of the package at path, or -1 if no
// floor names it.
func floorOf(path string) int {
	for i, f := range floors {
		if slices.ContainsFunc(f.packages, func(pattern string) bool { return within(path, pattern) }) {
			return i
		}
	}
	return -1
}

// moduleImports lists each package of the module as GOOS builds it, with
// the packages of the module that its production code imports, all as
// paths relative to the module.
func moduleImports(t *testing.T, goos string) map[string][]string {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-e", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Env = append(os.Environ(), "GOOS="+goos)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GOOS=%s go list ./...: %v", goos, err)
	}
	relative := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, _ := relative(fields[0])
		imports[pkg] = nil
		for _, dep := range fields[1:] {
			if dep, ok := relative(dep); ok {
				imports[pkg] = append(imports[pkg], dep)
			}
		}
	}
	return imports
}

// Every import arrow runs down: no package's production code imports a
// package of a floor above its own, on any system the command is built
// for. A package on no floor fails too, so that a new folder is given its
// place, and so does an entry of floors that names no package.
func TestImportsRunDown(t *testing.T) {
	problems := map[string]bool{}
	var packages []string
	for _, goos := range []string{"linux", "darwin", "windows"} {
		for pkg, deps := range moduleImports(t, goos) {
			packages = append(packages, pkg)
			from := floorOf(pkg)
			if from < 0 {
				problems[pkg+" is on no floor: add it to floors, and to the layout of docs/architecture.md"] = true
				continue
			}
			for _, dep := range deps {
				if to := floorOf(dep); to > from {
					problems[fmt.Sprintf("%s (%s) imports %s (%s): the arrow runs up", pkg, floors[from].name, dep, floors[to].name)] = true
				}
			}
		}
	}
	for _, f := range floors {
		for _, pattern := range f.packages {
			if !slices.ContainsFunc(packages, func(pkg string) bool { return within(pkg, pattern) }) {
				problems[fmt.Sprintf("floors names %s (%s), which is no package", pattern, f.name)] = true
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(problems)) {
		t.Error(p)
	}
}

// An example is a program to copy out of the repository and build there,
// where nothing under internal/ can be imported: its program imports only
// fence's public packages (its tests may use the repository's scaffolding).
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	for pkg, deps := range moduleImports(t, runtime.GOOS) {
		if !within(pkg, "examples/...") {
			continue
		}
		for _, dep := range deps {
			if within(dep, "internal/...") || strings.Contains(dep, "/internal/") {
				t.Errorf("%s imports %s, which a copy of it cannot", pkg, dep)
			}
		}
	}
}
