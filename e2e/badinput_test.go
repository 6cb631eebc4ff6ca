package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// connectError is the JSON body of a Connect error.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type statusJSON struct {
	LastToken uint64 `json:"lastToken,string"`
	Sessions  uint64 `json:"sessions,string"`
	Locks     uint64 `json:"locks,string"`
}

const (
	createSession = "fence.v1.SessionService/CreateSession"
	keepAlive     = "fence.v1.SessionService/KeepAlive"
	closeSession  = "fence.v1.SessionService/CloseSession"
	acquire       = "fence.v1.LockService/Acquire"
	release       = "fence.v1.LockService/Release"
	listLocks     = "fence.v1.LockService/ListLocks"
	status        = "fence.v1.ClusterService/Status"
	kvPut         = "fence.v1.KVService/Put"
	kvGet         = "fence.v1.KVService/Get"
)

func TestBadInput(t *testing.T) {
	const maxRequest = 4096
	// The KV value limit must stay below the request limit.
	srv := startServer(t, "--max-request-bytes", fmt.Sprint(maxRequest), "--max-value-bytes", fmt.Sprint(maxRequest/2))

	// State the bad requests must leave alone: a held lock, and a second
	// session that holds nothing.
	var holder, other struct {
		SessionID uint64 `json:"sessionId,string"`
	}
	mustPost(t, srv.addr, createSession, `{"ttl":"30s","owner":"e2e holder"}`, &holder)
	mustPost(t, srv.addr, createSession, `{"ttl":"30s","owner":"e2e other"}`, &other)
	const held = "e2e/bad/held"
	var grant struct {
		Token uint64 `json:"token,string"`
	}
	mustPost(t, srv.addr, acquire, fmt.Sprintf(`{"sessionId":"%d","lock":%q}`, holder.SessionID, held), &grant)
	var locksBefore any
	mustPost(t, srv.addr, listLocks, `{}`, &locksBefore)
	var stBefore statusJSON
	mustPost(t, srv.addr, status, `{}`, &stBefore)

	const unknownSession = 987654321
	acq := func(name string) string {
		data, _ := json.Marshal(map[string]string{"sessionId": fmt.Sprint(holder.SessionID), "lock": name})
		return string(data)
	}
	cases := []struct {
		name      string
		procedure string
		body      string
		code      string
		msg       []string // the message must contain each
	}{
		{"empty lock name", acquire, acq(""), "invalid_argument", []string{"lock name", "empty"}},
		{"oversized lock name", acquire, acq(strings.Repeat("n", 513)), "invalid_argument", []string{"lock name", "513 bytes", "512"}},
		{"lock name with control character", acquire, acq("e2e/bad\x07name"), "invalid_argument", []string{"lock name", "control character", "U+0007"}},
		{"lock name with NUL", acquire, acq("e2e/bad\x00name"), "invalid_argument", []string{"lock name", "control character", "U+0000"}},
		{"lock name with right-to-left override", acquire, acq("e2e/\u202egnp.exe"), "invalid_argument", []string{"lock name", "formatting character", "U+202E"}},
		{"lock name with zero-width space", acquire, acq("e2e/a\u200bb"), "invalid_argument", []string{"lock name", "formatting character", "U+200B"}},
		{"lock name with line separator", acquire, acq("e2e/a\u2028b"), "invalid_argument", []string{"lock name", "U+2028"}},
		{"lock name with no-break space", acquire, acq("e2e/a\u00a0b"), "invalid_argument", []string{"lock name", "U+00A0", "ASCII space"}},
		{"lock name only whitespace", acquire, acq("   "), "invalid_argument", []string{"lock name", "only whitespace"}},
		{"TTL 0s", createSession, `{"ttl":"0s"}`, "invalid_argument", []string{"ttl", "0s", "1s"}},
		{"TTL negative", createSession, `{"ttl":"-5s"}`, "invalid_argument", []string{"ttl", "-5s", "negative"}},
		{"TTL 100h", createSession, `{"ttl":"360000s"}`, "invalid_argument", []string{"ttl", "100h", "1h"}},
		{"TTL 100h as Go writes it", createSession, `{"ttl":"100h"}`, "invalid_argument", []string{"ttl", "100h", "1h"}},
		{"TTL not a duration", createSession, `{"ttl":"ten seconds"}`, "invalid_argument", []string{"ttl", `"ten seconds" is not a duration`, `"500ms"`}},
		{"malformed JSON", acquire, `{"sessionId":"1","lock":`, "invalid_argument", []string{"unmarshal", "AcquireRequest"}},
		{"JSON array, not object", createSession, `[]`, "invalid_argument", []string{"unmarshal", "CreateSessionRequest"}},
		{"empty body", createSession, ``, "invalid_argument", []string{"body is empty"}},
		{"misspelt field", createSession, `{"tll":"30s"}`, "invalid_argument", []string{"unknown field", "tll"}},
		{"session id not a number", acquire, `{"sessionId":"abc","lock":"x"}`, "invalid_argument", []string{"sessionId", `"abc"`}},
		{"missing session id", acquire, `{"lock":"e2e/bad/x"}`, "invalid_argument", []string{"session_id", "missing"}},
		{"unknown session on acquire", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/x"}`, unknownSession),
			"not_found", []string{"session", fmt.Sprint(unknownSession)}},
		{"unknown session on keepalive", keepAlive, fmt.Sprintf(`{"sessionId":"%d"}`, unknownSession),
			"not_found", []string{"session", fmt.Sprint(unknownSession)}},
		{"unknown session on release", release, fmt.Sprintf(`{"sessionId":"%d","lock":%q,"token":"%d"}`, unknownSession, held, grant.Token),
			"not_found", []string{"session", fmt.Sprint(unknownSession)}},
		{"wrong token on release", release, fmt.Sprintf(`{"sessionId":"%d","lock":%q,"token":"%d"}`, holder.SessionID, held, grant.Token+100),
			"failed_precondition", []string{held, "token", fmt.Sprint(grant.Token), fmt.Sprint(grant.Token + 100)}},
		{"missing token on release", release, fmt.Sprintf(`{"sessionId":"%d","lock":%q}`, holder.SessionID, held),
			"invalid_argument", []string{"token", "missing"}},
		{"release by a non-holder", release, fmt.Sprintf(`{"sessionId":"%d","lock":%q,"token":"%d"}`, other.SessionID, held, grant.Token),
			"failed_precondition", []string{held, "does not hold", fmt.Sprint(other.SessionID)}},
		{"release of a lock nobody holds", release, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/free","token":"1"}`, holder.SessionID),
			"failed_precondition", []string{"e2e/bad/free", "does not hold"}},
		{"semaphore without permits", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/sem","mode":"MODE_SEMAPHORE"}`, holder.SessionID),
			"invalid_argument", []string{"semaphore needs permits", "10000"}},
		{"permits on a lock", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/sem","permits":3}`, holder.SessionID),
			"invalid_argument", []string{"permits", "exclusive", "MODE_SEMAPHORE"}},
		{"too many permits", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/sem","mode":"MODE_SEMAPHORE","permits":10001}`, holder.SessionID),
			"invalid_argument", []string{"permits 10001", "10000"}},
		{"a lock taken as a semaphore", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":%q,"mode":"MODE_SEMAPHORE","permits":2}`, other.SessionID, held),
			"invalid_argument", []string{held, "in use as a lock"}},
		{"unknown mode", acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/x","mode":7}`, holder.SessionID),
			"invalid_argument", []string{"unknown mode 7"}},
		{"fenced write without its lock", kvPut, fmt.Sprintf(`{"key":"e2e/bad/k","value":"dg==","fence":{"token":"%d"}}`, grant.Token),
			"invalid_argument", []string{"fence.lock"}},
		{"key bound to an unknown session", kvPut, fmt.Sprintf(`{"key":"e2e/bad/k","value":"dg==","sessionId":"%d"}`, unknownSession),
			"not_found", []string{"session", fmt.Sprint(unknownSession)}},
		{"oversized request", acquire, acq(strings.Repeat("x", maxRequest+100)), "resource_exhausted", []string{"larger than", fmt.Sprint(maxRequest)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, srv.addr, tc.procedure, tc.body)
			if code == http.StatusOK || code == 0 {
				t.Fatalf("HTTP %d: %s; want a %s error", code, body, tc.code)
			}
			var ce connectError
			if err := json.Unmarshal(body, &ce); err != nil {
				t.Fatalf("HTTP %d, body %q is not a Connect error: %v", code, body, err)
			}
			if ce.Code != tc.code {
				t.Errorf("code = %q, want %q (message %q)", ce.Code, tc.code, ce.Message)
			}
			for _, want := range tc.msg {
				if !strings.Contains(ce.Message, want) {
					t.Errorf("message %q does not mention %q", ce.Message, want)
				}
			}
		})
	}

	// The node still runs, its state is as before, and it still serves.
	srv.proc.failIfExited(t)
	var locksAfter any
	mustPost(t, srv.addr, listLocks, `{}`, &locksAfter)
	if !reflect.DeepEqual(locksBefore, locksAfter) {
		t.Errorf("bad requests changed the locks:\nbefore %v\nafter  %v", locksBefore, locksAfter)
	}
	var stAfter statusJSON
	mustPost(t, srv.addr, status, `{}`, &stAfter)
	if stAfter != stBefore {
		t.Errorf("bad requests changed the state: before %+v, after %+v", stBefore, stAfter)
	}

	var fresh struct {
		SessionID uint64 `json:"sessionId,string"`
	}
	mustPost(t, srv.addr, createSession, `{"ttl":"5s"}`, &fresh)
	var g2 struct {
		Lock  string `json:"lock"`
		Token uint64 `json:"token,string"`
	}
	mustPost(t, srv.addr, acquire, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/after"}`, fresh.SessionID), &g2)
	if g2.Lock != "e2e/bad/after" || g2.Token != stBefore.LastToken+1 {
		t.Errorf("grant after the bad requests = %+v, want lock e2e/bad/after with token %d", g2, stBefore.LastToken+1)
	}
	mustPost(t, srv.addr, release, fmt.Sprintf(`{"sessionId":"%d","lock":"e2e/bad/after","token":"%d"}`, fresh.SessionID, g2.Token), nil)
	mustPost(t, srv.addr, keepAlive, fmt.Sprintf(`{"sessionId":"%d"}`, holder.SessionID), nil)
	mustPost(t, srv.addr, release, fmt.Sprintf(`{"sessionId":"%d","lock":%q,"token":"%d"}`, holder.SessionID, held, grant.Token), nil)
	// A put from curl may leave the fence out (an unfenced write); this
	// one is bound to the fresh session and goes when it is closed.
	mustPost(t, srv.addr, kvPut, fmt.Sprintf(`{"key":"e2e/bad/bound","value":"dg==","sessionId":"%d"}`, fresh.SessionID), nil)
	var found struct {
		Found bool `json:"found"`
	}
	mustPost(t, srv.addr, kvGet, `{"key":"e2e/bad/bound"}`, &found)
	if !found.Found {
		t.Error("a put without a fence field was not stored")
	}
	for _, id := range []uint64{holder.SessionID, other.SessionID, fresh.SessionID} {
		mustPost(t, srv.addr, closeSession, fmt.Sprintf(`{"sessionId":"%d"}`, id), nil)
	}
	var after struct {
		Found bool `json:"found"`
	}
	mustPost(t, srv.addr, kvGet, `{"key":"e2e/bad/bound"}`, &after)
	if after.Found {
		t.Error("a key bound to a closed session is still there")
	}
	var empty struct {
		Locks []any `json:"locks"`
	}
	mustPost(t, srv.addr, listLocks, `{}`, &empty)
	if len(empty.Locks) != 0 {
		t.Errorf("after releasing everything, locks = %v", empty.Locks)
	}
}
