package k8sleader_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/integrations/k8sleader"
)

func newLock(t *testing.T, node *fencetest.Node, name, identity string) *k8sleader.Lock {
	t.Helper()
	l, err := k8sleader.New(node.Client(), name, identity)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// record is what client-go writes when identity takes or renews the
// lease for seconds.
func record(identity string, seconds int) resourcelock.LeaderElectionRecord {
	now := metav1.Now()
	return resourcelock.LeaderElectionRecord{HolderIdentity: identity, LeaseDurationSeconds: seconds, AcquireTime: now, RenewTime: now}
}

func mustGet(t *testing.T, l *k8sleader.Lock) *resourcelock.LeaderElectionRecord {
	t.Helper()
	rec, raw, err := l.Get(context.Background())
	if err != nil {
		t.Fatalf("%s: Get: %v", l.Identity(), err)
	}
	if len(raw) == 0 {
		t.Fatalf("%s: Get returned no raw record", l.Identity())
	}
	return rec
}

// mustCreate makes l the first leader of its election, as client-go does:
// a Get that finds no record, then a Create of l's record for seconds.
func mustCreate(t *testing.T, l *k8sleader.Lock, seconds int) {
	t.Helper()
	if _, _, err := l.Get(context.Background()); !apierrors.IsNotFound(err) {
		t.Fatalf("%s: Get of no record: %v, want NotFound", l.Identity(), err)
	}
	if err := l.Create(context.Background(), record(l.Identity(), seconds)); err != nil {
		t.Fatalf("%s: Create: %v", l.Identity(), err)
	}
}

// The record's life as client-go drives it, call by call: NotFound,
// Create, a second candidate refused while the lease lives, a renewal
// under the same token, a release that names no holder, a Conflict when
// the record moved since Get, and a takeover with a higher token.
func TestLockCalls(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	a, b := newLock(t, node, "ctrl", "a"), newLock(t, node, "ctrl", "b")

	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of no record: %v, want NotFound", err)
	}
	if err := a.Update(ctx, record("a", 10)); !apierrors.IsNotFound(err) {
		t.Fatalf("Update of no record: %v, want NotFound", err)
	}
	if a.Token() != 0 || a.Context().Err() == nil || !errors.Is(context.Cause(a.Context()), k8sleader.ErrNotLeading) {
		t.Fatalf("before leading: token %d, context cause %v", a.Token(), context.Cause(a.Context()))
	}
	if err := a.Create(ctx, record("a", 10)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	tokenA := a.Token()
	if tokenA == 0 || a.Context().Err() != nil || time.Until(a.SafeUntil()) < 5*time.Second {
		t.Fatalf("after Create: token %d, context %v, safe for %v", tokenA, a.Context().Err(), time.Until(a.SafeUntil()))
	}

	// b reads a's record, and cannot take it while a's lease lives,
	// whatever the record's times say.
	if got := mustGet(t, b); got.HolderIdentity != "a" {
		t.Fatalf("b read holder %q, want a", got.HolderIdentity)
	}
	if err := b.Update(ctx, record("b", 10)); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("b's Update while a leads: %v, want fence.ErrLocked", err)
	}
	if err := b.Create(ctx, record("b", 10)); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("b's Create while a leads: %v, want fence.ErrLocked", err)
	}
	if b.Token() != 0 {
		t.Fatalf("b holds token %d after being refused", b.Token())
	}
	if err := b.Update(ctx, record("", 1)); !errors.Is(err, k8sleader.ErrNotLeading) {
		t.Fatalf("b's release without a term: %v, want ErrNotLeading", err)
	}

	// a renews on client-go's fast path (no Get): the same term.
	term := a.Context()
	if err := a.Update(ctx, record("a", 10)); err != nil {
		t.Fatalf("a's renewal: %v", err)
	}
	if a.Token() != tokenA || a.Context() != term {
		t.Fatalf("a's renewal changed the term: token %d, want %d", a.Token(), tokenA)
	}

	// a releases; b's Update with the revision it read before fails as a
	// Conflict, and leaves b holding nothing.
	if err := a.Update(ctx, record("", 1)); err != nil {
		t.Fatalf("a's release: %v", err)
	}
	if a.Token() != 0 || !errors.Is(context.Cause(term), k8sleader.ErrNotLeading) {
		t.Fatalf("after the release: token %d, term's cause %v", a.Token(), context.Cause(term))
	}
	if err := b.Update(ctx, record("b", 10)); !apierrors.IsConflict(err) {
		t.Fatalf("b's Update of a record that moved: %v, want Conflict", err)
	}
	if b.Token() != 0 {
		t.Fatalf("b holds token %d after a Conflict", b.Token())
	}
	if got := mustGet(t, b); got.HolderIdentity != "" {
		t.Fatalf("the released record names %q", got.HolderIdentity)
	}
	if err := b.Update(ctx, record("b", 10)); err != nil {
		t.Fatalf("b's Update after the release: %v", err)
	}
	if b.Token() <= tokenA {
		t.Fatalf("b's token %d, want more than a's %d", b.Token(), tokenA)
	}
	if err := a.Create(ctx, record("a", 10)); !errors.Is(err, fence.ErrLocked) {
		t.Fatalf("a's Create while b leads: %v, want fence.ErrLocked", err)
	}

	// A write of a's term is refused once b's term wrote.
	if _, err := node.Client().KV().Put(ctx, "work", []byte("b"), client.FencedBy(b.Name(), b.Token())); err != nil {
		t.Fatal(err)
	}
	_, err := node.Client().KV().Put(ctx, "work", []byte("a"), client.FencedBy(a.Name(), tokenA))
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) || stale.Token != tokenA || stale.Highest != b.Token() {
		t.Fatalf("a's late write: %v, want a stale token %d < %d", err, tokenA, b.Token())
	}
}

// A term whose lease lapses ends by itself (its context, at SafeUntil),
// its next renewal fails with ErrLeaseLost and releases the lease for
// another candidate, and the Lock takes no new lease until the lease's
// TTL and a second have passed, then a new term with a higher token.
func TestLostLease(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	a, b := newLock(t, node, "ctrl", "a"), newLock(t, node, "ctrl", "b")
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	k8sleader.SetNow(a, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	})
	// A TTL of 2s: short, and still long enough for Create's two calls
	// (the lease, then the record written under it) on a loaded machine.
	mustCreate(t, a, 2)
	first := a.Token()
	term, stop := a.WithTerm(ctx)
	defer stop()
	if lock, token, ok := fencing.TokenFrom(term); !ok || lock != "ctrl" || token != first {
		t.Fatalf("WithTerm carries %q, %d, %v; want ctrl, %d", lock, token, ok, first)
	}

	// No renewal: the term's context ends at SafeUntil, within the TTL.
	select {
	case <-term.Done():
	case <-time.After(6 * time.Second):
		t.Fatal("the term's context outlived its lease's 2s TTL by 4s")
	}
	if !errors.Is(context.Cause(term), k8sleader.ErrLeaseLost) {
		t.Fatalf("the term ended with %v, want ErrLeaseLost", context.Cause(term))
	}
	mu.Lock()
	now = time.Now()
	mu.Unlock()
	if err := a.Update(ctx, record("a", 2)); !errors.Is(err, k8sleader.ErrLeaseLost) {
		t.Fatalf("a's renewal after SafeUntil: %v, want ErrLeaseLost", err)
	}
	if err := a.Update(ctx, record("a", 2)); !errors.Is(err, k8sleader.ErrLeaseLost) {
		t.Fatalf("a's next Update, at once: %v, want ErrLeaseLost (no new lease yet)", err)
	}
	if a.Token() != 0 {
		t.Fatalf("a holds token %d after losing its lease", a.Token())
	}

	// The lease was given up, so b takes over now, not a TTL later.
	mustGet(t, b)
	if err := b.Update(ctx, record("b", 2)); err != nil {
		t.Fatalf("b's takeover: %v", err)
	}
	second := b.Token()
	if err := b.Update(ctx, record("", 1)); err != nil {
		t.Fatal(err)
	}

	// Past the TTL and a second, a may lead again, under a new token.
	mu.Lock()
	now = now.Add(3*time.Second + time.Millisecond)
	mu.Unlock()
	mustGet(t, a)
	if err := a.Update(ctx, record("a", 2)); err != nil {
		t.Fatalf("a's Update after the wait: %v", err)
	}
	if a.Token() <= second {
		t.Fatalf("a's new token %d, want more than %d", a.Token(), second)
	}
}

// fence itself refuses the record write of a term whose lease is gone:
// here a's lease is revoked and another takes the fence lock before
// writing anything, and a's release, at the record's current revision,
// would otherwise blank the record under the new holder.
func TestStaleRecordWriteRefused(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	c := node.Client()
	a := newLock(t, node, "ctrl", "a")
	mustCreate(t, a, 10)
	sessions, err := c.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sessions {
		if s.GetOwner() == "a" {
			if err := c.RevokeSession(ctx, s.GetSessionId()); err != nil {
				t.Fatal(err)
			}
		}
	}
	intruder, err := c.Lease(ctx, "ctrl", 10*time.Second)
	if err != nil {
		t.Fatalf("the fence lock after a's lease was revoked: %v", err)
	}
	err = a.Update(ctx, record("", 1))
	if !errors.Is(err, k8sleader.ErrLeaseLost) || !errors.Is(err, fence.ErrNotHolder) {
		t.Fatalf("a's release after losing its lease: %v, want ErrLeaseLost and fence.ErrNotHolder", err)
	}
	if rec := readRecord(t, c, "ctrl"); rec.HolderIdentity != "a" {
		t.Fatalf("the record names %q after a refused write, want a's record untouched", rec.HolderIdentity)
	}
	if err := intruder.Release(ctx); err != nil {
		t.Fatalf("the new holder's lease after a's refused write: %v", err)
	}
}

// A term whose SafeUntil passes while the calls that take or renew it
// are on their way is lost when they return, even though they succeeded:
// its context has ended (or is about to), so the elector must not lead it.
// Here the lease's safety margin leaves it no safe time at all.
func TestTermOverBeforeItsCallsReturn(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	a, err := k8sleader.New(node.Client(), "ctrl", "a", k8sleader.WithLeaseOptions(client.WithLeaseSafety(0.5, time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := a.Create(ctx, record("a", 2)); !errors.Is(err, k8sleader.ErrLeaseLost) {
		t.Fatalf("Create of a term safe for no time: %v, want ErrLeaseLost", err)
	}
	if a.Token() != 0 || a.Context().Err() == nil {
		t.Fatalf("after the lost Create: token %d, context %v", a.Token(), a.Context().Err())
	}
	b := newLock(t, node, "ctrl", "b")
	if got := mustGet(t, b); got.HolderIdentity != "a" {
		t.Fatalf("the record names %q, want a (its write went through)", got.HolderIdentity)
	}
	if err := b.Update(ctx, record("b", 2)); err != nil {
		t.Fatalf("b's Update after a gave its lease up: %v", err)
	}
}

func TestNewRefusesMissingParts(t *testing.T) {
	c := fencetest.Start(t).Client()
	for _, tc := range []struct {
		c              *client.Client
		name, identity string
	}{{nil, "n", "i"}, {c, "", "i"}, {c, "n", ""}} {
		if _, err := k8sleader.New(tc.c, tc.name, tc.identity); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("New(%v, %q, %q): %v, want ErrInvalidArgument", tc.c != nil, tc.name, tc.identity, err)
		}
	}
}

// A renewal whose caller gave up (client-go cancels the elector's context
// while its renewal is on the way) may still be applied after the release
// that follows has read the record: the release then finds the record
// moved. client-go retries a release on Conflict, and the retry must still
// release: the term must not be ended by the attempt that did not write,
// or the record keeps naming the leader for its whole lease duration and
// the next candidate waits it out (seen as TestReleaseOnCancelHandsOverAtOnce
// failing under load).
func TestReleaseAfterALateRenewalLands(t *testing.T) {
	node := fencetest.Start(t)
	ctx := context.Background()
	c := node.Client()
	a := newLock(t, node, "ctrl", "a")
	mustCreate(t, a, 30)
	token := a.Token()
	mustGet(t, a) // client-go's release reads the record first

	// a's own renewal, abandoned by its caller, lands now: fenced by a's token.
	late, err := json.Marshal(record("a", 30))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "k8sleader/ctrl", late, client.FencedBy("ctrl", token), client.Strict()); err != nil {
		t.Fatal(err)
	}

	// client-go's tryRelease: Update naming no holder; on Conflict, Get and again.
	err = a.Update(ctx, record("", 1))
	if apierrors.IsConflict(err) {
		mustGet(t, a)
		err = a.Update(ctx, record("", 1))
	}
	if err != nil {
		t.Fatalf("release after a late renewal: %v", err)
	}
	if rec := readRecord(t, c, "ctrl"); rec.HolderIdentity != "" {
		t.Fatalf("the record names %q after the release, want no holder", rec.HolderIdentity)
	}
	if a.Token() != 0 || !errors.Is(context.Cause(a.Context()), k8sleader.ErrNotLeading) {
		t.Fatalf("after the release: token %d, context cause %v", a.Token(), context.Cause(a.Context()))
	}
	b := newLock(t, node, "ctrl", "b")
	mustGet(t, b)
	if err := b.Update(ctx, record("b", 30)); err != nil {
		t.Fatalf("b taking over at once after a's release: %v", err)
	}
	if b.Token() <= token {
		t.Fatalf("b's token %d, want more than a's %d", b.Token(), token)
	}
}
