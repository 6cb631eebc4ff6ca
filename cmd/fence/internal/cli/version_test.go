package cli

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/server"
)

// fence version and fence --version print the module version and the VCS
// revision the binary was built from, as the toolchain recorded it (go
// version -m); a build without one (-buildvcs=false, a git worktree, no
// .git) says so.
func TestVersionPrintsBuildInfo(t *testing.T) {
	meta, err := exec.Command("go", "version", "-m", fenceBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "revision unknown"
	if m := regexp.MustCompile(`(?m)^\s*build\s+vcs\.revision=(\S+)$`).FindSubmatch(meta); m != nil {
		want = "revision " + string(m[1])
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(fenceBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("fence %v: %v\n%s", args, err, out)
		}
		text := string(out)
		if !regexp.MustCompile(`(?m)^fence (v\S+|devel)$`).MatchString(text) || !strings.Contains(text, "\ngo go1.") {
			t.Errorf("fence %v prints no version line and Go version:\n%s", args, text)
		}
		if !strings.Contains(text, "\n"+want) {
			t.Errorf("fence %v does not say %q:\n%s", args, want, text)
		}
	}
}

// fence status shows each node's version.
func TestStatusShowsEachNodesVersion(t *testing.T) {
	node := fencetest.Start(t, fencetest.WithConfig(func(c *server.Config) { c.Version = "v9.8.7-test" }))
	var stdout, stderr bytes.Buffer
	// A node's API address is known once it has registered it, soon after
	// it leads.
	for start := time.Now(); ; {
		stdout.Reset()
		stderr.Reset()
		code := Run(context.Background(), []string{"--endpoints", node.Endpoint(), "status"}, strings.NewReader(""), &stdout, &stderr)
		if code != 0 {
			t.Fatalf("status: exit %d: %s", code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "not known yet") || time.Since(start) > 10*time.Second {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var header string
	rows := 0
	for _, line := range strings.Split(stdout.String(), "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) > 0 && fields[0] == "NODE":
			header = line
		case header != "" && len(fields) > 0:
			rows++
			if col := strings.Index(header, "VERSION"); col < 0 || len(line) < col || !strings.HasPrefix(line[col:], "v9.8.7-test") {
				t.Errorf("node row does not show the version under VERSION:\n%s\n%s", header, line)
			}
		}
	}
	if rows == 0 {
		t.Fatalf("status prints no node rows:\n%s", stdout.String())
	}
}
