package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/fencetest"
)

// freeLoopbackAddr returns a loopback address whose port was free a moment ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A script takes a lease with eval, as docs/leases.md shows, in a real
// bash against a real fence serve: the exported variables carry to the
// commands it runs (renew in a child shell), a second acquire of the held
// lock exits 124 at once naming the holder (and makes eval fail with 124),
// release frees the lock, and a release of the released lease exits 75.
// Names and owners with spaces and quotes survive the quoting.
func TestLeaseEvalRoundTrip(t *testing.T) {
	bin := t.TempDir()
	if err := os.Symlink(fenceBin, filepath.Join(bin, "fence")); err != nil {
		t.Fatal(err)
	}
	api, raft := freeLoopbackAddr(t), freeLoopbackAddr(t)
	script := `set -euo pipefail
fence serve --data-dir data --listen "$API" --raft-listen "$RAFT" 2> serve.log &
until fence status > /dev/null 2>&1; do sleep 0.05; done

eval "$(fence lease acquire "it's nightly" --ttl 30s --owner "backup.sh 'db'")"
echo "acquired lock=$FENCE_LOCK token=$FENCE_TOKEN lease=$FENCE_LEASE"
bash -c 'fence lease renew "it'\''s nightly"'
fence locks

start=$(date +%s%N)
status=0; fence lease acquire "it's nightly" --ttl 30s > out 2> err || status=$?
echo "held: exit $status in $(( ($(date +%s%N) - start) / 1000000 ))ms, printed $(cat out)"
cat err
status=0; eval "$(fence lease acquire "it's nightly" --ttl 30s 2> /dev/null)" || status=$?
echo "eval while held: exit $status"

fence lease release "it's nightly"
fence locks
status=0; fence lease release "it's nightly" 2> err || status=$?
echo "released again: exit $status"
cat err
status=0; FENCE_LOCK=other fence lease renew "it's nightly" 2> err || status=$?
echo "another lock: exit $status"
cat err
kill %1
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"FENCE_ENDPOINTS="+api, "API="+api, "RAFT="+raft)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the script failed: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		"acquired lock=it's nightly token=1 lease=1",
		"renewed lease 1 on it's nightly for 30s (token 1)",
		"it's nightly  1      0        backup.sh 'db' (session 1)",
		"held: exit 124 in ",
		", printed (exit 124)",
		`fence: lock "it's nightly" is held by session 1 with token 1 (owner "backup.sh 'db'")`,
		"eval while held: exit 124",
		"released it's nightly (lease 1)",
		"released again: exit 75",
		`fence: lease 1 on "it's nightly" had ended before it was released`,
		"another lock: exit 1",
		`fence: FENCE_LOCK is "other", not "it's nightly": the lease in the environment is another lock's`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the script's output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "LOCK") && strings.Count(got, "it's nightly  ") != 1 {
		t.Errorf("the lock is still listed after its release:\n%s", got)
	}
	// "At once": the refusal took no wait of its own (a generous bound for
	// a loaded machine under -race).
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "held: exit 124 in ") {
			var ms int
			if _, err := fmt.Sscanf(line, "held: exit 124 in %dms", &ms); err == nil && ms > 3000 {
				t.Errorf("fence lease acquire of a held lock took %dms", ms)
			}
		}
	}
}

// fence lease acquire --json prints the API's LeaseResponse; renew and
// release print theirs, {"released": false} for a lease that had ended.
// A missing --ttl or a bad one is refused, printing "(exit 1)" for eval.
func TestLeaseJSONAndRefusals(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	got := runJSON(t, 0, append(ep, "lease", "acquire", "jobs", "--ttl", "1m", "--json")...)
	if got["lock"] != "jobs" || got["token"] == "" || got["leaseId"] == "" || got["ttl"] != "60s" {
		t.Fatalf("lease acquire --json = %v", got)
	}
	t.Setenv(envLock, "jobs")
	t.Setenv(envLease, got["leaseId"].(string))
	t.Setenv(envLeaseSecret, got["leaseSecret"].(string))
	if r := runJSON(t, 0, append(ep, "lease", "renew", "jobs", "--json")...); r["lock"] != "jobs" || r["token"] != got["token"] || r["ttl"] != "60s" {
		t.Errorf("lease renew --json = %v", r)
	}
	if r := runJSON(t, 0, append(ep, "lease", "release", "jobs", "--json")...); r["released"] != true {
		t.Errorf("lease release --json = %v", r)
	}
	if r := runJSON(t, exitLockLost, append(ep, "lease", "release", "jobs", "--json")...); r["released"] != false {
		t.Errorf("lease release --json of a released lease = %v", r)
	}

	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"lease", "acquire", "jobs"}, "needs --ttl"},
		{[]string{"lease", "acquire", "jobs", "--ttl", "2h"}, "ttl 2h0m0s is outside the allowed 1s to 1h0m0s"},
		{[]string{"lease", "acquire", "", "--ttl", "1m"}, "lock name is empty"},
		{[]string{"lease", "acquire", "--ttl", "1m"}, "takes one lock NAME, not 0 arguments"},
	} {
		code, stdout, stderr := runFence(t, append(ep, tc.args...)...)
		if code != exitFailure || stdout != "(exit 1)\n" || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("fence %q: exit %d, stdout %q, stderr %q; want 1, (exit 1) and %q", tc.args, code, stdout, stderr, tc.stderr)
		}
	}
	t.Setenv(envLeaseSecret, "")
	if code, _, stderr := runFence(t, append(ep, "lease", "renew", "jobs")...); code != exitFailure || !strings.Contains(stderr, "FENCE_LEASE and FENCE_LEASE_SECRET are not set") {
		t.Errorf("lease renew without a secret: exit %d, %q", code, stderr)
	}
}

func TestShellQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nightly", "nightly"},
		{"jobs/db-2:backup", "jobs/db-2:backup"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"$(rm -rf ~)", "'$(rm -rf ~)'"},
		{"", "''"},
		{"café", "'café'"},
	} {
		if got := shellQuote(tc.in); got != tc.want {
			t.Errorf("shellQuote(%q) = %s, want %s", tc.in, got, tc.want)
		}
		out, err := exec.Command("bash", "-c", "printf %s "+shellQuote(tc.in)).Output()
		if err != nil || string(out) != tc.in {
			t.Errorf("bash read %s as %q (%v), want %q", shellQuote(tc.in), out, err, tc.in)
		}
	}
}
