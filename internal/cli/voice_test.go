package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/server"
)

// voiceCase is a command that fails, and what fence must say: every word
// in want (the flags or arguments that the user typed, or that fix it),
// on one line that starts with the one "fence: " of the message.
type voiceCase struct {
	name string
	args []string
	code int
	want []string
}

// checkVoice runs each case and checks what it printed.
func checkVoice(t *testing.T, cases []voiceCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runFence(t, tc.args...)
			if code != tc.code {
				t.Fatalf("fence %q: exit %d, want %d\nstdout %s\nstderr %s", tc.args, code, tc.code, stdout, stderr)
			}
			if !strings.HasPrefix(stderr, "fence: ") || strings.Count(stderr, "fence: ") != 1 {
				t.Errorf("fence %q: stderr %q; want one message with one \"fence: \" before it", tc.args, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("fence %q: stderr %q does not say %q", tc.args, stderr, w)
				}
			}
		})
	}
}

// Every error names the flag or argument the user typed, after exactly one
// "fence: ".
func TestErrorsSpeakWithOneVoice(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	holdLock(t, node, "nightly")
	full := fencetest.Start(t, fencetest.WithConfig(func(c *server.Config) { c.MaxSessions = 1 }))
	if _, err := full.Client().NewSession(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runFence(t, append(ep, "user", "add", "app")...); code != 0 {
		t.Fatalf("user add: %s", stderr)
	}
	t.Setenv("FENCE_LOCK", "")
	t.Setenv("FENCE_TOKEN", "")
	checkVoice(t, []voiceCase{
		{name: "put --strict without a lock", args: append(ep, "kv", "put", "--strict", "k", "v"), code: exitFailure,
			want: []string{"--strict", "--lock", "--token"}},
		{name: "put --strict without a token", args: append(ep, "kv", "put", "--strict", "--lock", "nightly", "k", "v"), code: exitFailure,
			want: []string{"--strict", "--token"}},
		{name: "del --strict", args: append(ep, "kv", "del", "--strict", "k"), code: exitFailure,
			want: []string{"--strict", "--lock", "--token"}},
		{name: "put --token without --lock", args: append(ep, "kv", "put", "--token", "5", "k", "v"), code: exitFailure,
			want: []string{"--token 5", "--lock"}},
		{name: "set-quota over a bound", args: append(ep, "user", "set-quota", "app", "--max-locks", "18446744073709551615"), code: exitFailure,
			want: []string{"--max-locks 18446744073709551615 is over the limit"}},
		{name: "set-quota of bytes over a bound", args: append(ep, "user", "set-quota", "app", "--max-kv-bytes", "1125899906842625"), code: exitFailure,
			want: []string{"--max-kv-bytes 1125899906842625 is over the limit"}},
		{name: "set-quota of a rate without a burst", args: append(ep, "user", "set-quota", "app", "--session-rate", "1", "--session-burst", "0"), code: exitFailure,
			want: []string{"--session-rate 1 needs a --session-burst"}},
		{name: "user add over a bound", args: append(ep, "user", "add", "bob", "--max-sessions", "18446744073709551615"), code: exitFailure,
			want: []string{"--max-sessions 18446744073709551615 is over the limit"}},
		{name: "lock --try while held", args: append(ep, "lock", "--try", "nightly", "--", "true"), code: exitTimeout,
			want: []string{`fence: lock "nightly" is held by session `, "--try"}},
		{name: "session limit", args: []string{"--endpoints", full.Endpoint(), "lock", "x", "--", "true"}, code: exitFailure,
			want: []string{"fence: creating session: limit reached: "}},
	})
}
