package client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
)

// One campaigner leads; the other waits and leads once the first resigns,
// with a higher token; a deposed leader cannot overwrite the record.
func TestElection(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	newSession := func() *Session { return mustSession(t, c, 10*time.Second) }
	if st, err := c.Leader(ctx, "scheduler"); st.Elected || err != nil {
		t.Fatalf("leader before any campaign: %+v, %v", st, err)
	}
	a, b := NewElection(newSession(), "scheduler"), NewElection(newSession(), "scheduler")
	la, err := a.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Leader(ctx, "scheduler"); !st.Elected || err != nil || st.Value != "node-a" || st.Token != la.Token() {
		t.Fatalf("Leader = %+v, %v; want node-a with token %d", st, err, la.Token())
	}
	won := inBackground(t, func() (*Leadership, error) { return b.Campaign(ctx, "node-b") })
	select {
	case <-won:
		t.Fatal("two leaders at once")
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.Proclaim(ctx, "node-a v2"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var lb *Leadership
	select {
	case lb = <-won:
	case <-time.After(10 * time.Second):
		t.Fatal("the second campaigner was not elected after the first resigned")
	}
	if lb == nil || lb.Token() <= la.Token() {
		t.Fatalf("second leadership %v, want a token above %d", lb, la.Token())
	}
	if st, _ := c.Leader(ctx, "scheduler"); !st.Elected || st.Value != "node-b" {
		t.Fatalf("Leader = %+v, want node-b", st)
	}
	// The deposed leader's token no longer writes the record.
	if _, err := c.KV().Put(ctx, "election/scheduler", []byte("node-a again"), WithGrant(la.Grant), Strict()); !errors.Is(err, fence.ErrNotHolder) && !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("deposed leader's write: %v, want it refused", err)
	}
}

// ObserveLeader reports the state at once, then every change: a new
// leader, a Proclaim, and the end of a leader's session (its record goes
// with it), followed by the next leader.
func TestObserveLeader(t *testing.T) {
	c := clientOfNewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	newSession := func() *Session { return mustSession(t, c, 10*time.Second) }
	states, err := c.ObserveLeader(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	next := func(want LeaderState) {
		t.Helper()
		select {
		case got, ok := <-states:
			if !ok || got != want {
				t.Fatalf("observed %+v (open %v), want %+v", got, ok, want)
			}
		case <-ctx.Done():
			t.Fatalf("nothing observed; want %+v", want)
		}
	}
	next(LeaderState{})
	// A write to the election's key that no leader made (unfenced, or
	// fenced by another lock) elects nobody, as Leader says too.
	mustPut(t, ctx, c.KV(), "election/jobs", []byte("impostor"))
	other := mustLock(t, ctx, NewMutex(newSession(), "other"))
	mustPut(t, ctx, c.KV(), "election/jobs", []byte("impostor 2"), WithGrant(other))
	if st, err := c.Leader(ctx, "jobs"); err != nil || st.Elected {
		t.Fatalf("Leader after writes no leader made: %+v, %v", st, err)
	}
	// Another election whose name starts with this one is not reported.
	if _, err := NewElection(newSession(), "jobs-2").Campaign(ctx, "elsewhere"); err != nil {
		t.Fatal(err)
	}
	sa := newSession()
	ea := NewElection(sa, "jobs")
	la, err := ea.Campaign(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	next(LeaderState{Elected: true, Value: "node-a", Token: la.Token()})
	if err := ea.Proclaim(ctx, "node-a v2"); err != nil {
		t.Fatal(err)
	}
	next(LeaderState{Elected: true, Value: "node-a v2", Token: la.Token()})
	won := inBackground(t, func() (*Leadership, error) { return NewElection(newSession(), "jobs").Campaign(ctx, "node-b") })
	waitForLock(t, c, "election/jobs", func(holders, waiters int) bool { return waiters == 1 })
	if err := sa.Close(ctx); err != nil {
		t.Fatal(err)
	}
	next(LeaderState{})
	lb := <-won
	if lb == nil {
		t.Fatal("the second campaigner was not elected")
	}
	next(LeaderState{Elected: true, Value: "node-b", Token: lb.Token()})
	cancel()
	for range states { // closed once ctx ends
	}
}

// hookTransport runs hook once, before the first request to path.
type hookTransport struct {
	next http.RoundTripper
	path string
	once sync.Once
	hook func()
}

func (h *hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == h.path {
		h.once.Do(h.hook)
	}
	return h.next.RoundTrip(r)
}

// Changes committed between ObserveLeader's first read and its watch are
// reported after the read's state, in commit order: the observed leader
// never goes back in time.
func TestObserveLeaderNeverGoesBack(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sa, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := NewElection(sa, "x"), NewElection(sb, "x")
	la, err := a.Campaign(ctx, "A")
	if err != nil {
		t.Fatal(err)
	}
	var lb *Leadership
	rt := &hookTransport{next: &http.Transport{}, path: "/fence.v1.KVService/Watch", hook: func() {
		if err := a.Resign(ctx); err != nil {
			t.Error(err)
		}
		if lb, err = b.Campaign(ctx, "B1"); err != nil {
			t.Error(err)
		}
		if err := b.Proclaim(ctx, "B2"); err != nil {
			t.Error(err)
		}
	}}
	obs := mustNew(t, WithEndpoints(srv.Addr()), WithHTTPClient(&http.Client{Transport: rt}))
	states, err := obs.ObserveLeader(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	want := []LeaderState{{true, "A", la.Token()}, {}, {true, "B1", 0}, {true, "B2", 0}}
	for i, w := range want {
		select {
		case got := <-states:
			if i >= 2 {
				w.Token = lb.Token()
			}
			if got != w {
				t.Fatalf("state %d: %+v, want %+v", i, got, w)
			}
		case <-ctx.Done():
			t.Fatalf("state %d: nothing; want %+v", i, w)
		}
	}
}
