package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// fence kv watch prints a line for people per change, the value as text
// when it is UTF-8 on one line; with --json, the API's Event a line.
func TestKVWatchPrintsALineAChange(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	watch := func(args ...string) (stop func() string) {
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr syncbuf.Buffer
		done := make(chan int)
		go func() {
			done <- Run(ctx, append(append(ep, "kv", "watch"), args...), strings.NewReader(""), &stdout, &stderr)
		}()
		return func() string {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for strings.Count(stdout.String(), "\n") < 4 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("kv watch %q: exit %d, stderr %s", args, code, stderr.String())
			}
			return stdout.String()
		}
	}
	text, asJSON := watch("app/"), watch("--json", "app/")
	time.Sleep(200 * time.Millisecond) // both watches are in place
	for _, args := range [][]string{
		{"kv", "put", "app/a", "hello"},
		{"kv", "put", "app/b", "\xff\x00"},
		{"kv", "put", "app/c", "two\nlines"},
		{"kv", "del", "app/a"},
	} {
		if code, _, stderr := runFence(t, append(ep, args...)...); code != 0 {
			t.Fatalf("fence %q: %s", args, stderr)
		}
	}
	lines := strings.Split(strings.TrimSuffix(text(), "\n"), "\n")
	want := []string{"put app/a\trev 1\ttoken 0\thello", `put app/b` + "\trev 2\ttoken 0\t" + `"\xff\x00"`, "put app/c\trev 3\ttoken 0\t" + `"two\nlines"`, "delete app/a\trev 4\ttoken 0"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("kv watch printed\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	lines = strings.Split(strings.TrimSuffix(asJSON(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("kv watch --json printed %d lines, want 4:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, wantType := range []string{"EVENT_TYPE_PUT", "EVENT_TYPE_PUT", "EVENT_TYPE_PUT", "EVENT_TYPE_DELETE"} {
		var ev struct {
			Type string         `json:"type"`
			KV   map[string]any `json:"kv"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &ev); err != nil {
			t.Fatalf("kv watch --json line %d is not JSON: %v\n%s", i, err, lines[i])
		}
		if ev.Type != wantType || ev.KV["modRevision"] != fmt.Sprint(i+1) {
			t.Errorf("kv watch --json line %d = %s, want %s at revision %d", i, lines[i], wantType, i+1)
		}
	}
	if !strings.Contains(lines[0], `"value":"aGVsbG8="`) {
		t.Errorf("kv watch --json does not give the value as the API does (base64): %s", lines[0])
	}
}

// fence kv del says what it deleted, or that nothing was there.
func TestKVDelSaysWhatItDeleted(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	if code, _, stderr := runFence(t, append(ep, "kv", "put", "k", "v")...); code != 0 {
		t.Fatal(stderr)
	}
	for _, want := range []string{"deleted k\n", "k did not exist\n"} {
		if code, stdout, stderr := runFence(t, append(ep, "kv", "del", "k")...); code != 0 || stdout != want {
			t.Errorf("kv del k: exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
		}
	}
}

// fence kv list shows a value that is not one line of text quoted.
func TestKVListQuotesValuesThatAreNotALineOfText(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	for _, kv := range [][2]string{{"a", "plain text"}, {"b", "\x1b[2J"}} {
		if code, _, stderr := runFence(t, append(ep, "kv", "put", kv[0], kv[1])...); code != 0 {
			t.Fatal(stderr)
		}
	}
	want := "a\trev 1\ttoken 0\tplain text\nb\trev 2\ttoken 0\t\"\\x1b[2J\"\n"
	if code, stdout, _ := runFence(t, append(ep, "kv", "list")...); code != 0 || stdout != want {
		t.Errorf("kv list printed %q, want %q", stdout, want)
	}
}

// A write that names a lock without a token would go unfenced, though
// whoever typed --lock meant it fenced: it is refused, and nothing is
// written.
func TestKVWriteWithALockAndNoTokenIsRefused(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	t.Setenv("FENCE_LOCK", "")
	t.Setenv("FENCE_TOKEN", "")
	for _, args := range [][]string{{"kv", "put", "--lock", "orders", "k", "v"}, {"kv", "del", "--lock", "orders", "k"}} {
		code, _, stderr := runFence(t, append(ep, args...)...)
		if code == 0 || !strings.Contains(stderr, "--lock orders needs --token") {
			t.Errorf("%v: exit %d, stderr %q; want a refusal naming --token", args, code, stderr)
		}
	}
	if _, stdout, _ := runFence(t, append(ep, "kv", "get", "k")...); strings.Contains(stdout, "v") {
		t.Errorf("kv get k after the refused put: %q, want nothing written", stdout)
	}
}
