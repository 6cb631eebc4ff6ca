package fence_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
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
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
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
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == "." {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
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
