package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/fencing"
)

// storage is a resource guarded by the middleware: the last value per path.
type storage struct {
	mu     sync.Mutex
	values map[string]string
}

func (s *storage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		fmt.Fprint(w, s.values[r.URL.Path])
	case http.MethodPut:
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "refused by the handler", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		s.values[r.URL.Path] = string(body)
		w.WriteHeader(http.StatusNoContent)
	}
}

func newStorage(t *testing.T, g *fencing.Guard) (*httptest.Server, *storage) {
	st := &storage{values: map[string]string{}}
	srv := httptest.NewServer(fencing.Middleware(g)(st))
	t.Cleanup(srv.Close)
	return srv, st
}

// put writes through a client whose Transport stamps the context's token.
func put(t *testing.T, url, body string, ctx context.Context, header ...string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	hc := &http.Client{Transport: &fencing.Transport{}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, fencing.ResponseError(resp)
}

func TestMiddlewareRejectsStaleWrites(t *testing.T) {
	srv, st := newStorage(t, fencing.NewGuard(fencing.NewMemory()))
	ctx := context.Background()
	if resp, err := put(t, srv.URL+"/orders/17", "b", fencing.WithToken(ctx, "orders", 34)); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("write with 34: %v %v", resp.Status, err)
	}
	resp, err := put(t, srv.URL+"/orders/17", "a", fencing.WithToken(ctx, "orders", 33))
	var stale *fence.StaleTokenError
	if resp.StatusCode != http.StatusConflict || !errors.As(err, &stale) || stale.Token != 33 || stale.Highest != 34 {
		t.Fatalf("stale write: %s, %v; want 409 and a StaleTokenError 33 < 34", resp.Status, err)
	}
	if got := st.values["/orders/17"]; got != "b" {
		t.Fatalf("stored %q after the stale write, want b", got)
	}
	if resp, err := put(t, srv.URL+"/orders/17", "b2", fencing.WithToken(ctx, "orders", 34)); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("second write with the same token: %s %v", resp.Status, err)
	}
}

// Missing and malformed tokens get 400 with a JSON error, and nothing is
// written; reads pass without a token.
func TestMiddlewareBadTokens(t *testing.T) {
	srv, st := newStorage(t, fencing.NewGuard(fencing.NewMemory()))
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		header []string
		want   string
	}{
		{"missing", nil, "header is missing"},
		{"not a number", []string{fencing.HeaderToken, "abc"}, `"abc" is not a fencing token`},
		{"negative", []string{fencing.HeaderToken, "-3"}, "is not a fencing token"},
		{"zero", []string{fencing.HeaderToken, "0"}, "is not a fencing token"},
		{"overflow", []string{fencing.HeaderToken, "18446744073709551616"}, "is not a fencing token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := put(t, srv.URL+"/k", "x", ctx, tc.header...)
			if resp.StatusCode != http.StatusBadRequest || !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %s, %v; want 400 mentioning %q", resp.Status, err, tc.want)
			}
		})
	}
	if len(st.values) != 0 {
		t.Fatalf("bad requests wrote %v", st.values)
	}
	resp, err := http.Get(srv.URL + "/k")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET without a token: %v %v", resp.Status, err)
	}
	resp.Body.Close()
}

// A handler that fails does not record its token: a lower token may still write.
func TestMiddlewareFailedHandlerKeepsHighest(t *testing.T) {
	mem := fencing.NewMemory()
	srv, _ := newStorage(t, fencing.NewGuard(mem))
	ctx := context.Background()
	put(t, srv.URL+"/k", "x", fencing.WithToken(ctx, "l", 5))
	resp, _ := put(t, srv.URL+"/k", "x", fencing.WithToken(ctx, "l", 9), "X-Fail", "1")
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("failing handler answered %s", resp.Status)
	}
	if h, _ := mem.Highest(ctx, "l"); h != 5 { // the key defaults to the lock name
		t.Fatalf("highest after a failed write = %d, want 5", h)
	}
}

// Strict mode asks the service whether the token is the lock's current
// grant: a released grant, an unknown lock and a missing lock name are all
// refused, even with a token no lower than the highest seen.
func TestStrictGuardAsksTheService(t *testing.T) {
	c := fencetest.Start(t).Client()
	ctx := context.Background()
	sess, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	m := client.NewMutex(sess, "orders")
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	srv, st := newStorage(t, fencing.NewGuard(fencing.NewMemory(), fencing.WithChecker(c, time.Nanosecond)))
	if _, err := put(t, srv.URL+"/orders/1", "v", fencing.WithToken(ctx, "orders", g.Token())); err != nil {
		t.Fatalf("strict write by the holder: %v", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // past the cache TTL
	for name, wctx := range map[string]context.Context{
		"released grant": fencing.WithToken(ctx, "orders", g.Token()),
		"unknown lock":   fencing.WithToken(ctx, "no-such-lock", g.Token()+1),
		"no lock name":   fencing.WithToken(ctx, "", g.Token()+1),
	} {
		resp, err := put(t, srv.URL+"/orders/1", "late", wctx)
		if err == nil || resp.StatusCode < 400 {
			t.Fatalf("%s: %s, %v; want a refusal", name, resp.Status, err)
		}
	}
	if got := st.values["/orders/1"]; got != "v" {
		t.Fatalf("stored %q, want the holder's value", got)
	}
}

// The 409 body reads as people and programs expect: "<" as it is, not
// escaped for a browser as \u003c.
func TestMiddlewareStaleBodyIsPlainJSON(t *testing.T) {
	srv, _ := newStorage(t, fencing.NewGuard(fencing.NewMemory()))
	ctx := context.Background()
	hc := &http.Client{Transport: &fencing.Transport{}}
	for _, token := range []uint64{34, 33} {
		req, err := http.NewRequestWithContext(fencing.WithToken(ctx, "orders", token), http.MethodPut, srv.URL+"/orders/17", strings.NewReader("v"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if token == 33 && (resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), `"stale fencing token 33 < 34 for key orders"`)) {
			t.Fatalf("stale write: %s %s", resp.Status, body)
		}
	}
}
