package client

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/server"
)

// A lease is taken in one call, with a token and a safe-until counted
// from when the call was sent; a second lease of the lock fails at once
// naming the first; Renew moves the safe-until on; Release frees the
// lock, and a lease released or ended says so.
func TestLeaseRenewRelease(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()

	before := time.Now()
	l, err := c.Lease(ctx, "jobs", 10*time.Second, WithLeaseOwner("cron"), WithLeaseLockDelay(time.Second))
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if l.Lock() != "jobs" || l.Token() == 0 || l.ID() == 0 || len(l.Secret()) < 32 || l.TTL() != 10*time.Second {
		t.Fatalf("lease: lock %q, token %d, id %d, secret %q, ttl %v", l.Lock(), l.Token(), l.ID(), l.Secret(), l.TTL())
	}
	// 10 s, less 1% drift and 100 ms margin, from the time it was sent.
	safe := l.SafeUntil()
	if lo, hi := before.Add(9800*time.Millisecond), after.Add(9800*time.Millisecond); safe.Before(lo) || safe.After(hi) {
		t.Errorf("SafeUntil is %v after the call began, want 9.8s", safe.Sub(before))
	}
	locks, err := c.Locks(ctx, "jobs")
	if err != nil || len(locks) != 1 || locks[0].GetHolders()[0].GetSessionId() != l.ID() || locks[0].GetHolders()[0].GetOwner() != "cron" {
		t.Fatalf("locks after the lease: %v, %v", locks, err)
	}

	_, err = c.Lease(ctx, "jobs", 10*time.Second)
	var held *fence.LockedError
	if !errors.As(err, &held) || !errors.Is(err, fence.ErrLocked) || held.HolderSession != l.ID() || held.HolderToken != l.Token() {
		t.Fatalf("a second lease of a held lock: %v, want ErrLocked naming lease %d", err, l.ID())
	}

	time.Sleep(20 * time.Millisecond)
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.SafeUntil().After(safe) {
		t.Errorf("Renew did not move SafeUntil on from %v", safe)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if locks, err := c.Locks(ctx, "jobs"); err != nil || len(locks) != 0 {
		t.Fatalf("locks after the release: %v, %v", locks, err)
	}
	if !l.SafeUntil().IsZero() {
		t.Errorf("a released lease is safe until %v", l.SafeUntil())
	}
	expectLeaseEnded(t, ctx, l, "a released lease")
}

// expectLeaseEnded reports an error unless Renew and Release of l both
// fail with fence.ErrSessionNotFound, as for a lease that ended; what
// names the lease in the report.
func expectLeaseEnded(t *testing.T, ctx context.Context, l *Lease, what string) {
	t.Helper()
	if err := l.Renew(ctx); !errors.Is(err, fence.ErrSessionNotFound) {
		t.Errorf("Renew of %s: %v, want ErrSessionNotFound", what, err)
	}
	if err := l.Release(ctx); !errors.Is(err, fence.ErrSessionNotFound) {
		t.Errorf("Release of %s: %v, want ErrSessionNotFound", what, err)
	}
}

// A lease rebuilt from its id and secret, by another client, knows
// nothing until its first Renew, which fills in its lock and token; it
// releases as the lease itself would. A wrong secret renews nothing.
func TestResumeLease(t *testing.T) {
	srv := startServer(t, nil)
	ctx := context.Background()
	l, err := mustClient(t, srv, nil).Lease(ctx, "invoices", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := mustClient(t, srv, nil) // the next invocation
	if _, err := c.ResumeLease(0, ""); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("ResumeLease without id and secret: %v", err)
	}
	wrong, err := c.ResumeLease(l.ID(), "not-the-secret")
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.Renew(ctx); !errors.Is(err, fence.ErrSessionSecret) {
		t.Errorf("Renew with a wrong secret: %v, want ErrSessionSecret", err)
	}
	if err := wrong.Release(ctx); !errors.Is(err, fence.ErrSessionSecret) {
		t.Errorf("Release with a wrong secret: %v, want ErrSessionSecret", err)
	}

	r, err := c.ResumeLease(l.ID(), l.Secret())
	if err != nil {
		t.Fatal(err)
	}
	if r.Lock() != "" || r.Token() != 0 || !r.SafeUntil().IsZero() {
		t.Errorf("a resumed lease before Renew: lock %q, token %d, safe until %v; want nothing known", r.Lock(), r.Token(), r.SafeUntil())
	}
	sent := time.Now()
	if err := r.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if r.Lock() != "invoices" || r.Token() != l.Token() || r.TTL() != 30*time.Second || r.SafeUntil().Before(sent.Add(29*time.Second)) {
		t.Errorf("a resumed lease after Renew: lock %q, token %d, ttl %v, safe for %v", r.Lock(), r.Token(), r.TTL(), time.Until(r.SafeUntil()))
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, fence.ErrSessionNotFound) {
		t.Errorf("the first client's lease after the resumed one was released: %v, want ErrSessionNotFound", err)
	}
}

// A lease that is not renewed is expired by the leader once its TTL passes
// on the leader's clock, and the lock can be leased again; the lost
// lease's Renew and Release say it ended.
func TestLeaseExpires(t *testing.T) {
	clk := clock.NewFake()
	srv := startServer(t, func(c *server.Config) { c.Clock = clk })
	c := mustClient(t, srv, clk)
	ctx := context.Background()
	l, err := c.Lease(ctx, "jobs", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(5*time.Second*99/100 - 100*time.Millisecond); !l.SafeUntil().Equal(want) {
		t.Errorf("SafeUntil on the fake clock is %v, want %v", l.SafeUntil(), want)
	}
	clk.Advance(5 * time.Second)
	var next *Lease
	deadline := time.Now().Add(10 * time.Second)
	for {
		if next, err = c.Lease(ctx, "jobs", 5*time.Second); err == nil {
			break
		}
		if !errors.Is(err, fence.ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("leasing the lock after the first lease's TTL passed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if next.Token() <= l.Token() {
		t.Errorf("the next lease's token %d is not above %d", next.Token(), l.Token())
	}
	expectLeaseEnded(t, ctx, l, "the expired lease")
}

// A Lease whose answer a gateway lost is retried, and the retry answers
// the lease the lost attempt took: the client draws the lease's secret and
// sends it with each attempt. It was refused as locked by its own lease,
// which then held the lock out of reach until its TTL passed.
func TestLeaseAnswerLostIsRetried(t *testing.T) {
	srv := startServer(t, nil)
	target, err := url.Parse("http://" + srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int32
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if strings.HasSuffix(resp.Request.URL.Path, "/Lease") && lost.Add(1) == 1 {
			return errors.New("the gateway lost the answer") // the client is answered 502
		}
		return nil
	}
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	gw := httptest.NewServer(proxy)
	t.Cleanup(gw.Close)
	c := mustNew(t, WithEndpoints(strings.TrimPrefix(gw.URL, "http://")))
	ctx := context.Background()
	l, err := c.Lease(ctx, "lost-answer", time.Minute)
	if err != nil {
		t.Fatalf("a lease whose first answer was lost: %v", err)
	}
	if lost.Load() != 2 {
		t.Fatalf("%d Lease answers passed the gateway, want the lost one and the retry's", lost.Load())
	}
	locks, err := c.Locks(ctx, "lost-answer")
	if err != nil || len(locks) != 1 || len(locks[0].GetHolders()) != 1 || locks[0].GetHolders()[0].GetSessionId() != l.ID() || locks[0].GetHolders()[0].GetToken() != l.Token() {
		t.Fatalf("the lock is held by %v (%v), want the lease %d alone", locks, err, l.ID())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("releasing the retried lease: %v", err)
	}
}
