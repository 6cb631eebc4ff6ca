package cli

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/testtls"
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
			t.Logf("fence %q: exit %d, stderr %s", tc.args, code, stderr)
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

// A TLS or auth failure names the flag that fixes it.
func TestTLSAndAuthErrorsNameTheFlag(t *testing.T) {
	ca, otherCA := testtls.NewCA(t, "fence test CA"), testtls.NewCA(t, "another CA")
	dir, otherDir := t.TempDir(), t.TempDir()
	app, stranger := ca.WriteFiles(t, dir, "app"), otherCA.WriteFiles(t, otherDir, "app")
	serveTLS := func(listen string) fencetest.Option {
		return fencetest.WithConfig(func(c *server.Config) {
			c.Listen = listen
			c.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Cert(t, "node")},
				ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
		})
	}
	node := fencetest.Start(t, serveTLS("127.0.0.1:0"))
	misnamed := fencetest.Start(t, serveTLS("127.0.0.2:0")) // its certificate is for 127.0.0.1 and localhost
	plain := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	withCA := append(ep, "--cacert", app.CA)
	all := append(withCA, "--cert", app.Cert, "--key", app.Key)

	checkVoice(t, []voiceCase{
		{name: "plain to a TLS node", args: append(ep, "status"), code: exitFailure,
			want: []string{node.Endpoint() + " serves TLS", "--cacert"}},
		{name: "no client certificate", args: append(withCA, "status"), code: exitFailure,
			want: []string{"requires a client certificate", "--cert", "--key", "certificate required"}},
		{name: "no client certificate, session", args: append(withCA, "lock", "job", "--", "true"), code: exitFailure,
			want: []string{"requires a client certificate", "--cert", "--key"}},
		{name: "a client certificate of another CA", args: append(withCA, "--cert", stranger.Cert, "--key", stranger.Key, "status"), code: exitFailure,
			want: []string{"--cert " + stranger.Cert + " is not"}},
		{name: "no CA", args: append(ep, "--cert", app.Cert, "--key", app.Key, "status"), code: exitFailure,
			want: []string{"not signed by a CA fence trusts", "--cacert", "unknown authority"}},
		{name: "another CA", args: append(ep, "--cacert", stranger.CA, "--cert", app.Cert, "--key", app.Key, "status"), code: exitFailure,
			want: []string{"--cacert " + stranger.CA}},
		{name: "a certificate for another name", args: append([]string{"--endpoints", misnamed.Endpoint(), "--cacert", app.CA, "--cert", app.Cert, "--key", app.Key}, "status"), code: exitFailure,
			want: []string{"--endpoints", "127.0.0.2"}},
		{name: "TLS to a plain node", args: []string{"--endpoints", plain.Endpoint(), "--cacert", app.CA, "status"}, code: exitFailure,
			want: []string{"does not serve TLS", "--cacert"}},
		{name: "a certificate without its key", args: append(withCA, "--cert", app.Cert, "status"), code: exitFailure,
			want: []string{"--cert", "--key"}},
		{name: "a CA file that is none", args: append(ep, "--cacert", app.Key, "status"), code: exitFailure,
			want: []string{"--cacert " + app.Key}},
	})
	if code, _, stderr := runFence(t, append(all, "status")...); code != 0 {
		t.Fatalf("status over TLS: exit %d, %s", code, stderr)
	}

	// Auth: no credential, one the node does not know, one without the
	// permission.
	authed := fencetest.Start(t)
	ep = []string{"--endpoints", authed.Endpoint()}
	rootFile, appFile, bogus := filepath.Join(dir, "root.token"), filepath.Join(dir, "app.token"), filepath.Join(dir, "bogus.token")
	if err := os.WriteFile(bogus, []byte("bogus\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"user", "add", "root"}, {"user", "grant-role", "root", "root"}, {"token", "create", "root", "--out", rootFile},
		{"user", "add", "app"}, {"token", "create", "app", "--out", appFile},
		{"--auth-token-file", rootFile, "auth", "enable"},
	} {
		if code, _, stderr := runFence(t, append(ep, args...)...); code != 0 {
			t.Fatalf("fence %q: %s", args, stderr)
		}
	}
	checkVoice(t, []voiceCase{
		{name: "no credential", args: append(ep, "status"), code: exitFailure,
			want: []string{"auth is on", "--auth-token-file", "--cert"}},
		{name: "an unknown token", args: append(ep, "--auth-token-file", bogus, "status"), code: exitFailure,
			want: []string{"--auth-token-file " + bogus + ": ", "unknown or revoked"}},
		{name: "no permission", args: append(ep, "--auth-token-file", appFile, "kv", "put", "k", "v"), code: exitFailure,
			want: []string{"--auth-token-file " + appFile + ": ", "permission denied"}},
		{name: "no permission, session", args: append(ep, "--auth-token-file", appFile, "lock", "job", "--", "true"), code: exitFailure,
			want: []string{"--auth-token-file " + appFile + ": ", "permission denied"}},
	})
}
