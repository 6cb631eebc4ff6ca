package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

func fencev1connectClusterClient(s *Server) fencev1connect.ClusterServiceClient {
	return fencev1connect.NewClusterServiceClient(http.DefaultClient, "http://"+s.Addr())
}

// sessionCount is the number of sessions Status reports.
func sessionCount(t *testing.T, s *Server) uint64 {
	t.Helper()
	resp, err := fencev1connectClusterClient(s).Status(context.Background(), connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetSessions()
}

// JSON durations may be written as the CLI's flags take them ("500ms",
// "1m"), as well as protojson's "0.5s"; anything else is refused with a
// message naming the accepted forms, and nothing is created.
func TestJSONAcceptsGoDurations(t *testing.T) {
	s := startTestServer(t, nil)
	for _, tc := range []struct{ ttl, want string }{
		{"1500ms", "1.500s"},
		{"1m", "60s"},
		{"1m30s", "90s"},
		{"2.5s", "2.500s"},
	} {
		resp, body := postJSON(t, s.Addr(), "SessionService/CreateSession", `{"ttl":"`+tc.ttl+`","owner":"json"}`)
		var out struct{ SessionID, TTL string }
		if err := json.Unmarshal([]byte(body), &out); resp.StatusCode != http.StatusOK || err != nil || out.TTL != tc.want {
			t.Errorf("CreateSession ttl %q: %d %s, want a session with ttl %q", tc.ttl, resp.StatusCode, body, tc.want)
		}
	}
	// A Duration inside an AcquireRequest, too.
	_, body := postJSON(t, s.Addr(), "SessionService/CreateSession", `{"ttl":"10s"}`)
	var sess struct{ SessionID, SessionSecret string }
	_ = json.Unmarshal([]byte(body), &sess)
	resp, body := postJSON(t, s.Addr(), "LockService/Acquire", `{"sessionId":"`+sess.SessionID+`","sessionSecret":"`+sess.SessionSecret+`","lock":"d","lockDelay":"250ms"}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("Acquire with lockDelay 250ms: %d %s", resp.StatusCode, body)
	}

	var before uint64
	for _, ttl := range []string{"ten seconds", "10", "1x"} {
		before = sessionCount(t, s)
		resp, body := postJSON(t, s.Addr(), "SessionService/CreateSession", `{"ttl":"`+ttl+`"}`)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `\"500ms\"`) || !strings.Contains(body, "ttl") {
			t.Errorf("CreateSession ttl %q: %d %s, want 400 naming the field and the accepted forms", ttl, resp.StatusCode, body)
		}
		if after := sessionCount(t, s); after != before {
			t.Errorf("a refused CreateSession made a session (%d, then %d)", before, after)
		}
	}
}

// Check answers in JSON with every field, "current": false included.
func TestJSONCheckSaysFalse(t *testing.T) {
	s := startTestServer(t, nil)
	resp, body := postJSON(t, s.Addr(), "LockService/Check", `{"lock":"free","token":"3"}`)
	var out map[string]any
	if err := json.Unmarshal([]byte(body), &out); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("Check: %d %s", resp.StatusCode, body)
	}
	if out["current"] != false || out["held"] != false || out["currentToken"] != "0" {
		t.Errorf("Check of a free lock = %s, want current and held false, currentToken 0", body)
	}
}

// A lock taken without waiting that is held fails with REASON_LOCKED,
// whose detail names the holder's session and token in fields.
func TestLockedDetailNamesTheHolder(t *testing.T) {
	_, a := startWithAPI(t, nil)
	holder := a.session(10 * time.Second)
	token := a.mustAcquire(holder, "busy")
	other := a.session(10 * time.Second)
	_, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: other, Lock: "busy", Try: true})
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("acquire of a held lock: %v", err)
	}
	var detail *fencev1.ErrorDetail
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			detail, _ = v.(*fencev1.ErrorDetail)
		}
	}
	if detail.GetReason() != fencev1.Reason_REASON_LOCKED || detail.GetLock() != "busy" || detail.GetHolderSessionId() != holder || detail.GetHolderToken() != token {
		t.Errorf("detail = %v, want REASON_LOCKED naming session %d, token %d", detail, holder, token)
	}
}

// Status names the leader's API address in leaderAddress, and its raft
// address in leaderRaftAddress.
func TestStatusLeaderAddresses(t *testing.T) {
	s := startTestServer(t, nil)
	var st *fencev1.StatusResponse
	waitFor(t, "the leader to register its API address", func() bool {
		resp, err := fencev1connectClusterClient(s).Status(context.Background(), connect.NewRequest(&fencev1.StatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		st = resp.Msg
		return st.GetLeaderAddress() != ""
	})
	if st.GetLeaderAddress() != s.Addr() || st.GetLeaderRaftAddress() != s.RaftAddr() {
		t.Errorf("leaderAddress %q, leaderRaftAddress %q; want %q (API) and %q (raft)", st.GetLeaderAddress(), st.GetLeaderRaftAddress(), s.Addr(), s.RaftAddr())
	}
}

// A GET on an RPC path (405) and a body of the wrong Content-Type (415)
// are answered with a JSON body saying what to send.
func TestRefusalsSayWhatToSend(t *testing.T) {
	s := startTestServer(t, nil)
	url := "http://" + s.Addr() + "/fence.v1.ClusterService/Status"
	check := func(what string, resp *http.Response, wantCode int, want ...string) {
		t.Helper()
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out struct{ Code, Message string }
		if resp.StatusCode != wantCode || json.Unmarshal(data, &out) != nil || out.Code == "" {
			t.Fatalf("%s: %d %q, want %d with a JSON error", what, resp.StatusCode, data, wantCode)
		}
		for _, w := range want {
			if !strings.Contains(out.Message, w) {
				t.Errorf("%s: message %q does not say %q", what, out.Message, w)
			}
		}
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	check("GET", resp, http.StatusMethodNotAllowed, "POST", "application/json")
	resp, err = http.Post(url, "text/plain", bytes.NewBufferString("{}"))
	if err != nil {
		t.Fatal(err)
	}
	check("text/plain", resp, http.StatusUnsupportedMediaType, "text/plain", "application/json")
	resp, err = http.Post(url, "application/x-www-form-urlencoded", bytes.NewBufferString("{}"))
	if err != nil {
		t.Fatal(err)
	}
	check("a form (curl -d without -H)", resp, http.StatusUnsupportedMediaType, "application/json")
}
