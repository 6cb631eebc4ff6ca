package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/fencelock/fence/server"
)

// losingTransport delivers every request, but loses the first answer to
// each of the chosen procedures once the server has applied it, as a
// connection that drops after the request went out does.
type losingTransport struct {
	next  http.RoundTripper
	paths []string

	mu   sync.Mutex
	lost map[string]bool
}

var errAnswerLost = errors.New("connection reset by peer (the test lost the answer)")

func (t *losingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	lose := false
	for _, p := range t.paths {
		if strings.HasSuffix(req.URL.Path, p) && !t.lost[p] {
			t.lost[p], lose = true, true
		}
	}
	t.mu.Unlock()
	if !lose {
		return resp, nil
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errAnswerLost
}

func losingClient(t *testing.T, srv *server.Server, paths ...string) *Client {
	t.Helper()
	tr := &losingTransport{next: &http.Transport{}, paths: paths, lost: map[string]bool{}}
	return mustNew(t, WithEndpoints(srv.Addr()), WithHTTPClient(&http.Client{Transport: inMemoryBodies{tr}}))
}

// A write whose answer is lost after it applied is retried, and the retry
// must not apply it again (docs/design.md, Writes and retries): a
// plain put bumped the revision twice, a put conditional on the revision
// was reported as a mismatch although it applied. CreateSession is the
// exception: its answer carries the session's secret, which the service
// answers once, so a retry makes a session of its own, and the one whose
// answer was lost holds nothing and expires.
func TestRetriedWritesApplyOnce(t *testing.T) {
	srv := startServer(t, nil)
	ctx := context.Background()
	watcher := mustClient(t, srv, nil)

	c := losingClient(t, srv, "/Put")
	rev, err := c.KV().Put(ctx, "k", []byte("v1"))
	if err != nil {
		t.Fatalf("a put whose first answer was lost: %v", err)
	}
	kv, err := watcher.KV().Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if kv.GetVersion() != 1 || kv.GetModRevision() != rev {
		t.Fatalf("after one put: version %d, mod revision %d; the put answered revision %d", kv.GetVersion(), kv.GetModRevision(), rev)
	}

	c = losingClient(t, srv, "/Put")
	if _, err := c.KV().Put(ctx, "k", []byte("v2"), IfRevision(rev)); err != nil {
		t.Fatalf("a conditional put whose first answer was lost: %v", err)
	}

	c = losingClient(t, srv, "/Delete")
	deleted, err := c.KV().Delete(ctx, "k")
	if err != nil || !deleted {
		t.Fatalf("a delete whose first answer was lost: deleted %v, %v", deleted, err)
	}

	before, err := watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c = losingClient(t, srv, "/CreateSession")
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("a session whose first answer was lost: %v", err)
	}
	defer s.Close(ctx)
	after, err := watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.GetSessions() != before.GetSessions()+2 {
		t.Fatalf("one NewSession whose first answer was lost made %d sessions, want 2", after.GetSessions()-before.GetSessions())
	}
	if _, err := NewMutex(s, "after-retry").Lock(ctx); err != nil {
		t.Fatalf("the retried session: %v", err)
	}
}
