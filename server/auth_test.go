package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/syncbuf"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

func TestParseBearer(t *testing.T) {
	for _, tc := range []struct {
		header, token string
	}{
		{"Bearer abc", "abc"},
		{"bearer abc", "abc"},
		{"BEARER  abc-_.~+/=", "abc-_.~+/="},
		{"Basic abc", ""},
		{"Bearer", ""},
		{"Bearer ", ""},
		{"Bearer a b", ""},
		{"Bearer a\x00", ""},
		{"Bearer é", ""},
		{"Bearer " + strings.Repeat("a", maxBearerBytes+1), ""},
	} {
		got, err := parseBearer(tc.header)
		if got != tc.token || (err == nil) != (tc.token != "") {
			t.Errorf("parseBearer(%q) = %q, %v; want %q", tc.header, got, err, tc.token)
		}
		if err != nil && !errors.Is(err, fence.ErrAuthFailed) {
			t.Errorf("parseBearer(%q): %v is not ErrAuthFailed", tc.header, err)
		}
	}
}

// FuzzAuthHeader: no Authorization header panics the parser or the
// authentication behind it, and a token that parses is what followed the
// scheme.
func FuzzAuthHeader(f *testing.F) {
	for _, seed := range []string{"Bearer abc", "bearer  x", "Basic dXNlcg==", "", "Bearer \xff", "Bearer " + strings.Repeat("z", 600), " Bearer a"} {
		f.Add(seed)
	}
	s := newAuthState(f)
	f.Fuzz(func(t *testing.T, header string) {
		token, err := parseBearer(header)
		if err == nil && (token == "" || !strings.HasSuffix(header, token) || strings.ContainsAny(token, " \t\r\n")) {
			t.Fatalf("parseBearer(%q) = %q", header, token)
		}
		h := http.Header{}
		h.Set("Authorization", header)
		var ctx context.Context = context.Background()
		if _, err := s.checkCall(ctx, fencev1connect.KVServiceGetProcedure, "fuzz", h, &fencev1.GetRequest{Key: header}); err == nil {
			t.Fatalf("header %q was let in", header)
		}
	})
}

// newAuthState is a server with auth on, for tests of the check itself.
func newAuthState(tb testing.TB) *Server {
	s := startTestServer(tb, nil)
	root, _ := mustRootClient(tb, s)
	mustAuthEnable(tb, root)
	return s
}

func mustClient(tb testing.TB, s *Server, token string, opts ...client.Option) *client.Client {
	tb.Helper()
	opts = append([]client.Option{client.WithEndpoints(s.Addr()), client.WithBearerToken(token), client.WithRetryBudget(3 * time.Second)}, opts...)
	c, err := client.New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// setupRoot adds user root with role root and returns a token of theirs.
func setupRoot(tb testing.TB, c *client.Client) string {
	tb.Helper()
	ctx := context.Background()
	for _, err := range []error{c.UserAdd(ctx, "root"), c.UserGrantRole(ctx, "root", "root")} {
		if err != nil {
			tb.Fatal(err)
		}
	}
	token, _, err := c.TokenCreate(ctx, "root", 0, "")
	if err != nil {
		tb.Fatal(err)
	}
	return token
}

// addUser adds user with a role of its own holding perms, and returns a
// token of theirs.
func addUser(tb testing.TB, c *client.Client, user string, perms ...*client.Permission) string {
	tb.Helper()
	ctx := context.Background()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(c.UserAdd(ctx, user))
	must(c.RoleAdd(ctx, user))
	for _, p := range perms {
		must(c.RoleGrant(ctx, user, p))
	}
	must(c.UserGrantRole(ctx, user, user))
	token, _, err := c.TokenCreate(ctx, user, 0, "")
	must(err)
	return token
}

func perm(kind fencev1.PermissionKind, access fencev1.Access, prefix string) *client.Permission {
	return &client.Permission{Kind: kind, Access: access, Prefix: prefix}
}

// A real server with auth on: a read-only client can read but not
// acquire, release or close another's session, write or administer; an
// app confined to orders/ gets nothing outside it; refusals are audited,
// change nothing, and a revoked token is refused at its next call.
func TestAuthRealServer(t *testing.T) {
	var logs syncbuf.Buffer
	s := startTestServer(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := context.Background()
	open := mustClient(t, s, "")
	rootToken := setupRoot(t, open)
	appToken := addUser(t, open, "app", perm(client.PermLock, client.Write, "orders/"), perm(client.PermKV, client.Write, "orders/"))
	readerToken := addUser(t, open, "reader", perm(client.PermLock, client.Read, ""), perm(client.PermKV, client.Read, ""))

	// Enabling needs the caller to stay an admin.
	for _, c := range []*client.Client{open, mustClient(t, s, readerToken)} {
		if err := c.AuthEnable(ctx); err == nil {
			t.Fatal("auth enabled by a caller who would be locked out")
		}
	}
	if s.AuthEnabled() {
		t.Fatal("a refused enable enabled auth")
	}
	root := mustClient(t, s, rootToken)
	mustAuthEnable(t, root)

	if _, err := open.Status(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("status without a credential: %v", err)
	}
	if _, err := mustClient(t, s, "no-such-token").Status(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("status with an unknown token: %v", err)
	}

	app := mustClient(t, s, appToken)
	sess := mustNewSession(t, app)
	defer sess.Close(ctx)
	g := mustLock(t, client.NewMutex(sess, "orders/1"))
	if _, err := app.KV().Put(ctx, "orders/1", []byte("paid")); err != nil {
		t.Fatal(err)
	}
	denied := func(what string, err error, needs string) {
		t.Helper()
		if !errors.Is(err, fence.ErrPermissionDenied) || !strings.Contains(err.Error(), needs) {
			t.Errorf("%s: %v, want PermissionDenied naming %q", what, err, needs)
		}
	}
	_, err := client.NewMutex(sess, "jobs/1").TryLock(ctx)
	denied("app acquires jobs/1", err, `lock write on prefix "jobs/1"`)
	_, err = app.KV().Put(ctx, "jobs/1", []byte("x"))
	denied("app puts jobs/1", err, `kv write on prefix "jobs/1"`)
	_, err = app.Locks(ctx, "")
	denied("app lists every lock", err, `lock read on prefix ""`)

	reader := mustClient(t, s, readerToken)
	if st, err := reader.Check(ctx, "orders/1", g.Token()); err != nil || !st.Current {
		t.Fatalf("reader checks: %+v %v", st, err)
	}
	if kv, err := reader.KV().Get(ctx, "orders/1"); err != nil || string(kv.GetValue()) != "paid" {
		t.Fatalf("reader gets: %v %v", kv, err)
	}
	_, err = reader.NewSession(ctx)
	denied("reader creates a session", err, "lock write or kv write")
	_, err = reader.KV().Put(ctx, "orders/1", []byte("stolen"))
	denied("reader puts", err, `kv write on prefix "orders/1"`)
	_, err = reader.KV().Delete(ctx, "orders/1")
	denied("reader deletes", err, `kv write on prefix "orders/1"`)

	// The raw API, with the app session's id and even its secret: refused
	// before the secret is looked at.
	raw := func(token string) (fencev1connect.SessionServiceClient, fencev1connect.LockServiceClient) {
		hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + token}}
		return fencev1connect.NewSessionServiceClient(hc, "http://"+s.Addr()), fencev1connect.NewLockServiceClient(hc, "http://"+s.Addr())
	}
	rs, rl := raw(readerToken)
	_, err = rl.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{SessionId: sess.ID(), Lock: "orders/1", Token: g.Token()}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("reader releases the app's lock: %v", err)
	}
	_, err = rs.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: sess.ID()}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("reader closes the app's session: %v", err)
	}
	for name, call := range map[string]func() error{
		"AddMember":     func() error { return reader.AddMember(ctx, "evil", "127.0.0.1:1", true) },
		"RevokeSession": func() error { return reader.RevokeSession(ctx, sess.ID()) },
		"Snapshot":      func() error { _, err := reader.Snapshot(ctx); return err },
		"UserAdd":       func() error { return reader.UserAdd(ctx, "evil") },
		"AuthDisable":   func() error { return app.AuthDisable(ctx) },
	} {
		denied(name, call(), "admin")
	}
	if st, err := root.Check(ctx, "orders/1", g.Token()); err != nil || !st.Current {
		t.Fatalf("after the refusals the app's grant is %+v, %v", st, err)
	}
	if kv, err := root.KV().Get(ctx, "orders/1"); err != nil || string(kv.GetValue()) != "paid" {
		t.Fatalf("after the refusals orders/1 is %v, %v", kv, err)
	}
	if users, err := root.Users(ctx); err != nil || len(users) != 3 {
		t.Fatalf("users %v, %v", users, err)
	}
	if !strings.Contains(logs.String(), "auth: call refused") || !strings.Contains(logs.String(), "procedure=/fence.v1.KVService/Put") ||
		!strings.Contains(logs.String(), "user=reader") {
		t.Errorf("no audit line of the refused put in the log:\n%s", logs.String())
	}

	// Revocation is effective on the next call.
	tokens, err := root.Tokens(ctx, "reader")
	if err != nil || len(tokens) != 1 {
		t.Fatalf("reader's tokens %v, %v", tokens, err)
	}
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Check(ctx, "orders/1", g.Token()); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("a revoked token: %v", err)
	}
	if !strings.Contains(logs.String(), "auth: changed") || !strings.Contains(logs.String(), "change=\"token revoked\"") {
		t.Errorf("no audit line of the revocation in the log")
	}
}

type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A watch whose token is revoked ends with Unauthenticated; one whose
// permission is revoked with PermissionDenied.
func TestAuthWatchEndsOnRevoke(t *testing.T) {
	s := startTestServer(t, nil)
	// A bound for a watch that does not end, so that the test fails
	// rather than hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	root, _, readerToken := enableAuthWithUser(t, s, "reader", perm(client.PermKV, client.Read, "a/"))
	watch := func(token string) *connect.ServerStreamForClient[fencev1.WatchResponse] {
		hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + token}}
		return mustOpenWatch(t, ctx, fencev1connect.NewKVServiceClient(hc, "http://"+s.Addr()), "a/", "watch did not start")
	}
	stream := watch(readerToken)
	if _, err := root.KV().Put(ctx, "a/1", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || len(stream.Msg().GetEvents()) != 1 {
		t.Fatalf("no event: %v", stream.Err())
	}
	tokens, _ := root.Tokens(ctx, "reader")
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnauthenticated {
		t.Fatalf("the revoked token's watch ended with %v", stream.Err())
	}

	token, _, err := root.TokenCreate(ctx, "reader", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	stream = watch(token)
	if err := root.RoleRevoke(ctx, "reader", perm(client.PermKV, client.Read, "a/")); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodePermissionDenied {
		t.Fatalf("the watch whose permission was revoked ended with %v", stream.Err())
	}
}

// With --client-cert-auth the certificate's common name is the user.
func TestAuthClientCertificate(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	s := startTestServer(t, func(c *Config) { c.TLS = nodeTLS(t, ca, "node") })
	ctx := context.Background()
	as := func(cn string) *client.Client {
		return mustClient(t, s, "", client.WithTLS(clientTLS(t, ca, cn)))
	}
	root := as("root")
	setupRoot(t, root)
	addUser(t, root, "app", perm(client.PermKV, client.Write, "app/"))
	mustAuthEnable(t, root)
	app := as("app")
	if _, err := app.KV().Put(ctx, "app/x", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := app.KV().Put(ctx, "other", nil); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Fatalf("app puts outside app/: %v", err)
	}
	if _, err := as("stranger").Status(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("a certificate naming no user: %v", err)
	}
	st, err := app.AuthStatus(ctx)
	if err != nil || st.GetUser() != "app" || st.GetIdentifiedBy() != "certificate" || !st.GetEnabled() {
		t.Fatalf("app's auth status %v, %v", st, err)
	}
}
