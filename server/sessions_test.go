package server

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/clock"
)

// expiryRecorder is a tracker's expire function that records each call,
// and whether two ever ran at once.
type expiryRecorder struct {
	mu         sync.Mutex
	calls      [][]uint64
	running    atomic.Int32
	overlapped atomic.Bool
	got        chan struct{}
}

func newExpiryRecorder() *expiryRecorder { return &expiryRecorder{got: make(chan struct{}, 1<<16)} }

func (r *expiryRecorder) expire(ids []uint64) error {
	if r.running.Add(1) > 1 {
		r.overlapped.Store(true)
	}
	defer r.running.Add(-1)
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(ids))
	r.mu.Unlock()
	r.got <- struct{}{}
	return nil
}

// expired waits until n sessions in all were proposed for expiry and
// returns them, sorted.
func (r *expiryRecorder) expired(t *testing.T, n int) []uint64 {
	t.Helper()
	for {
		r.mu.Lock()
		var all []uint64
		for _, c := range r.calls {
			all = append(all, c...)
		}
		r.mu.Unlock()
		if len(all) >= n {
			slices.Sort(all)
			return all
		}
		select {
		case <-r.got:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d sessions proposed for expiry, want %d", len(all), n)
		}
	}
}

func newTestTracker(t *testing.T) (*sessionTracker, *clock.Fake, *expiryRecorder) {
	c := clock.NewFake()
	rec := newExpiryRecorder()
	tr := newSessionTracker(c, nil, rec.expire)
	t.Cleanup(tr.stop)
	tr.becomeLeader()
	return tr, c, rec
}

// queued returns the length of the tracker's queue.
func (t *sessionTracker) queued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue)
}

// Keepalives move a session's deadline without queueing anything: many
// sessions renewed many times keep one queue entry each.
func TestTrackerQueuesOneEntryPerSession(t *testing.T) {
	tr, c, _ := newTestTracker(t)
	const sessions = 1000
	for id := range uint64(sessions) {
		tr.created(id+1, 10*time.Second)
	}
	for range 20 {
		c.Advance(time.Second)
		for id := range uint64(sessions) {
			if _, err := tr.keepAlive(id + 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := tr.queued(); n != sessions {
		t.Fatalf("%d sessions renewed 20 times left %d queue entries, want %d", sessions, n, sessions)
	}
}

// A session renewed before its first deadline expires at its new one, and
// one nobody renews at its first; neither earlier.
func TestTrackerExpiresAtTheRenewedDeadline(t *testing.T) {
	tr, c, rec := newTestTracker(t)
	tr.created(1, 10*time.Second)
	tr.created(2, 10*time.Second)
	c.WaitForTimers(1)
	c.Advance(6 * time.Second)
	if _, err := tr.keepAlive(1); err != nil {
		t.Fatal(err)
	}
	c.Advance(4 * time.Second) // 10 s: session 2 is due
	if got := rec.expired(t, 1); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("at 10 s expired %v, want [2]", got)
	}
	// The tracker rearms its timer for session 1's entry, put back at 16 s.
	c.WaitForTimers(1)
	c.Advance(5 * time.Second) // 15 s
	if left, ok := tr.expiresIn(1); !ok || left != time.Second {
		t.Fatalf("session 1 expires in %v (%v) at 15 s, want 1s", left, ok)
	}
	c.WaitForTimers(1)
	c.Advance(time.Second) // 16 s
	if got := rec.expired(t, 2); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("at 16 s expired %v, want [1 2]", got)
	}
}

// A storm of expiries is proposed in commands of at most maxExpireIDs
// sessions, one at a time, every session once.
func TestTrackerExpiresAStormInBoundedCommands(t *testing.T) {
	tr, c, rec := newTestTracker(t)
	const sessions = 10*maxExpireIDs + 7
	for id := range uint64(sessions) {
		tr.created(id+1, time.Second)
	}
	c.WaitForTimers(1)
	c.Advance(time.Second)
	got := rec.expired(t, sessions)
	if len(got) != sessions || got[0] != 1 || got[len(got)-1] != sessions || len(slices.Compact(got)) != sessions {
		t.Fatalf("expired %d sessions (%d distinct), want each of %d once", len(got), len(slices.Compact(slices.Clone(got))), sessions)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, call := range rec.calls {
		if len(call) > maxExpireIDs {
			t.Fatalf("command %d expires %d sessions, over %d", i, len(call), maxExpireIDs)
		}
	}
	if rec.overlapped.Load() {
		t.Fatal("two expiry commands were proposed at once")
	}
	if n := tr.queued(); n != 0 {
		t.Fatalf("%d entries left queued after every session expired", n)
	}
}

// BenchmarkTrackerKeepAlive measures a keepalive's bookkeeping with many
// sessions tracked.
func BenchmarkTrackerKeepAlive(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprint("sessions=", n), func(b *testing.B) {
			tr := newSessionTracker(clock.NewFake(), nil, func([]uint64) error { return nil })
			defer tr.stop()
			tr.becomeLeader()
			for id := range uint64(n) {
				tr.created(id+1, 10*time.Second)
			}
			i := 0
			for b.Loop() {
				if _, err := tr.keepAlive(uint64(i%n) + 1); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
