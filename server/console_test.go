package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

// startConsoleServer runs a real node with the console on, and a Go client
// of it.
func startConsoleServer(t *testing.T) (*Server, *client.Client) {
	t.Helper()
	s := startTestServer(t, func(c *Config) { c.UI = true })
	cl, err := client.New(client.WithEndpoints(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return s, cl
}

func mustSession(t *testing.T, cl *client.Client, owner string) *client.Session {
	t.Helper()
	sess := mustNewSession(t, cl, client.WithTTL(30*time.Second), client.WithOwner(owner))
	t.Cleanup(func() { sess.Close(context.Background()) })
	return sess
}

// consoleStream reads the views a node pushes on /ui/events.
type consoleStream struct {
	t     *testing.T
	views chan consoleView // closed when the stream ends
	// end is the data of the "end" event the node closed the stream
	// with, if any; read it once views is closed.
	end string
}

func openConsoleStream(t *testing.T, hc *http.Client, url string) *consoleStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ui/events", nil)
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		cancel()
		t.Fatalf("/ui/events answered %s with Content-Type %q", resp.Status, ct)
	}
	cs := &consoleStream{t: t, views: make(chan consoleView, 1)}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		defer close(cs.views)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 4<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "view":
				var v consoleView
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &v); err != nil {
					t.Errorf("a pushed view is not JSON: %v", err)
					return
				}
				select {
				case cs.views <- v:
				case <-ctx.Done():
					return
				}
			case strings.HasPrefix(line, "data: ") && event == "end":
				cs.end = strings.TrimPrefix(line, "data: ")
			case line == "":
				event = ""
			}
		}
	}()
	return cs
}

// await returns the first pushed view that satisfies cond.
func (cs *consoleStream) await(what string, cond func(v consoleView) bool) consoleView {
	cs.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case v, ok := <-cs.views:
			if !ok {
				cs.t.Fatalf("the event stream ended before %s", what)
			}
			if cond(v) {
				return v
			}
		case <-timeout:
			cs.t.Fatalf("no view pushed within 10s shows %s", what)
		}
	}
}

func findLock(v consoleView, name string) (consoleLock, bool) {
	for _, l := range v.Locks {
		if l.Name == name {
			return l, true
		}
	}
	return consoleLock{}, false
}

// The pushed view shows a lock with its holder (session, owner, token) and
// its waiter, and a hand-off is pushed as it happens: the waiter becomes
// the holder with the next token, and both grants are among the events.
func TestConsolePushesLocksHoldersTokensAndWaiters(t *testing.T) {
	s, cl := startConsoleServer(t)
	ctx := context.Background()
	holder := mustSession(t, cl, "billing-worker")
	waiter := mustSession(t, cl, "report-job")
	stream := openConsoleStream(t, http.DefaultClient, "http://"+s.Addr())

	held := client.NewMutex(holder, "orders")
	first := mustLock(t, held)
	second := make(chan *client.Grant, 1)
	go func() {
		g, err := client.NewMutex(waiter, "orders").Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		second <- g
	}()

	v := stream.await("orders held by the holder with the waiter queued", func(v consoleView) bool {
		l, ok := findLock(v, "orders")
		return ok && len(l.Holders) == 1 && len(l.Waiters) == 1
	})
	l, _ := findLock(v, "orders")
	if h := l.Holders[0]; h.Session != holder.ID() || h.Token != first.Token() || h.Owner != "billing-worker" || h.Mode != "exclusive" {
		t.Errorf("holder = %+v, want session %d (billing-worker) with token %d", h, holder.ID(), first.Token())
	}
	if w := l.Waiters[0]; w.Session != waiter.ID() || w.Owner != "report-job" || w.Token != 0 {
		t.Errorf("waiter = %+v, want session %d (report-job), no token", w, waiter.ID())
	}
	if v.LastToken != first.Token() || v.State != "Leader" || v.Node != s.cfg.NodeID || !v.TTLLeftKnown {
		t.Errorf("view: last token %d, state %s, node %s, TTL left known %v", v.LastToken, v.State, v.Node, v.TTLLeftKnown)
	}
	if len(v.Members) != 1 || !v.Members[0].Self || v.Members[0].API != s.Addr() {
		t.Errorf("members = %+v, want this node with its API address %s", v.Members, s.Addr())
	}
	for _, sess := range v.Sessions {
		if sess.TTLMs != 30000 || sess.LeftMs <= 0 || sess.LeftMs > 30000 {
			t.Errorf("session %+v: want a TTL of 30s and some of it left", sess)
		}
	}

	mustUnlock(t, held)
	next := <-second
	if next == nil {
		t.FailNow()
	}
	v = stream.await("the hand-off to the waiter", func(v consoleView) bool {
		l, ok := findLock(v, "orders")
		return ok && len(l.Holders) == 1 && l.Holders[0].Session == waiter.ID()
	})
	l, _ = findLock(v, "orders")
	if l.Holders[0].Token != next.Token() || len(l.Waiters) != 0 {
		t.Errorf("after the hand-off: %+v, want session %d holding token %d and no waiters", l, waiter.ID(), next.Token())
	}
	var grants []uint64
	for _, e := range v.Events {
		if e.Kind == "granted" && e.Lock == "orders" {
			grants = append(grants, e.Token)
		}
	}
	if len(grants) != 2 || grants[0] != next.Token() || grants[1] != first.Token() {
		t.Errorf("grant events of orders, newest first: %v, want [%d %d]", grants, next.Token(), first.Token())
	}
}

// A grant whose session the leader expires shows as "expired" among the
// events, with the lock and token: the console's events are the lock
// watch's.
func TestConsoleListsExpiries(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.UI = true })
	stream := openConsoleStream(t, http.DefaultClient, "http://"+s.Addr())
	a := newAPI(t, s)
	id := a.session(time.Second) // no keepalives: it expires
	token := a.mustAcquire(id, "orders")
	stream.await("the session's expiry", func(v consoleView) bool {
		for _, e := range v.Events {
			if e.Kind == "expired" && e.Session == id {
				if e.Lock != "orders" || e.Token != token || e.End != "expired" || e.Revision == 0 {
					t.Fatalf("the expiry is listed as %+v, want lock orders, token %d", e, token)
				}
				return true
			}
		}
		return false
	})
}

// Lock names and owners are user input: the JSON carries them as data,
// with <, > and & escaped, and the page's script puts text into the page
// with textContent and text nodes only, under a policy that runs no inline
// script.
func TestConsoleKeepsUserTextAsData(t *testing.T) {
	s, cl := startConsoleServer(t)
	const name = `<script>alert("lock")</script>`
	sess := mustSession(t, cl, `<img src=x onerror=alert(1)>`)
	mustLock(t, client.NewMutex(sess, name))
	resp, err := http.Get("http://" + s.Addr() + "/ui/state.json")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(string(body), "<>") {
		t.Errorf("state.json carries < or > unescaped:\n%s", body)
	}
	var v consoleView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	if l, ok := findLock(v, name); !ok || l.Holders[0].Owner != `<img src=x onerror=alert(1)>` {
		t.Errorf("state.json does not give the lock %q and its owner back as they were: %+v", name, v.Locks)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy = %q, want script-src 'self'", csp)
	}

	js, err := consoleFiles.ReadFile("console/console.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(string(js), sink) {
			t.Errorf("console.js uses %s: put text in with textContent", sink)
		}
	}
	if !strings.Contains(string(js), "textContent") || !strings.Contains(string(js), "createTextNode") {
		t.Error("console.js does not use textContent and createTextNode")
	}
	page, err := consoleFiles.ReadFile("console/index.html")
	if err != nil {
		t.Fatal(err)
	}
	if inline := regexp.MustCompile(`<script>|<script [^>]*>[^<]`).Find(page); inline != nil {
		t.Errorf("index.html has an inline script (%q); the policy would block it", inline)
	}
}

// The console is served only when asked for, and never without the API's
// client certificate.
func TestConsoleOnlyWhenAskedAndBehindTLS(t *testing.T) {
	off := startTestServer(t, nil)
	resp, err := http.Get("http://" + off.Addr() + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("without UI, /ui/ answered %s", resp.Status)
	}

	ca := testtls.NewCA(t, "fence test CA")
	s := startTestServer(t, func(c *Config) {
		c.UI = true
		c.TLS = nodeTLS(t, ca, "node")
	})
	get := func(cfg *tls.Config) (*http.Response, error) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		defer hc.CloseIdleConnections()
		return hc.Get("https://" + s.Addr() + "/ui/")
	}
	if _, err := get(&tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Error("the console was served to a browser without a client certificate")
	}
	resp, err = get(clientTLS(t, ca, "operator"))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "fence console") {
		t.Errorf("with a client certificate, /ui/ answered %s:\n%s", resp.Status, page)
	}
}

// The ring of recent events keeps the newest consoleEventsKept, newest first.
func TestConsoleEventRing(t *testing.T) {
	s := startTestServer(t, nil)
	c := newConsole(s)
	c.mu.Lock()
	for i := 1; i <= consoleEventsKept+7; i++ {
		c.addLocked(consoleEvent{Kind: "granted", Token: uint64(i)})
	}
	c.mu.Unlock()
	got := c.recent()
	if len(got) != consoleEventsKept || got[0].Token != consoleEventsKept+7 || got[len(got)-1].Token != 8 {
		t.Fatalf("kept %d events from token %d down to %d, want %d from %d to 8", len(got), got[0].Token, got[len(got)-1].Token, consoleEventsKept, consoleEventsKept+7)
	}
}
