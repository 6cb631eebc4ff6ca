package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/rpcerr"
)

func (a *api) lease(req *fencev1.LeaseRequest) (*fencev1.LeaseResponse, error) {
	resp, err := a.locks.Lease(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, rpcerr.FromConnect(err)
	}
	return resp.Msg, nil
}

func (a *api) mustLease(req *fencev1.LeaseRequest) *fencev1.LeaseResponse {
	a.tb.Helper()
	l, err := a.lease(req)
	if err != nil {
		a.tb.Fatalf("Lease(%v): %v", req, err)
	}
	return l
}

func (a *api) renewLease(id uint64, secret string) (*fencev1.RenewLeaseResponse, error) {
	resp, err := a.locks.RenewLease(context.Background(), connect.NewRequest(&fencev1.RenewLeaseRequest{LeaseId: id, LeaseSecret: secret}))
	if err != nil {
		return nil, rpcerr.FromConnect(err)
	}
	return resp.Msg, nil
}

func (a *api) releaseLease(id uint64, secret string) (bool, error) {
	resp, err := a.locks.ReleaseLease(context.Background(), connect.NewRequest(&fencev1.ReleaseLeaseRequest{LeaseId: id, LeaseSecret: secret}))
	if err != nil {
		return false, rpcerr.FromConnect(err)
	}
	return resp.Msg.GetReleased(), nil
}

// mustHold checks that the lock's one holder is session with token.
func mustHold(t *testing.T, a *api, lock string, session, token uint64) {
	t.Helper()
	h := a.lock(lock).GetHolders()
	if len(h) != 1 || h[0].GetSessionId() != session || h[0].GetToken() != token {
		t.Fatalf("lock %s is held by %v, want session %d with token %d", lock, h, session, token)
	}
}

// A lease is taken, renewed and released over HTTP with JSON, as curl
// does it: the answer carries the token, the lease's id and secret and
// its TTL; the renewal names the lock and token; the release frees the
// lock at once, and a second release answers that there was nothing left.
func TestLeaseOverHTTPJSON(t *testing.T) {
	s, a := startWithAPI(t, nil)
	post := func(procedure, body string) map[string]any {
		t.Helper()
		resp, text := postJSON(t, s.Addr(), "LockService/"+procedure, body)
		var out map[string]any
		if err := json.Unmarshal([]byte(text), &out); resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("%s %s: %d %s", procedure, body, resp.StatusCode, text)
		}
		return out
	}
	got := post("Lease", `{"lock":"nightly","ttl":"30s","owner":"backup.sh"}`)
	id, secret, token := got["leaseId"].(string), got["leaseSecret"].(string), got["token"].(string)
	if got["lock"] != "nightly" || got["ttl"] != "30s" || id == "" || token == "" || len(secret) < 32 {
		t.Fatalf("Lease answered %v, want the lock, a token, a lease id, a secret and ttl 30s", got)
	}
	l := a.lock("nightly")
	if len(l.GetHolders()) != 1 || jsonUint64(l.GetHolders()[0].GetSessionId()) != id || l.GetHolders()[0].GetOwner() != "backup.sh" {
		t.Fatalf("after Lease the lock is %v, want it held by lease %s, owner backup.sh", l, id)
	}

	lease := `{"leaseId":"` + id + `","leaseSecret":"` + secret + `"}`
	if got := post("RenewLease", lease); got["lock"] != "nightly" || got["token"] != token || got["ttl"] != "30s" {
		t.Errorf("RenewLease answered %v, want lock nightly, token %s, ttl 30s", got, token)
	}
	if got := post("ReleaseLease", lease); got["released"] != true {
		t.Errorf("ReleaseLease answered %v, want released true", got)
	}
	if h := a.lock("nightly").GetHolders(); len(h) != 0 {
		t.Errorf("after ReleaseLease the lock is held by %v", h)
	}
	if got := post("ReleaseLease", lease); got["released"] != false {
		t.Errorf("a second ReleaseLease answered %v, want released false", got)
	}
	resp, text := postJSON(t, s.Addr(), "LockService/RenewLease", lease)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(text, "lease "+id+" has expired or was released") {
		t.Errorf("RenewLease of a released lease: %d %s, want 404 saying the lease is gone", resp.StatusCode, text)
	}
}

func jsonUint64(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// A lease of a held lock fails at once with ErrLocked naming the holder,
// and leaves no session behind. So does a lease whose acquire fails after
// its session was made (here a limit on locks): the session is closed.
func TestLeaseOfHeldLockLeavesNothing(t *testing.T) {
	s, a := startWithAPI(t, func(c *Config) { c.MaxLocks = 2 })
	holder := a.session(time.Hour)
	token := a.mustAcquire(holder, "held")
	before := sessionCount(t, s)

	start := time.Now()
	_, err := a.lease(&fencev1.LeaseRequest{Lock: "held", Ttl: durationpb.New(30 * time.Second)})
	var locked *fence.LockedError
	if !errors.As(err, &locked) || locked.HolderSession != holder || locked.HolderToken != token {
		t.Fatalf("Lease of a held lock: %v, want ErrLocked naming session %d, token %d", err, holder, token)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Lease of a held lock took %v, want an answer at once", took)
	}
	if after := sessionCount(t, s); after != before {
		t.Errorf("a refused Lease left a session: %d sessions before, %d after", before, after)
	}

	// Waiters ahead refuse a lease too: a lease never jumps a queue.
	waiter := a.session(time.Hour)
	a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: waiter, Lock: "held"})
	before = sessionCount(t, s)
	if _, err := a.lease(&fencev1.LeaseRequest{Lock: "held"}); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("Lease of a lock with a waiter: %v, want ErrLocked", err)
	}

	// The lock looks free to the check before the session is made; the
	// acquire fails on the limit of 2 locks, and the session goes with it.
	a.mustAcquire(holder, "other")
	if _, err := a.lease(&fencev1.LeaseRequest{Lock: "third"}); !errors.Is(err, fence.ErrLimit) {
		t.Fatalf("Lease beyond the limit on locks: %v, want ErrLimit", err)
	}
	if after := sessionCount(t, s); after != before {
		t.Errorf("a Lease whose acquire failed left a session: %d sessions before, %d after", before, after)
	}
}

// Leases of one free lock asked for at once: one is granted, every other
// fails with ErrLocked, and only the granted one's session is left (those
// that passed the look before the grant made a session, and closed it).
func TestConcurrentLeasesLeaveOneSession(t *testing.T) {
	s, a := startWithAPI(t, nil)
	before := numSessions(s)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := a.lease(&fencev1.LeaseRequest{Lock: "race", Ttl: durationpb.New(time.Minute)})
			errs <- err
		}()
	}
	granted := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			granted++
		case !errors.Is(err, fence.ErrLocked):
			t.Errorf("a concurrent Lease failed with %v, want ErrLocked", err)
		}
	}
	if granted != 1 {
		t.Errorf("%d of %d concurrent Leases were granted, want 1", granted, n)
	}
	if after := numSessions(s); after != before+1 {
		t.Errorf("%d sessions after %d concurrent Leases (%d before), want one more", after, n, before)
	}
	var made uint64
	s.fsm.Read(func(st *fsm.State) { made = st.Snapshot().GetLastSessionId() })
	t.Logf("%d of the refused Leases made a session and closed it", made-1)
}

// A lease that is not renewed is expired by the leader, on its clock, and
// its lock goes to the next waiter; a renewal gives it a full TTL from
// the renewal. A renewal or release of the expired lease says it is gone.
func TestLeaseExpiresUnlessRenewed(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	l := a.mustLease(&fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(5 * time.Second)})
	waiter := a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: a.session(time.Hour), Lock: "l"})

	clk.Advance(3 * time.Second)
	r, err := a.renewLease(l.GetLeaseId(), l.GetLeaseSecret())
	if err != nil || r.GetTtl().AsDuration() != 5*time.Second || r.GetLock() != "l" || r.GetToken() != l.GetToken() {
		t.Fatalf("RenewLease 3 s in: %v, %v; want ttl 5s, lock l, token %d", r, err, l.GetToken())
	}
	clk.Advance(4 * time.Second) // 7 s after the lease, 4 s after its renewal
	if waiter.returned() {
		t.Fatal("the waiter was granted a lease renewed 4 s ago with a TTL of 5 s")
	}
	mustHold(t, a, "l", l.GetLeaseId(), l.GetToken())
	clk.Advance(time.Second)
	token, err := waiter.result(t)
	if err != nil || token <= l.GetToken() {
		t.Fatalf("the waiter after the lease expired: token %d, %v; want a token above %d", token, err, l.GetToken())
	}
	if _, err := a.renewLease(l.GetLeaseId(), l.GetLeaseSecret()); !errors.Is(err, fence.ErrSessionNotFound) || !strings.Contains(err.Error(), "take a new lease") {
		t.Errorf("RenewLease of an expired lease: %v, want ErrSessionNotFound saying to take a new lease", err)
	}
	if released, err := a.releaseLease(l.GetLeaseId(), l.GetLeaseSecret()); err != nil || released {
		t.Errorf("ReleaseLease of an expired lease: %v, %v; want false, nil", released, err)
	}
}

// A lease taken with a lock-delay that expires holds its lock back for
// the delay, as any expired grant does; one released is handed on at once.
func TestLeaseLockDelay(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	req := &fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(5 * time.Second), LockDelay: durationpb.New(10 * time.Second)}

	l := a.mustLease(req)
	waiter := a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: a.session(time.Hour), Lock: "l"})
	clk.Advance(5 * time.Second)
	mustHoldBack(t, s, clk, a, waiter) // 10 s of delay after the expiry
	mustRecord(t, s, l.GetLeaseId(), "expired")

	req.Lock = "m"
	l = a.mustLease(req)
	waiter = a.acquireQueued(context.Background(), "the waiter", &fencev1.AcquireRequest{SessionId: a.session(time.Hour), Lock: "m"})
	if released, err := a.releaseLease(l.GetLeaseId(), l.GetLeaseSecret()); err != nil || !released {
		t.Fatalf("ReleaseLease: %v, %v", released, err)
	}
	if _, err := waiter.result(t); err != nil {
		t.Fatalf("the waiter after the lease was released: %v", err)
	}
	if a.lock("m").GetDelayed() {
		t.Error("a released lease put its lock under lock-delay")
	}
}

// A wrong or missing secret renews and releases nothing, and is refused
// with ErrSessionSecret in a lease's words.
func TestLeaseWrongSecret(t *testing.T) {
	s, clk := startOnFakeClock(t)
	a := newAPI(t, s)
	l := a.mustLease(&fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(time.Minute)})
	clk.Advance(20 * time.Second)
	for _, secret := range []string{"wrong", "", l.GetLeaseSecret() + "x"} {
		if _, err := a.renewLease(l.GetLeaseId(), secret); !errors.Is(err, fence.ErrSessionSecret) || !strings.Contains(err.Error(), "lease_secret") {
			t.Errorf("RenewLease with secret %q: %v, want ErrSessionSecret naming lease_secret", secret, err)
		}
		if _, err := a.releaseLease(l.GetLeaseId(), secret); !errors.Is(err, fence.ErrSessionSecret) {
			t.Errorf("ReleaseLease with secret %q: %v, want ErrSessionSecret", secret, err)
		}
	}
	mustHold(t, a, "l", l.GetLeaseId(), l.GetToken())
	var expiresIn time.Duration
	resp, err := a.sessions.ListSessions(context.Background(), connect.NewRequest(&fencev1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, si := range resp.Msg.GetSessions() {
		if si.GetSessionId() == l.GetLeaseId() {
			expiresIn = si.GetExpiresIn().AsDuration()
		}
	}
	if expiresIn != 40*time.Second {
		t.Errorf("the lease expires in %v after refused renewals 20 s into its minute, want 40s: they renewed it", expiresIn)
	}
}

// Every field is checked before anything is made: a bad TTL, lock name,
// lock-delay or owner is refused with InvalidArgument naming it, and
// leaves no session.
func TestLeaseRefusesBadArguments(t *testing.T) {
	s, a := startWithAPI(t, nil)
	before := sessionCount(t, s)
	for _, tc := range []struct {
		name string
		req  *fencev1.LeaseRequest
		want string
	}{
		{"ttl too short", &fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(500 * time.Millisecond)}, "ttl 500ms is outside the allowed 1s to 1h0m0s"},
		{"ttl too long", &fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(2 * time.Hour)}, "ttl 2h0m0s is outside"},
		{"ttl negative", &fencev1.LeaseRequest{Lock: "l", Ttl: durationpb.New(-time.Second)}, "ttl -1s is negative"},
		{"no name", &fencev1.LeaseRequest{Ttl: durationpb.New(time.Minute)}, "lock name is empty"},
		{"blank name", &fencev1.LeaseRequest{Lock: "  "}, "lock name is only whitespace"},
		{"control character", &fencev1.LeaseRequest{Lock: "a\nb"}, "lock name has control character U+000A"},
		{"long name", &fencev1.LeaseRequest{Lock: strings.Repeat("x", 513)}, "lock name is 513 bytes, over the limit of 512"},
		{"lock-delay too long", &fencev1.LeaseRequest{Lock: "l", LockDelay: durationpb.New(2 * time.Minute)}, "lock_delay 2m0s is over the limit"},
		{"owner too long", &fencev1.LeaseRequest{Lock: "l", Owner: strings.Repeat("o", 257)}, "owner is 257 bytes"},
		{"secret too short", &fencev1.LeaseRequest{Lock: "l", LeaseSecret: "short"}, "lease_secret is 5 characters; want 22 to 128"},
		{"secret too long", &fencev1.LeaseRequest{Lock: "l", LeaseSecret: strings.Repeat("s", 129)}, "lease_secret is 129 characters"},
		{"secret of other characters", &fencev1.LeaseRequest{Lock: "l", LeaseSecret: strings.Repeat("s", 21) + "+"}, `lease_secret has '+' at byte 21`},
	} {
		_, err := a.lease(tc.req)
		if !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := a.renewLease(0, "x"); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), "lease_id is missing") {
		t.Errorf("RenewLease without a lease_id: %v", err)
	}
	if _, err := a.releaseLease(0, "x"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("ReleaseLease without a lease_id: %v", err)
	}
	if after := sessionCount(t, s); after != before {
		t.Errorf("refused Leases left sessions: %d before, %d after", before, after)
	}
	if l := a.lock("l"); len(l.GetHolders()) != 0 {
		t.Errorf("refused Leases took the lock: %v", l)
	}
}

// With auth on, a lease needs lock write on its name, as CreateSession
// and Acquire together do; one refused makes nothing. Its renewal and
// release need what a keepalive and a close need, and its secret.
func TestLeaseNeedsLockWrite(t *testing.T) {
	s := startTestServer(t, nil)
	_, _, token := enableAuthWithUser(t, s, "jobs", perm(client.PermLock, client.Write, "jobs/"))
	bearer := []string{"Authorization", "Bearer " + token}
	before := numSessions(s)

	resp, text := postJSON(t, s.Addr(), "LockService/Lease", `{"lock":"other"}`, bearer...)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(text, "other") {
		t.Errorf("Lease outside the user's prefix: %d %s, want 403", resp.StatusCode, text)
	}
	if after := numSessions(s); after != before {
		t.Errorf("a refused Lease left a session: %d before, %d after", before, after)
	}
	resp, text = postJSON(t, s.Addr(), "LockService/Lease", `{"lock":"jobs/nightly"}`, bearer...)
	var l struct{ LeaseID, LeaseSecret string }
	if err := json.Unmarshal([]byte(text), &l); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("Lease inside the user's prefix: %d %s", resp.StatusCode, text)
	}
	lease := `{"leaseId":"` + l.LeaseID + `","leaseSecret":"` + l.LeaseSecret + `"}`
	for _, procedure := range []string{"RenewLease", "ReleaseLease"} {
		if resp, text := postJSON(t, s.Addr(), "LockService/"+procedure, lease); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without a credential: %d %s, want 401", procedure, resp.StatusCode, text)
		}
		if resp, text := postJSON(t, s.Addr(), "LockService/"+procedure, lease, bearer...); resp.StatusCode != http.StatusOK {
			t.Errorf("%s by the user: %d %s", procedure, resp.StatusCode, text)
		}
	}
	if after := numSessions(s); after != before {
		t.Errorf("a released lease left a session: %d before, %d after", before, after)
	}
}

// numSessions is the number of sessions in s's state.
func numSessions(s *Server) int {
	var n int
	s.fsm.Read(func(st *fsm.State) { n = st.NumSessions() })
	return n
}

// A Lease whose caller drew its secret is safe to retry: a retry (an
// attempt whose first answer was lost) answers the lease the first attempt
// took, where one without a secret is refused as locked by its own lease.
// Once the lease has ended, a retry says so, or that the lock is held.
func TestLeaseWithTheCallersSecretIsSafeToRetry(t *testing.T) {
	s, a := startWithAPI(t, nil)
	req := &fencev1.LeaseRequest{Lock: "retried", Ttl: durationpb.New(time.Minute), LeaseSecret: "c2VjcmV0IGRyYXduIGJ5IHRoZSBjYWxsZXI"}
	first := a.mustLease(req)
	before := sessionCount(t, s)
	again := a.mustLease(req)
	if again.GetLeaseId() != first.GetLeaseId() || again.GetToken() != first.GetToken() || again.GetLeaseSecret() != req.GetLeaseSecret() ||
		again.GetTtl().AsDuration() != time.Minute {
		t.Fatalf("a retry answered %v, want the first attempt's lease %v with the caller's secret", again, first)
	}
	mustHold(t, a, "retried", first.GetLeaseId(), first.GetToken())
	if after := sessionCount(t, s); after != before {
		t.Errorf("a retry made a session: %d before, %d after", before, after)
	}
	if _, err := a.renewLease(first.GetLeaseId(), req.GetLeaseSecret()); err != nil {
		t.Fatalf("renewing with the caller's secret: %v", err)
	}
	if _, err := a.lease(&fencev1.LeaseRequest{Lock: "retried", LeaseSecret: "YW5vdGhlciBjYWxsZXIncyBzZWNyZXQ"}); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("a lease with another secret: %v, want ErrLocked", err)
	}
	if _, err := a.lease(&fencev1.LeaseRequest{Lock: "retried"}); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("a lease without a secret: %v, want ErrLocked", err)
	}

	if released, err := a.releaseLease(first.GetLeaseId(), req.GetLeaseSecret()); err != nil || !released {
		t.Fatalf("releasing: %v, %v", released, err)
	}
	if _, err := a.lease(req); !errors.Is(err, fence.ErrSessionNotFound) || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("a retry after the release: %v, want ErrSessionNotFound saying the lease ended", err)
	}
	other := a.mustLease(&fencev1.LeaseRequest{Lock: "retried"})
	if _, err := a.lease(req); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("a retry once another holds the lock: %v, want ErrLocked", err)
	}
	mustHold(t, a, "retried", other.GetLeaseId(), other.GetToken())
}

// A retry finds its lease when its first attempt's caller went away (the
// attempt goes on: the caller knows the secret), when the state no longer
// remembers the attempt's key, and it renews the lease, so that the TTL it
// answers counts from the retry. The same secret on another lock is
// refused, and the lease it names is left as it was.
func TestLeaseRetriesFindTheirLease(t *testing.T) {
	s, a := startWithAPI(t, nil)
	secret := func(n int) string { return fmt.Sprintf("c2VjcmV0LWRyYXduLWJ5LXRoZS1jYWxsZXI-%d", n) }

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	req := &fencev1.LeaseRequest{Lock: "caller-gone", Ttl: durationpb.New(time.Minute), LeaseSecret: secret(1)}
	_, _ = s.lease(gone, req)
	first := a.mustLease(req)
	mustHold(t, a, "caller-gone", first.GetLeaseId(), first.GetToken())
	_, err := a.lease(&fencev1.LeaseRequest{Lock: "another", LeaseSecret: secret(1)})
	if !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), `holds lock "caller-gone", not "another"`) {
		t.Fatalf("a lease of another lock with a lease's secret: %v, want ErrInvalidArgument", err)
	}
	mustHold(t, a, "caller-gone", first.GetLeaseId(), first.GetToken())
	if l := a.lock("another"); len(l.GetHolders()) != 0 {
		t.Fatalf("the refused lease took the lock: %v", l)
	}

	req = &fencev1.LeaseRequest{Lock: "forgotten", Ttl: durationpb.New(time.Minute), LeaseSecret: secret(2)}
	kept := a.mustLease(req)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < fsm.MaxIdempotencyKeys; i += 16 {
				if _, err := s.put(context.Background(), &fencev1.PutRequest{Key: "k", Value: []byte("v")}, fmt.Sprintf("put-%d", i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	s.fsm.Read(func(st *fsm.State) {
		if _, ok := st.Repeated(leaseKey(req.GetLeaseSecret())); ok {
			t.Fatal("the state still remembers the lease's key")
		}
	})
	if again := a.mustLease(req); again.GetLeaseId() != kept.GetLeaseId() || again.GetToken() != kept.GetToken() {
		t.Fatalf("a retry after its key was forgotten answered %v, want lease %d", again, kept.GetLeaseId())
	}

	req = &fencev1.LeaseRequest{Lock: "renewed", Ttl: durationpb.New(time.Second), LeaseSecret: secret(3)}
	short := a.mustLease(req)
	time.Sleep(700 * time.Millisecond)
	retried := time.Now()
	if again := a.mustLease(req); again.GetLeaseId() != short.GetLeaseId() || again.GetTtl().AsDuration() != time.Second {
		t.Fatalf("a retry answered %v, want lease %d for 1s", again, short.GetLeaseId())
	}
	time.Sleep(time.Until(retried.Add(900 * time.Millisecond)))
	s.fsm.Read(func(st *fsm.State) {
		if _, live := st.Session(short.GetLeaseId()); !live {
			t.Fatal("the lease expired within the TTL its retry answered: the retry did not renew it")
		}
	})

}
