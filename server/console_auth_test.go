package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
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
	rc, root := mustRootClient(t, s)
	reader := addUser(t, rc, "reader", perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, ""))
	partial := addUser(t, rc, "partial", perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, "orders/"))
	kvOnly := addUser(t, rc, "kvonly", perm(fencev1.PermissionKind_PERMISSION_KIND_KV, fencev1.Access_ACCESS_WRITE, ""))
	mustAuthEnable(t, rc)
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

// An open event stream is checked again before every push: once its
// token is revoked, its user removed or its permission taken, no view
// reaches it any more (views after the change would show the lock taken
// after it), and it ends with an "end" event saying why.
func TestConsoleEventsEndWhenAuthChanges(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.UI = true })
	ctx := context.Background()
	rc, _ := mustRootClient(t, s)
	mustAuthEnable(t, rc)
	holder := mustNewSession(t, rc, client.WithTTL(30*time.Second))
	t.Cleanup(func() { holder.Close(context.Background()) })
	mustLock(t, client.NewMutex(holder, "secret/a"))
	readAll := perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, "")
	for _, tc := range []struct {
		name   string
		change func(user string) error
		want   string // in the end event
	}{
		{"token revoked", func(user string) error {
			tokens, err := rc.Tokens(ctx, user)
			if err != nil {
				return err
			}
			return rc.TokenRevoke(ctx, tokens[0].GetId())
		}, "unknown or revoked"},
		{"user removed", func(user string) error { return rc.UserRemove(ctx, user) }, "unknown or revoked"},
		{"permission reduced", func(user string) error {
			if err := rc.RoleGrant(ctx, user, perm(fencev1.PermissionKind_PERMISSION_KIND_LOCK, fencev1.Access_ACCESS_READ, "public/")); err != nil {
				return err
			}
			return rc.RoleRevoke(ctx, user, readAll)
		}, "permission"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := "viewer-" + strings.ReplaceAll(tc.name, " ", "-")
			token := addUser(t, rc, user, readAll)
			hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + token}}
			stream := openConsoleStream(t, hc, "http://"+s.Addr())
			stream.await("secret/a held", func(v consoleView) bool {
				l, ok := findLock(v, "secret/a")
				return ok && len(l.Holders) == 1 && l.Holders[0].Token != 0
			})
			if err := tc.change(user); err != nil {
				t.Fatal(err)
			}
			// A lock taken after the change: a view showing it was made
			// after the change.
			marker := "marker/" + user
			mustLock(t, client.NewMutex(holder, marker))
			// A bound for a stream that never ends, so that the test
			// fails rather than hangs.
			bound := time.After(20 * time.Second)
			for ended := false; !ended; {
				select {
				case v, ok := <-stream.views:
					if !ok {
						ended = true
						break
					}
					if _, after := findLock(v, marker); after {
						l, _ := findLock(v, "secret/a")
						t.Fatalf("after %s, the stream still pushed a view with secret/a held (%+v)", tc.name, l.Holders)
					}
				case <-bound:
					t.Fatalf("after %s, the stream neither ended nor pushed a view", tc.name)
				}
			}
			if !strings.Contains(stream.end, tc.want) {
				t.Fatalf("after %s, the stream ended with %q, want an end event saying %q", tc.name, stream.end, tc.want)
			}
			if code, body := consoleGet(t, s, "/ui/state.json", token); code == http.StatusOK {
				t.Fatalf("after %s, state.json answered 200 %q", tc.name, body)
			}
		})
	}
}
