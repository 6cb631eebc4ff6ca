package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// consoleGet fetches path from s with token (none if empty) and returns
// the status and the start of the body.
func consoleGet(t *testing.T, s *Server, path, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr()+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, _ := io.ReadAtLeast(resp.Body, buf, 1)
	return resp.StatusCode, string(buf[:n])
}

// With auth on, the console (page, state and events) answers only a
// caller who may read every lock: 401 without a valid credential, 403
// without the permission. With auth off it is open, as before.
func TestConsoleAuth(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.UI = true })
	paths := []string{"/ui/", "/ui/state.json", "/ui/events"}
	for _, p := range paths {
		if code, body := consoleGet(t, s, p, ""); code != http.StatusOK {
			t.Fatalf("auth off: GET %s = %d %q, want 200", p, code, body)
		}
	}
	ctx := context.Background()
	root := setupRoot(t, mustClient(t, s, ""))
	rc := mustClient(t, s, root)
	reader := addUser(t, rc, "reader", perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, ""))
	partial := addUser(t, rc, "partial", perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, "orders/"))
	kvOnly := addUser(t, rc, "kvonly", perm(fencev1.PermissionKind_PERMISSION_KIND_KV, fencev1.Access_ACCESS_WRITE, ""))
	if err := rc.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		for _, tc := range []struct {
			who, token string
			want       int
		}{
			{"no token", "", http.StatusUnauthorized},
			{"unknown token", "not-a-token", http.StatusUnauthorized},
			{"lock read orders/", partial, http.StatusForbidden},
			{"kv write", kvOnly, http.StatusForbidden},
			{`lock read ""`, reader, http.StatusOK},
			{"root", root, http.StatusOK},
		} {
			code, body := consoleGet(t, s, p, tc.token)
			if code != tc.want {
				t.Errorf("auth on, %s: GET %s = %d %q, want %d", tc.who, p, code, body, tc.want)
			}
			if code != http.StatusOK && (body == "" || strings.Contains(body, "<")) {
				t.Errorf("auth on, %s: GET %s refused with body %q, want a short text", tc.who, p, body)
			}
		}
	}
	if err := rc.AuthDisable(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := consoleGet(t, s, "/ui/state.json", ""); code != http.StatusOK {
		t.Fatalf("auth off again: GET /ui/state.json = %d %q, want 200", code, body)
	}
}
