package clients_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence/fencing"
)

// A Python worker and a Node worker share one lock and one fenced resource
// (clients/python/examples/worker.py, clients/typescript/examples/
// worker.ts): each appends to a ledger under the lock "ledger", with its
// token, through Go's fencing middleware. The service hands out one
// sequence of tokens whatever the language, so the ledger admits every
// write, in token order, and refuses none.
func TestPythonAndNodeWorkersShareALock(t *testing.T) {
	python, pyDir := pythonClient(t)
	node, tsDir := buildTypeScript(t)
	g := mustGroup(t, newControl(t), groupSpec{Nodes: 1})
	ledger, url := newLedger(t)

	const count = 15
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	workers := []*exec.Cmd{
		exec.CommandContext(ctx, python, "-S", filepath.Join(pyDir, "examples", "worker.py"), g.nodes[0].api, url, "python", fmt.Sprint(count)),
		exec.CommandContext(ctx, node, filepath.Join("build", "examples", "worker.js"), g.nodes[0].api, url, "node", fmt.Sprint(count)),
	}
	workers[0].Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(pyDir, "src"))
	workers[1].Dir = tsDir
	outs := make([]bytes.Buffer, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		w.Stdout, w.Stderr = &outs[i], &outs[i]
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := w.Wait(); err != nil {
				t.Errorf("%s: %v\n%s", w.Args[1], err, outs[i].String())
			}
		})
	}
	wg.Wait()

	entries := ledger.all()
	if len(entries) != 2*count {
		t.Fatalf("the ledger has %d entries, want %d: %v", len(entries), 2*count, entries)
	}
	seen := map[string]int{}
	for i, e := range entries {
		seen[strings.Fields(e.body)[0]]++
		if i > 0 && e.token <= entries[i-1].token {
			t.Errorf("entry %d (%q) has token %d, after %d", i, e.body, e.token, entries[i-1].token)
		}
	}
	if seen["python"] != count || seen["node"] != count {
		t.Errorf("the ledger has %v entries by worker, want %d each", seen, count)
	}
	if ledger.refused() != 0 {
		t.Errorf("the ledger refused %d writes", ledger.refused())
	}
}

// ledger is a fenced resource (the workers' here, paused-holder's in
// go_test.go): an HTTP handler behind fencing.Middleware that appends each
// admitted write, with its token, and counts the writes it refused as
// stale.
type ledger struct {
	mu      sync.Mutex
	entries []ledgerEntry
	stale   int
}

type ledgerEntry struct {
	body  string
	token uint64
}

func newLedger(t *testing.T) (*ledger, string) {
	l := &ledger{}
	admit := fencing.Middleware(fencing.NewGuard(fencing.NewMemory()))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, token, _ := fencing.TokenFrom(r.Context())
		l.mu.Lock()
		l.entries = append(l.entries, ledgerEntry{string(body), token})
		l.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		admit.ServeHTTP(rec, r)
		if rec.Code == http.StatusConflict {
			l.mu.Lock()
			l.stale++
			l.mu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	return l, srv.URL + "/ledger"
}

func (l *ledger) all() []ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ledgerEntry(nil), l.entries...)
}

func (l *ledger) refused() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stale
}
