package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
)

// The auth commands end to end against a real node: set up root, refuse
// an enable that would lock the caller out, enable with root's token,
// confine a user to a prefix, list tokens without secrets, revoke.
func TestAuthCommands(t *testing.T) {
	node := fencetest.Start(t)
	dir := t.TempDir()
	rootFile, appFile := filepath.Join(dir, "root.token"), filepath.Join(dir, "app.token")
	ep := []string{"--endpoints", node.Endpoint()}
	run := func(want int, args ...string) string {
		t.Helper()
		code, stdout, stderr := runFence(t, append(ep, args...)...)
		if code != want {
			t.Fatalf("fence %s: exit %d, want %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, want, stdout, stderr)
		}
		return stdout + stderr
	}
	asRoot := []string{"--auth-token-file", rootFile}
	run(0, "user", "add", "root")
	run(0, "user", "grant-role", "root", "root")
	// A file there already, readable by all, is made private before the
	// token goes into it; a create that fails leaves what it holds.
	if err := os.WriteFile(rootFile, []byte("the-old-token\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(1, "token", "create", "nobody", "--out", rootFile)
	if got, err := os.ReadFile(rootFile); err != nil || string(got) != "the-old-token\n" {
		t.Fatalf("after a failed token create, the --out file holds %q (%v)", got, err)
	}
	run(0, "token", "create", "root", "--out", rootFile, "--description", "bootstrap")
	if fi, err := os.Stat(rootFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the token file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if out := run(1, "auth", "enable"); !strings.Contains(out, "lock this caller out") {
		t.Fatalf("enable without a credential: %s", out)
	}
	run(0, append(asRoot, "auth", "enable")...)
	if out := run(1, "status"); !strings.Contains(out, "no credential") {
		t.Fatalf("status without a credential: %s", out)
	}
	if out := run(0, append(asRoot, "auth", "status")...); !strings.Contains(out, "auth: on") || !strings.Contains(out, "you: root (by token)") {
		t.Fatalf("auth status: %s", out)
	}
	run(0, append(asRoot, "user", "add", "app", "--max-sessions", "5", "--max-locks", "9")...)
	if out := run(0, append(asRoot, "user", "list")...); !strings.Contains(out, "0/5") || !strings.Contains(out, "0/9") {
		t.Fatalf("user list shows no quotas: %s", out)
	}
	run(0, append(asRoot, "user", "set-quota", "app", "--max-sessions", "7", "--max-waits", "3", "--max-kv-bytes", "1MiB", "--session-rate", "30/m")...)
	if out := run(0, append(asRoot, "user", "list")...); !strings.Contains(out, "0/7") || !strings.Contains(out, "0/9") ||
		!strings.Contains(out, "0/3") || !strings.Contains(out, "0/1048576") || !strings.Contains(out, "0.5/s burst 1") {
		t.Fatalf("user list after set-quota (the flags not given keep their values): %s", out)
	}
	run(0, append(asRoot, "user", "set-quota", "app", "--max-locks", "0", "--session-rate", "0")...)
	if out := run(0, append(asRoot, "user", "list")...); !strings.Contains(out, "0/7") || strings.Contains(out, "0/9") || strings.Contains(out, "burst") {
		t.Fatalf("user list after removing the locks quota and the rate: %s", out)
	}
	for _, bad := range [][]string{{"--max-kv-bytes", "-1"}, {"--max-kv-bytes", "1TB"}, {"--session-rate", "-2"}, {"--session-rate", "5/d"},
		{"--max-sessions", "-1"}, {"--max-locks", "18446744073709551615"}, {"--session-rate", "1", "--session-burst", "0"}} {
		before := run(0, append(asRoot, "user", "list")...)
		if out := run(1, append(append(asRoot, "user", "set-quota", "app"), bad...)...); !strings.Contains(out, bad[0]) {
			t.Fatalf("set-quota %v: the error names no flag: %s", bad, out)
		}
		if after := run(0, append(asRoot, "user", "list")...); after != before {
			t.Fatalf("a refused set-quota %v changed the quotas:\n%s\n%s", bad, before, after)
		}
	}
	if out := run(1, append(asRoot, "user", "set-quota", "nobody", "--max-locks", "1")...); !strings.Contains(out, `no user "nobody"`) {
		t.Fatalf("set-quota of a missing user: %s", out)
	}
	if out := run(1, append(asRoot, "user", "add", "bad", "--max-locks", "18446744073709551615")...); !strings.Contains(out, "--max-locks") {
		t.Fatalf("user add with a quota out of bounds: %s", out)
	}
	if out := run(0, append(asRoot, "user", "list")...); strings.Contains(out, "bad") {
		t.Fatalf("a refused user add added the user: %s", out)
	}
	run(0, append(asRoot, "role", "add", "orders")...)
	run(0, append(asRoot, "role", "grant", "orders", "kv", "write", "orders/")...)
	if out := run(1, append(asRoot, "role", "grant", "orders", "files", "write")...); !strings.Contains(out, "none of lock, kv, admin") {
		t.Fatalf("a bad kind: %s", out)
	}
	run(0, append(asRoot, "user", "grant-role", "app", "orders")...)
	if out := run(0, append(asRoot, "role", "list")...); !strings.Contains(out, `kv write "orders/"`) {
		t.Fatalf("role list: %s", out)
	}
	run(0, append(asRoot, "token", "create", "app", "--out", appFile)...)
	asApp := []string{"--auth-token-file", appFile}
	run(0, append(asApp, "kv", "put", "orders/1", "paid")...)
	if out := run(1, append(asApp, "kv", "put", "jobs/1", "x")...); !strings.Contains(out, "permission denied") || !strings.Contains(out, `kv write on prefix "jobs/1"`) {
		t.Fatalf("app writes outside its prefix: %s", out)
	}
	out := run(0, append(asRoot, "token", "list")...)
	appToken, _ := os.ReadFile(appFile)
	if !strings.Contains(out, "bootstrap") || strings.Contains(out, strings.TrimSpace(string(appToken))) {
		t.Fatalf("token list: %s", out)
	}
	run(0, append(asRoot, "token", "revoke", "2")...)
	run(1, append(asApp, "kv", "get", "orders/1")...)
	run(0, append(asRoot, "auth", "disable")...)
	run(0, "status")
}
