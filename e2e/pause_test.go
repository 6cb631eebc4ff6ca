package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
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
