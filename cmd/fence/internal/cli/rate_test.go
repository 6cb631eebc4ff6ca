package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every --session-rate takes a rate the same way, fence serve's too: N/s,
// N/m, N/h, or a bare N per second; it refuses anything else naming
// itself.
func TestSessionRateTakesOneSyntax(t *testing.T) {
	g := &globals{}
	root := &cobra.Command{Use: "fence"}
	root.AddCommand(serveCommand(g), userCommand(g))
	for _, tc := range []struct {
		rate, want string // want: the rate as fence prints it back; "" if refused
	}{
		{"10", "10/s"}, {"10/s", "10/s"}, {"30/m", "0.5/s"}, {"7200/h", "2/s"}, {"0", "0"},
		{"5/d", ""}, {"-2", ""}, {"fast", ""}, {"NaN", ""},
	} {
		for _, args := range [][]string{{"serve"}, {"user", "add", "u"}, {"user", "set-quota", "u"}} {
			cmd, _, err := root.Find(args)
			if err != nil {
				t.Fatalf("finding fence %q: %v", args, err)
			}
			err = cmd.Flags().Parse([]string{"--session-rate", tc.rate})
			switch got := cmd.Flags().Lookup("session-rate").Value.String(); {
			case tc.want == "" && err == nil:
				t.Errorf("fence %s --session-rate %s was accepted as %s", cmd.CommandPath(), tc.rate, got)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("fence %s --session-rate %s = %s (%v), want %s", cmd.CommandPath(), tc.rate, got, err, tc.want)
			}
		}
	}
	// As fence serve takes it from a flag, a variable or its file, and
	// prints it back (--print-config); a refusal names the setting, the
	// value and the syntax.
	file := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(file, []byte("session-rate: 7200/h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"--session-rate", "30/m"}, want: "session-rate: 0.5/s # flag"},
		{env: "30/m", want: "session-rate: 0.5/s # env FENCE_SESSION_RATE"},
		{args: []string{"--config", file}, want: "session-rate: 2/s # file"},
		{args: []string{"--session-rate", "5/d"}, want: `"5/d" for "--session-rate"`},
		{env: "5/d", want: `FENCE_SESSION_RATE "5/d": the unit after / is s, m or h`},
	} {
		t.Setenv("FENCE_SESSION_RATE", tc.env)
		code, stdout, stderr := runFence(t, append(append([]string{"serve"}, tc.args...), "--print-config")...)
		refused := strings.Contains(tc.want, "5/d")
		if out := stdout + stderr; (code != 0) != refused || !strings.Contains(out, tc.want) || refused && !strings.Contains(out, rateSyntax) {
			t.Errorf("fence serve %q --print-config, FENCE_SESSION_RATE=%q: exit %d\n%s%s\nwant %q", tc.args, tc.env, code, stdout, stderr, tc.want)
		}
	}
}
