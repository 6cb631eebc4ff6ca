package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// camelCase is a key of the API's JSON: protojson's names of its fields.
var camelCase = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// uint64Keys are the JSON names of the API's 64-bit integer fields, which
// its JSON writes as strings, and those of the same kind that fence's own
// JSON adds (a snapshot file's counts).
func uint64Keys() map[string]bool {
	keys := map[string]bool{"holders": true, "waiters": true, "kvKeys": true, "kvTombstones": true, "kvRevision": true, "lastSessionId": true}
	msgs := fencev1.File_fence_v1_fence_proto.Messages()
	var walk func(protoreflect.MessageDescriptors)
	walk = func(msgs protoreflect.MessageDescriptors) {
		for i := range msgs.Len() {
			fields := msgs.Get(i).Fields()
			for j := range fields.Len() {
				switch fields.Get(j).Kind() {
				case protoreflect.Uint64Kind, protoreflect.Int64Kind, protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.Sint64Kind:
					keys[fields.Get(j).JSONName()] = true
				}
			}
			walk(msgs.Get(i).Messages())
		}
	}
	walk(msgs)
	return keys
}

// checkAPIJSON checks that v, decoded JSON, is in the API's style: every
// key camelCase, and no 64-bit integer (a token, an id, a revision, a
// count) written as a JSON number, unless measured (fence bench's own
// measurements). It returns the problems found.
func checkAPIJSON(v any, path string, wide map[string]bool, measured bool) []string {
	var problems []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !camelCase.MatchString(k) {
				problems = append(problems, fmt.Sprintf("%s.%s: the key is not camelCase", path, k))
			}
			if _, isNumber := e.(float64); isNumber && wide[k] && !measured {
				problems = append(problems, fmt.Sprintf("%s.%s = %v: a 64-bit integer as a number, not a string", path, k, e))
			}
			problems = append(problems, checkAPIJSON(e, path+"."+k, wide, measured)...)
		}
	case []any:
		for i, e := range v {
			problems = append(problems, checkAPIJSON(e, fmt.Sprintf("%s[%d]", path, i), wide, measured)...)
		}
	}
	return problems
}

// someString, as a wanted value, is any string but "".
type someString struct{}

// at reads the value at a path such as "kvs.0.key" in decoded JSON.
func at(v any, path string) any {
	for _, part := range strings.Split(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			v = c[part]
		case []any:
			var i int
			if _, err := fmt.Sscan(part, &i); err != nil || i >= len(c) {
				return nil
			}
			v = c[i]
		default:
			return nil
		}
	}
	return v
}

// runFirstLine runs a command that prints until interrupted, and returns
// its exit code and the first line it printed, once it has.
func runFirstLine(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- Run(ctx, args, strings.NewReader(""), &stdout, &stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stdout.String(), "\n") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	code := <-done
	line, _, _ := strings.Cut(stdout.String(), "\n")
	return code, line, stderr.String()
}

// Every command that prints data prints, with --json, the API's JSON:
// protojson's camelCase names, 64-bit integers (tokens, ids, revisions,
// counts) as strings. Each runs against a real node holding a session, a
// lock, an election (whose value is the store's first key), a key, a
// user, a role, a token and a snapshot.
func TestEveryJSONIsTheAPIs(t *testing.T) {
	node := fencetest.Start(t)
	ep := []string{"--endpoints", node.Endpoint()}
	ctx := context.Background()
	s := mustSession(t, node.Client(), client.WithOwner("table job"))
	lead, err := client.NewElection(s, "sched").Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	orders := mustLock(t, s, "orders")
	dir := t.TempDir()
	snapshot, tokenFile := filepath.Join(dir, "backup.fsnap"), filepath.Join(dir, "app.token")
	for _, args := range [][]string{
		{"kv", "put", "--lock", "orders", "--token", fmt.Sprint(orders.Token()), "app/k", "v"},
		{"user", "add", "app"}, {"role", "add", "orders"}, {"role", "grant", "orders", "kv", "write", "app/"},
		{"user", "grant-role", "app", "orders"}, {"token", "create", "app", "--out", tokenFile},
		{"snapshot", "save", snapshot},
	} {
		if code, _, stderr := runFence(t, append(ep, args...)...); code != 0 {
			t.Fatalf("fence %q: %s", args, stderr)
		}
	}
	token, sid := jsonUint(orders.Token()), jsonUint(s.ID())
	wide := uint64Keys()
	var lease map[string]any // fence lease acquire's, for renew and release
	leaseEnv := func() map[string]string {
		return map[string]string{"FENCE_LOCK": "leased", "FENCE_LEASE": fmt.Sprint(lease["leaseId"]), "FENCE_LEASE_SECRET": fmt.Sprint(lease["leaseSecret"])}
	}

	for _, tc := range []struct {
		args     []string
		code     int
		stream   bool // prints one JSON object a line until interrupted
		measured bool // fence bench: its own numbers, not the API's
		env      func() map[string]string
		keep     *map[string]any // where to keep what it printed
		want     map[string]any  // values at paths
	}{
		{args: []string{"leader", "--json", "sched"},
			want: map[string]any{"name": "sched", "elected": true, "value": "node-a", "token": jsonUint(lead.Token())}},
		{args: []string{"leader", "--json", "nobody"}, code: exitFailure, want: map[string]any{"elected": false, "token": "0"}},
		{args: []string{"leader", "--json", "--watch", "sched"}, stream: true, want: map[string]any{"value": "node-a", "token": jsonUint(lead.Token())}},
		{args: []string{"kv", "put", "--json", "app/other", "w"}, want: map[string]any{"revision": "3"}},
		{args: []string{"kv", "get", "--json", "app/k"},
			want: map[string]any{"key": "app/k", "value": "dg==", "token": token, "lock": "orders", "modRevision": "2", "version": "1", "sessionId": "0"}},
		{args: []string{"kv", "list", "--json", "app/"}, want: map[string]any{"kvs.0.key": "app/k", "kvs.0.token": token, "more": false, "revision": "3"}},
		{args: []string{"kv", "watch", "--json", "--from-revision", "1", "app/"}, stream: true,
			want: map[string]any{"type": "EVENT_TYPE_PUT", "kv.key": "app/k", "kv.token": token, "kv.modRevision": "2"}},
		{args: []string{"locks", "--json"},
			want: map[string]any{"locks.0.name": "election/sched", "locks.1.name": "orders", "locks.1.holders.0.token": token, "locks.1.holders.0.sessionId": sid,
				"locks.1.holders.0.owner": "table job", "nextPageToken": ""}},
		{args: []string{"locks", "--json", "--limit", "1"}, want: map[string]any{"locks.0.name": "election/sched", "nextPageToken": someString{}}},
		{args: []string{"status", "--json"}, want: map[string]any{"lastToken": token, "sessions": "1", "locks": "2", "nodes.0.status.lastToken": token}},
		{args: []string{"members", "list", "--json"}, want: map[string]any{"members.0.voter": true}},
		{args: []string{"sessions", "list", "--json"}, want: map[string]any{"sessions.0.sessionId": sid, "sessions.0.held.1.token": token, "sessions.0.ttl": "10s"}},
		{args: []string{"user", "list", "--json"}, want: map[string]any{"users.0.name": "app", "users.0.roles.0": "orders", "users.0.maxLocks": "0"}},
		{args: []string{"role", "list", "--json"}, want: map[string]any{"roles.0.name": "orders", "roles.0.permissions.0.prefix": "app/"}},
		{args: []string{"token", "list", "--json"}, want: map[string]any{"tokens.0.id": "1", "tokens.0.user": "app"}},
		{args: []string{"auth", "status", "--json"}, want: map[string]any{"enabled": false}},
		{args: []string{"snapshot", "inspect", "--json", snapshot},
			want: map[string]any{"format": float64(1), "header.lastToken": token, "header.nodeId": "fence1", "counts.sessions": "1", "counts.locks": "2",
				"counts.lastSessionId": sid, "counts.kvKeys": "2"}},
		{args: []string{"version", "--json"}},
		// Last: these change the state the others read.
		{args: []string{"lease", "acquire", "leased", "--ttl", "1m", "--json"}, keep: &lease,
			want: map[string]any{"lock": "leased", "token": someString{}, "leaseId": someString{}, "leaseSecret": someString{}, "ttl": "60s"}},
		{args: []string{"lease", "renew", "leased", "--json"}, env: leaseEnv, want: map[string]any{"lock": "leased", "ttl": "60s"}},
		{args: []string{"lease", "release", "leased", "--json"}, env: leaseEnv, want: map[string]any{"released": true}},
		{args: []string{"bench", "--json", "--duration", "100ms", "--clients", "1", "--workload", "own"}, measured: true,
			want: map[string]any{"results.0.workload": "own", "results.0.clients": float64(1)}},
		{args: []string{"elect", "--json", "nightly", "node-b"}, stream: true,
			want: map[string]any{"name": "nightly", "elected": true, "value": "node-b", "token": someString{}}},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			args := append(append([]string{}, ep...), tc.args...)
			if tc.env != nil {
				for k, v := range tc.env() {
					t.Setenv(k, v)
				}
			}
			var code int
			var stdout, stderr string
			if tc.stream {
				code, stdout, stderr = runFirstLine(t, args...)
			} else {
				code, stdout, stderr = runFence(t, args...)
			}
			if code != tc.code {
				t.Fatalf("fence %q: exit %d, want %d; stderr %s", tc.args, code, tc.code, stderr)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("fence %q printed no JSON object: %v\n%s", tc.args, err, stdout)
			}
			if tc.keep != nil {
				*tc.keep = got
			}
			for _, p := range checkAPIJSON(got, "", wide, tc.measured) {
				t.Errorf("fence %q: %s", tc.args, p)
			}
			for path, want := range tc.want {
				v := at(got, path)
				if s, ok := v.(string); ok && s != "" && want == (someString{}) {
					continue
				}
				if v != want {
					t.Errorf("fence %q: %s = %#v, want %#v\n%s", tc.args, path, v, want, stdout)
				}
			}
		})
	}
}
