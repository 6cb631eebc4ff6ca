package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
)

// grantKey names a grant of one lock to one session.
type grantKey struct {
	lock    string
	session uint64
}

// ledger records what the service acknowledged to the load's clients.
type ledger struct {
	mu        sync.Mutex
	acks      int
	maxToken  uint64
	byToken   map[uint64]grantKey // every acknowledged grant
	held      map[grantKey]uint64 // acknowledged, and no release sent
	releasing map[grantKey]uint64 // release sent, not acknowledged
	errs      []string            // invariant violations seen by the clients
}

func newLedger() *ledger {
	return &ledger{byToken: map[uint64]grantKey{}, held: map[grantKey]uint64{}, releasing: map[grantKey]uint64{}}
}

func (l *ledger) granted(k grantKey, token uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.byToken[token]; ok {
		l.errs = append(l.errs, fmt.Sprintf("token %d acknowledged twice: to %v and to %v", token, prev, k))
	}
	l.byToken[token] = k
	l.held[k] = token
	l.acks++
	l.maxToken = max(l.maxToken, token)
}

func (l *ledger) releaseSent(k grantKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releasing[k] = l.held[k]
	delete(l.held, k)
}

func (l *ledger) released(k grantKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.releasing, k)
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks
}

// loadLock is the lock a worker takes in its n-th round: its own lock, one
// of two hot locks all workers share, or (every eighth round) a lock it
// keeps, so that many grants are outstanding when the node is killed.
func loadLock(worker, n int) (name string, keep bool) {
	switch {
	case n%8 == 7:
		return fmt.Sprintf("load/keep-%d-%d", worker, n), true
	case n%2 == 0:
		return fmt.Sprintf("load/own-%d", worker), false
	default:
		return fmt.Sprintf("load/hot-%d", n/2%2), false
	}
}

// runLoad locks and unlocks in a loop until ctx ends or a call fails,
// recording every acknowledgement in l.
func runLoad(ctx context.Context, s *client.Session, worker int, l *ledger) error {
	for n := 0; ctx.Err() == nil; n++ {
		name, keep := loadLock(worker, n)
		k := grantKey{name, s.ID()}
		m := client.NewMutex(s, name)
		g, err := m.Lock(ctx)
		if err != nil {
			return fmt.Errorf("worker %d: locking %s: %w", worker, name, err)
		}
		l.granted(k, g.Token())
		if keep {
			continue
		}
		l.releaseSent(k)
		if err := m.Unlock(ctx); err != nil {
			return fmt.Errorf("worker %d: unlocking %s: %w", worker, name, err)
		}
		l.released(k)
	}
	return nil
}

// locksJSON is the output of `fence locks --json`.
type locksJSON struct {
	Locks []struct {
		Name    string `json:"name"`
		Holders []struct {
			SessionID uint64 `json:"sessionId,string"`
			Token     uint64 `json:"token,string"`
		} `json:"holders"`
	} `json:"locks"`
}

func TestKillDashNineUnderLoad(t *testing.T) {
	srv := startServer(t)
	const (
		workers = 6
		// Long enough that no session expires across the restart.
		ttl       = 30 * time.Second
		minAcks   = 300
		killAfter = 20 * time.Second
	)
	c := newClient(t, srv.addr)
	sessions := make([]*client.Session, workers)
	for i := range sessions {
		sessions[i] = newSession(t, c, ttl, fmt.Sprintf("e2e load worker %d", i))
	}

	l := newLedger()
	var killed atomic.Bool
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	errs := make(chan error, workers)
	for i, s := range sessions {
		go func() {
			err := runLoad(ctx, s, i, l)
			if err != nil && killed.Load() {
				err = nil // expected: the node is gone
			}
			errs <- err
		}()
	}

	waitFor(t, killAfter, fmt.Sprintf("%d acknowledged grants", minAcks), func() bool {
		select {
		case err := <-errs:
			t.Fatalf("load failed before the kill: %v", err)
		default:
		}
		return l.count() >= minAcks
	})
	killed.Store(true)
	srv.kill(t)
	stopLoad()
	for range workers {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("load failed before the kill: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("load workers did not stop after the kill")
		}
	}
	// No call is in flight now, so every acknowledgement came from the
	// killed node, and the ledger is final.
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		t.Error(e)
	}
	t.Logf("killed after %d acknowledged grants (max token %d): %d held, %d releases in flight",
		l.acks, l.maxToken, len(l.held), len(l.releasing))
	if len(l.held) == 0 {
		t.Fatal("no grant was outstanding at the kill; the test proves nothing")
	}

	srv.restart(t) // same data dir, same ports

	stdout, stderr, code := runFence(t, append(srv.endpoints(), "locks", "--json", "--prefix", "load/")...)
	if code != 0 {
		t.Fatalf("fence locks --json exited %d: %s", code, stderr)
	}
	var listing locksJSON
	if err := json.Unmarshal([]byte(stdout), &listing); err != nil {
		t.Fatalf("decoding fence locks --json: %v\n%s", err, stdout)
	}
	holderTokens := map[grantKey]uint64{}
	var maxListed uint64
	for _, lk := range listing.Locks {
		for _, h := range lk.Holders {
			k := grantKey{lk.Name, h.SessionID}
			holderTokens[k] = h.Token
			maxListed = max(maxListed, h.Token)
			// A listed grant the clients were told of must be that very grant.
			if ack, ok := l.byToken[h.Token]; ok && ack != k {
				t.Errorf("after restart %s is held by session %d with token %d, but that token was acknowledged to session %d for %s",
					k.lock, k.session, h.Token, ack.session, ack.lock)
			}
		}
	}
	// (a) No acknowledged grant that was not released is lost.
	for k, token := range l.held {
		got, ok := holderTokens[k]
		switch {
		case !ok:
			t.Errorf("committed grant lost: %s (token %d) was acknowledged to session %d and never released, but after restart the session does not hold it",
				k.lock, token, k.session)
		case got != token:
			t.Errorf("after restart session %d holds %s with token %d, want the acknowledged %d", k.session, k.lock, got, token)
		}
	}
	// A release in flight at the kill may or may not have committed; if the
	// session still holds the lock, it is with the same grant.
	for k, token := range l.releasing {
		if got, ok := holderTokens[k]; ok && got != token {
			t.Errorf("after restart session %d holds %s with token %d, want %d (or released)", k.session, k.lock, got, token)
		}
	}

	// (b) The token counter did not go back, and the next grant's token is
	// above every token handed out before.
	stdout, stderr, code = runFence(t, append(srv.endpoints(), "status", "--json")...)
	if code != 0 {
		t.Fatalf("fence status --json exited %d: %s", code, stderr)
	}
	var st struct {
		State     string `json:"state"`
		LastToken uint64 `json:"lastToken,string"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("decoding fence status --json: %v\n%s", err, stdout)
	}
	if st.State != "Leader" || st.LastToken < l.maxToken || st.LastToken < maxListed {
		t.Errorf("after restart fence status says %s with last token %d, want Leader and at least %d", st.State, st.LastToken, max(l.maxToken, maxListed))
	}
	after := client.NewMutex(newSession(t, c, 10*time.Second, "e2e after restart"), "load/after-restart")
	g, err := after.Lock(context.Background())
	if err != nil {
		t.Fatalf("locking after restart: %v", err)
	}
	if g.Token() <= l.maxToken || g.Token() <= maxListed {
		t.Errorf("first grant after restart has token %d, not above the %d acknowledged and %d listed before", g.Token(), l.maxToken, maxListed)
	}
	t.Logf("first token after restart: %d", g.Token())
	if err := after.Unlock(context.Background()); err != nil {
		t.Errorf("unlocking after restart: %v", err)
	}
}

// A second `fence serve` on a data dir in use exits at once, naming the
// process that has it; it used to wait forever on the log store's file
// lock, deaf to SIGTERM and SIGINT.
func TestSecondServeOnDataDirInUse(t *testing.T) {
	first := startServer(t)
	addrs := freeAddrs(t, 2)
	second := startFence(t, "second fence serve", "serve", "--data-dir", first.dataDir, "--listen", addrs[0], "--raft-listen", addrs[1])
	code := second.waitExit(t, 5*time.Second)
	want := fmt.Sprintf("is in use by another fence process (pid %d)", first.proc.Pid())
	if code == 0 || !strings.Contains(second.Stderr(), want) {
		t.Fatalf("second serve exited %d; stderr:\n%s\nwant it to fail saying %q", code, second.Stderr(), want)
	}
	if _, _, code := runFence(t, append(first.endpoints(), "status")...); code != 0 {
		t.Fatalf("the first node stopped serving: fence status exited %d", code)
	}
}
