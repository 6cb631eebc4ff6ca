package fence_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// The modules under integrations/ (integrations/k8sleader, a client-go
// resourcelock) have go.mod files of their own, so that their
// dependencies reach only those who import them; "go test ./..." from the
// root does not enter them. This test runs each one's vet and its suite,
// with the race detector, and fails when they do, so that the suite CI
// runs covers them. (gofmt already does: scripts/test.sh formats every
// file git knows.)
func TestIntegrationModules(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the integration modules' suites build client-go and run real nodes")
	}
	mods, err := filepath.Glob(filepath.Join("integrations", "*", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) == 0 {
		t.Fatal("no module under integrations/: this test has nothing to run")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, mod := range mods {
		dir := filepath.Dir(mod)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			for _, args := range [][]string{
				{"vet", "./..."},
				{"test", "-race", "-count=1", "./..."},
			} {
				cmd := exec.Command(gobin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off") // the module alone, as its users build it
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("go %v in %s: %v\n%s", args, dir, err, out)
				}
				t.Logf("go %v in %s:\n%s", args, dir, out)
			}
		})
	}
}
