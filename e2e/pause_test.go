package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
)

// A leader paused with SIGSTOP (a GC storm, a stuck disk, a VM stall) is
// replaced; when it resumes it still believes it leads until it hears of
// the new term. A keepalive that reached it meanwhile must fail: answered
// from its memory, it would move the client's safe-until past the moment
// the new leader, counting on its own clock, expires the session and hands
// its locks on. Each round pauses the leader of the moment.
func TestPausedLeaderRenewsNoSession(t *testing.T) {
	c := startCluster(t, 3, "--heartbeat-timeout", "500ms", "--election-timeout", "500ms")
	for round := 1; round <= 3; round++ {
		old := c.waitLeader(t, 30*time.Second)
		var created struct{ SessionID string }
		mustPost(t, old.addr, "fence.v1.SessionService/CreateSession", `{"ttl":"60s"}`, &created)

		old.proc.signal(t, syscall.SIGSTOP)
		var others []*clusterNode
		for _, nd := range c.members() {
			if nd != old {
				others = append(others, nd)
			}
		}
		waitFor(t, 30*time.Second, "the others to elect a new leader", func() bool {
			for _, nd := range others {
				if st, err := c.statusOf(nd); err != nil || st.GetState() != "Leader" {
					continue
				}
				return true
			}
			return false
		})
		answer := make(chan string, 1)
		go func() {
			resp, err := httpClient.Post("http://"+old.addr+"/fence.v1.SessionService/KeepAlive", "application/json",
				strings.NewReader(`{"sessionId":"`+created.SessionID+`"}`))
			if err != nil {
				answer <- "error: " + err.Error()
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == http.StatusOK {
				answer <- "ok"
				return
			}
			var e struct{ Code string }
			_ = json.Unmarshal(body, &e)
			answer <- e.Code
		}()
		time.Sleep(200 * time.Millisecond) // the keepalive waits in the paused node's socket
		old.proc.signal(t, syscall.SIGCONT)
		select {
		case got := <-answer:
			if got == "ok" {
				t.Fatalf("round %d: %s, paused while a new leader was elected, renewed session %s when it resumed", round, old.id, created.SessionID)
			}
			t.Logf("round %d: the resumed old leader answered the keepalive with %q", round, got)
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the resumed old leader did not answer the keepalive", round)
		}
	}
}

// A leader stopped with SIGSTOP while a client writes to it fills the
// sockets between them, and the write that filled them waits for the
// stream's write timeout (15 s). Every other caller queued on that stream
// keeps to its own deadline, and so does the session's keepalive, which
// moves on to the new leader before the session's safe-until instead of
// waiting for the stream to break.
func TestStoppedLeaderHoldsUpOnlyTheWriteThatFilledItsSocket(t *testing.T) {
	c := startCluster(t, 3, "--heartbeat-timeout", "500ms", "--election-timeout", "500ms")
	old := c.waitLeader(t, 30*time.Second)
	cl, err := client.New(client.WithEndpoints(c.addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	s, err := cl.NewSession(ctx, client.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 200<<10)
	if _, err := cl.KV().Put(ctx, "warm", value); err != nil {
		t.Fatal(err)
	}

	old.proc.signal(t, syscall.SIGSTOP)
	defer old.proc.signal(t, syscall.SIGCONT)
	const limit = 300 * time.Millisecond
	var (
		mu      sync.Mutex
		overran []time.Duration
	)
	// Past the session's TTL, and short of the client's 15 s write timeout:
	// one write (the one that filled the socket) may overrun, no other.
	stop := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				pctx, cancel := context.WithTimeout(ctx, limit)
				start := time.Now()
				_, _ = cl.KV().Put(pctx, fmt.Sprintf("flood/%d/%d", w, i), value)
				cancel()
				if took := time.Since(start); took > limit+time.Second {
					mu.Lock()
					overran = append(overran, took)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if err := s.Err(); err != nil {
		t.Fatalf("the session ended while its client flooded the stopped leader %s: %v", old.id, err)
	}
	if len(overran) > 1 {
		t.Fatalf("%d puts with a deadline of %v returned after %v: only the write that filled the socket may wait for the stream's write timeout", len(overran), limit, overran)
	}
	t.Logf("puts past their deadline: %v", overran)
}
