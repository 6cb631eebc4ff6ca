package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
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
	tr.start()
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
			tr.start()
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

// A keepalive holds the tracker's entries of the sessions it renewed, and
// learns from them, without looking the ids up again, which of those
// sessions ended or began to be expired before it answers.
func TestTrackerStillAliveSeesSessionsThatEnded(t *testing.T) {
	tr, c, rec := newTestTracker(t)
	for id := range uint64(5) {
		tr.created(id+1, 10*time.Second)
	}
	tr.created(6, time.Second)
	rs := []renewal{{id: 1}, {id: 2}, {id: 3}, {id: 4}, {id: 6}, {id: 7}, {id: 5, err: errors.New("refused before")}}
	tr.keepAliveAll(rs)
	for i, ttl := range []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second, time.Second} {
		if r := rs[i]; r.err != nil || r.ttl != ttl {
			t.Fatalf("renewing session %d: ttl %v (want %v), err %v", r.id, r.ttl, ttl, r.err)
		}
	}
	if !errors.Is(rs[5].err, fence.ErrSessionNotFound) {
		t.Fatalf("renewing an unknown session: %v", rs[5].err)
	}
	if rs[6].s != nil || rs[6].err.Error() != "refused before" {
		t.Fatalf("a renewal refused before was renewed: %+v", rs[6])
	}

	tr.ended(2) // closed
	// Restoring a snapshot in which session 3 no longer exists.
	tr.reset([]fsm.SessionInfo{{ID: 1, TTL: 10 * time.Second}, {ID: 4, TTL: 10 * time.Second}, {ID: 6, TTL: time.Second}})
	c.WaitForTimers(1)
	c.Advance(2 * time.Second) // 6's expiry is being proposed
	if got := rec.expired(t, 1); !slices.Equal(got, []uint64{6}) {
		t.Fatalf("expired %v, want [6]", got)
	}
	tr.stillAlive(rs)
	for i, want := range []bool{true, false, false, true, false} {
		if alive := rs[i].err == nil; alive != want {
			t.Fatalf("session %d: still alive %v (%v), want %v", rs[i].id, alive, rs[i].err, want)
		}
		if !want && !errors.Is(rs[i].err, fence.ErrSessionNotFound) {
			t.Fatalf("session %d: %v, want ErrSessionNotFound", rs[i].id, rs[i].err)
		}
	}
}

// A keepalive of more sessions than the FSM and the tracker are locked
// for at once answers each session in its place, across the chunks: the
// renewed with their TTL and holdings, the others with their own error.
func TestKeepAliveOfManySessionsAnswersEachInItsPlace(t *testing.T) {
	s, a := startWithAPI(t, nil)
	n := 2*renewalChunk + 3
	reqs := make([]*fencev1.KeepAliveRequest, n)
	for i := range reqs {
		id := a.session(time.Minute)
		reqs[i] = &fencev1.KeepAliveRequest{SessionId: id, SessionSecret: a.secrets.secret(id)}
	}
	last := reqs[n-1].GetSessionId()
	token := a.mustAcquire(last, "job")
	wrongSecret, unknown, noID := renewalChunk-1, renewalChunk, renewalChunk+1
	reqs[wrongSecret].SessionSecret = reqs[0].GetSessionSecret()
	reqs[unknown].SessionId = last + 1000
	reqs[noID].SessionId = 0
	if _, err := s.closeSession(context.Background(), &fencev1.CloseSessionRequest{SessionId: reqs[2].GetSessionId(), SessionSecret: reqs[2].GetSessionSecret()}); err != nil {
		t.Fatal(err)
	}

	out := s.keepAlive(context.Background(), reqs)
	if len(out) != n {
		t.Fatalf("%d answers to %d sessions", len(out), n)
	}
	for i, r := range out {
		var want error
		switch i {
		case wrongSecret:
			want = fence.ErrSessionSecret
		case unknown, 2:
			want = fence.ErrSessionNotFound
		case noID:
			want = fence.ErrInvalidArgument
		}
		if want != nil {
			if !errors.Is(r.err, want) || r.resp != nil {
				t.Fatalf("session %d (#%d): %v, %v; want %v", reqs[i].GetSessionId(), i, r.resp, r.err, want)
			}
			continue
		}
		if r.err != nil || r.resp.GetTtl().AsDuration() != time.Minute {
			t.Fatalf("session %d (#%d): %v, %v", reqs[i].GetSessionId(), i, r.resp, r.err)
		}
		if held := r.resp.GetHeld().GetTokens(); i == n-1 && !slices.Equal(held, []uint64{token}) || i < n-1 && len(held) > 0 {
			t.Fatalf("session %d (#%d) holds %v", reqs[i].GetSessionId(), i, held)
		}
	}
}
