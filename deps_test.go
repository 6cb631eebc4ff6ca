package fence_test

import (
	"os/exec"
	"path/filepath"
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
