package clients_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing"
)

// TestScenario plays scenarios.json with the Go client, as the Python and
// TypeScript suites play it with theirs.
func TestScenario(t *testing.T) {
	play := map[string]func(*testing.T, *control){
		"smallest-program":   smallestProgram,
		"paused-holder":      pausedHolder,
		"stalled-keepalives": stalledKeepAlives,
		"cancelled-acquire":  cancelledAcquire,
		"leader-killed":      leaderKilled,
		"tls-token-failover": tlsTokenFailover,
	}
	for _, sc := range scenarios(t) {
		t.Run(sc.ID, func(t *testing.T) {
			fn := play[sc.ID]
			if fn == nil {
				t.Fatalf("the Go client does not play scenario %s: %s", sc.ID, sc.Says)
			}
			fn(t, newControl(t))
		})
	}
}

func mustGroup(t *testing.T, ctl *control, spec groupSpec) *group {
	t.Helper()
	g, err := ctl.start(spec)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func smallestProgram(t *testing.T, ctl *control) {
	ctx := context.Background()
	c := mustGroup(t, ctl, groupSpec{Nodes: 1}).client()
	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	m := client.NewMutex(s, "orders")
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "orders/17", []byte("paid"), client.WithGrant(g)); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "orders/17", []byte("shipped"), client.WithGrant(again)); err != nil {
		t.Fatal(err)
	}
	_, err = c.KV().Put(ctx, "orders/17", []byte("late"), client.WithGrant(g))
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) || stale.Token != g.Token() || stale.Highest != again.Token() {
		t.Fatalf("a put with the first token %d: %v, want a stale-token error naming %d and %d", g.Token(), err, g.Token(), again.Token())
	}
	kv, err := c.KV().Get(ctx, "orders/17")
	if err != nil || string(kv.Value) != "shipped" {
		t.Fatalf("orders/17 = %v, %v; want shipped", kv, err)
	}
}

// write sends body to url as a write fenced by lock and token, and returns
// the answer's status and body.
func write(url, lock string, token uint64, body string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set(fencing.HeaderLock, lock)
	req.Header.Set(fencing.HeaderToken, strconv.FormatUint(token, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// holderEnv makes the test binary a holder process of paused-holder: it
// takes the lock "paused" with a session of a 2 s TTL on the endpoint the
// variable names, prints "token N", and, for each line "write URL" read
// from stdin, prints "lost" or "held" (whether it still believes it holds
// the lock), then writes through URL anyway and prints the answer.
const holderEnv = "FENCE_CLIENTS_HOLDER"

func init() {
	if ep := os.Getenv(holderEnv); ep != "" {
		if err := holder(ep); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func holder(endpoint string) error {
	ctx := context.Background()
	c, err := client.New(client.WithEndpoints(endpoint))
	if err != nil {
		return err
	}
	s, err := c.NewSession(ctx, client.WithTTL(2*time.Second))
	if err != nil {
		return err
	}
	g, err := client.NewMutex(s, "paused").Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Println("token", g.Token())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		url, ok := strings.CutPrefix(in.Text(), "write ")
		if !ok {
			continue
		}
		// A holder that may have paused asks before it writes: the grant
		// has ended, or the session's safe-until has passed (its timer may
		// not have run yet in a process that just woke).
		if g.Err() != nil || !time.Now().Before(s.SafeUntil()) {
			fmt.Println("lost")
		} else {
			fmt.Println("held")
		}
		status, body, err := write(url, "paused", g.Token(), "from the paused holder")
		if err != nil {
			return err
		}
		fmt.Println(status, body)
	}
	return in.Err()
}

func pausedHolder(t *testing.T, ctl *control) {
	ctx := context.Background()
	g := mustGroup(t, ctl, groupSpec{Nodes: 1})
	res, url := newLedger(t)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), holderEnv+"="+g.nodes[0].api)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewScanner(stdout)
	line := func() string {
		if !out.Scan() {
			t.Fatalf("the holder ended: %v", out.Err())
		}
		return out.Text()
	}
	first, err := strconv.ParseUint(strings.TrimPrefix(line(), "token "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	c := g.client()
	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	next, err := client.NewMutex(s, "paused").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= first {
		t.Fatalf("the next holder's token %d is not above the paused holder's %d", next.Token(), first)
	}
	if status, body, err := write(url, "paused", next.Token(), "from the next holder"); err != nil || status != http.StatusNoContent {
		t.Fatalf("the next holder's write: %d %s %v", status, body, err)
	}
	time.Sleep(time.Until(paused.Add(6 * time.Second))) // the pause lasts 3x the holder's TTL
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	fmt.Fprintln(stdin, "write "+url)
	if belief := line(); belief != "lost" {
		t.Errorf("the holder woke and believed its grant %s, want lost", belief)
	}
	answer := line()
	if !strings.HasPrefix(answer, "409 ") || !strings.Contains(answer, `"code":"stale_token"`) {
		t.Errorf("the paused holder's late write was answered %q, want 409 with the stale-token body", answer)
	}
	if w := res.all(); len(w) != 1 || w[0].body != "from the next holder" || w[0].token != next.Token() {
		t.Errorf("the resource holds %v, want only the next holder's write, with token %d", w, next.Token())
	}
}

func stalledKeepAlives(t *testing.T, ctl *control) {
	ctx := context.Background()
	g := mustGroup(t, ctl, groupSpec{Nodes: 1})
	c := g.client()
	ttl := 2 * time.Second
	s, err := c.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	grant, err := client.NewMutex(s, "stalled").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.nodes[0].pause(); err != nil {
		t.Fatal(err)
	}
	defer g.nodes[0].resume()
	stalled := time.Now()
	safe := s.SafeUntil()
	select {
	case <-grant.Done():
	case <-time.After(3 * ttl):
		t.Fatal("the grant did not end with its session's keepalives stalled")
	}
	lost := time.Now()
	if late := lost.Sub(s.SafeUntil()); late > 250*time.Millisecond {
		t.Errorf("the grant ended %v after the session's safe-until", late)
	}
	if lost.Before(safe.Add(-ttl/2)) && lost.Sub(stalled) < ttl/3 {
		t.Errorf("the grant ended %v after the stall, before the ttl's safe share passed", lost.Sub(stalled))
	}
	if s.Err() == nil {
		t.Error("the session still reports itself alive")
	}
}

func cancelledAcquire(t *testing.T, ctl *control) {
	ctx := context.Background()
	c := mustGroup(t, ctl, groupSpec{Nodes: 1}).client()
	session := func() *client.Session {
		s, err := c.NewSession(ctx, client.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(ctx) })
		return s
	}
	a, b, cs, d := session(), session(), session(), session()
	ma := client.NewMutex(a, "busy")
	if _, err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.NewMutex(b, "busy", client.WithWaitTimeout(300*time.Millisecond)).Lock(ctx); !errors.Is(err, fence.ErrWaitTimeout) {
		t.Fatalf("B's acquire with a 300 ms wait timeout: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := client.NewMutex(cs, "busy").Lock(cctx); err == nil {
		t.Fatal("C's cancelled acquire was granted")
	}
	locks, err := c.Locks(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		for _, w := range l.Waiters {
			if w.SessionId == b.ID() || w.SessionId == cs.ID() {
				t.Errorf("session %d still waits for %s after its acquire ended", w.SessionId, l.Name)
			}
		}
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := client.NewMutex(d, "busy").Lock(dctx); err != nil {
		t.Fatalf("D was not granted the free lock at once: %v", err)
	}
}

func leaderKilled(t *testing.T, ctl *control) {
	ctx := context.Background()
	g := mustGroup(t, ctl, groupSpec{Nodes: 3})
	c := g.client()
	var (
		last    uint64
		written = map[string]string{}
		killed  = -1
	)
	for i := 0; killed < 0 || i < killed+20; i++ {
		if i == 20 {
			if err := leaderOf(t, g).kill(); err != nil {
				t.Fatal(err)
			}
			killed = i
		}
		tok, key, err := lockAndWrite(ctx, c, i)
		if err != nil {
			t.Fatalf("cycle %d (the leader killed at %d): %v", i, killed, err)
		}
		if tok <= last {
			t.Fatalf("cycle %d: token %d after %d", i, tok, last)
		}
		last = tok
		written[key] = strconv.FormatUint(tok, 10)
	}
	for key, want := range written {
		kv, err := c.KV().Get(ctx, key)
		if err != nil || string(kv.Value) != want {
			t.Errorf("%s = %v, %v; want %s", key, kv, err, want)
		}
	}
}

// lockAndWrite is a cycle of leader-killed: a session, the lock, a put of
// the token under the lock, the unlock.
func lockAndWrite(ctx context.Context, c *client.Client, i int) (uint64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, client.WithTTL(5*time.Second))
	if err != nil {
		return 0, "", err
	}
	defer s.Close(ctx)
	m := client.NewMutex(s, "loop")
	grant, err := m.Lock(ctx)
	if err != nil {
		return 0, "", err
	}
	key := fmt.Sprintf("loop/%d", i)
	if _, err := c.KV().Put(ctx, key, []byte(strconv.FormatUint(grant.Token(), 10)), client.WithGrant(grant)); err != nil {
		return 0, "", err
	}
	return grant.Token(), key, m.Unlock(ctx)
}

func leaderOf(t *testing.T, g *group) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := g.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func tlsTokenFailover(t *testing.T, ctl *control) {
	ctx := context.Background()
	g := mustGroup(t, ctl, groupSpec{Nodes: 3, TLS: true, Auth: true})
	c := g.client()
	first, _, err := lockAndWrite(ctx, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaderOf(t, g).kill(); err != nil {
		t.Fatal(err)
	}
	second, _, err := lockAndWrite(ctx, c, 2)
	if err != nil {
		t.Fatalf("after the leader was killed: %v", err)
	}
	if second <= first {
		t.Fatalf("token %d after %d", second, first)
	}
	anon, err := client.New(client.WithEndpoints(g.endpoints()...), client.WithTLS(g.tls))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.NewSession(ctx); !errors.Is(err, fence.ErrAuthFailed) {
		t.Fatalf("a client without the token: %v, want the unauthenticated error", err)
	}
}
