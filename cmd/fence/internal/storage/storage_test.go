package storage_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/cmd/fence/internal/storage"
	"github.com/fencelock/fence/fencing"
)

// serve serves h and stops it at cleanup.
func serve(t *testing.T, h http.Handler) *storage.Server {
	t.Helper()
	srv, err := storage.Serve(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// get reads key over HTTP.
func get(t *testing.T, srv *storage.Server, key string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The bare store takes a late write with an old token: the lost update.
func TestBareStoreTakesEveryWrite(t *testing.T) {
	st := storage.New()
	var (
		mu   sync.Mutex
		puts []string
	)
	st.OnPut = func(_ *http.Request, key, value string) {
		mu.Lock()
		defer mu.Unlock()
		puts = append(puts, key+"="+value)
	}
	srv := serve(t, st)
	if code, _ := get(t, srv, "orders/17"); code != http.StatusNotFound {
		t.Errorf("GET of a missing key: %d, want 404", code)
	}
	for _, w := range []struct {
		value string
		token uint64
	}{{"B", 4}, {"A", 3}} {
		ctx := fencing.WithToken(context.Background(), "orders", w.token)
		if code, err := storage.Put(ctx, srv.URL+"/orders/17", w.value); err != nil || code != http.StatusNoContent {
			t.Fatalf("Put %s: %d, %v", w.value, code, err)
		}
	}
	if v, ok := st.Value("orders/17"); !ok || v != "A" {
		t.Errorf("Value %q, %v; want A", v, ok)
	}
	if code, body := get(t, srv, "orders/17"); code != http.StatusOK || body != "A" {
		t.Errorf("GET: %d %q, want 200 A", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(puts) != 2 || puts[1] != "orders/17=A" {
		t.Errorf("OnPut saw %v", puts)
	}
}

// Behind the fencing guard, the late write with the old token is refused.
func TestFencedStoreRejectsAStaleToken(t *testing.T) {
	st := storage.New()
	srv := serve(t, fencing.Middleware(fencing.NewGuard(fencing.NewMemory()))(st))
	ctx := fencing.WithToken(context.Background(), "orders", 4)
	if _, err := storage.Put(ctx, srv.URL+"/orders/17", "B"); err != nil {
		t.Fatal(err)
	}
	code, err := storage.Put(fencing.WithToken(context.Background(), "orders", 3), srv.URL+"/orders/17", "A")
	var stale *fence.StaleTokenError
	if code != http.StatusConflict || !errors.As(err, &stale) || stale.Token != 3 || stale.Highest != 4 {
		t.Fatalf("stale Put: %d, %v; want 409 and a StaleTokenError 3 < 4", code, err)
	}
	if v, _ := st.Value("orders/17"); v != "B" {
		t.Errorf("Value %q, want B to survive", v)
	}
}

func TestPutReportsOtherAnswers(t *testing.T) {
	srv := serve(t, storage.New())
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/k", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d, want 405", resp.StatusCode)
	}
	broken := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "disk full", http.StatusServiceUnavailable)
	}))
	code, err := storage.Put(context.Background(), broken.URL+"/k", "v")
	var se *storage.StatusError
	if code != http.StatusServiceUnavailable || !errors.As(err, &se) || err.Error() != "503 Service Unavailable: disk full" {
		t.Errorf("Put to a failing storage: %d, %v", code, err)
	}
}
