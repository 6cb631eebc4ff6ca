package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/rpcerr"
)

// lockWatchReader reads a raw LockService.Watch stream in the background.
type lockWatchReader struct {
	header uint64 // the first message's revision
	events chan *fencev1.LockEvent
	done   chan struct{}
	err    error
}

// openLockWatch opens a lock watch on locks and waits for its first
// message; it returns the call's error if it fails.
func openLockWatch(ctx context.Context, locks fencev1connect.LockServiceClient, prefix string, start uint64) (*lockWatchReader, error) {
	stream, err := locks.Watch(ctx, connect.NewRequest(&fencev1.LockWatchRequest{Prefix: prefix, StartRevision: start}))
	if err != nil {
		return nil, rpcerr.FromConnect(err)
	}
	if !stream.Receive() {
		stream.Close()
		return nil, rpcerr.FromConnect(stream.Err())
	}
	r := &lockWatchReader{header: stream.Msg().GetRevision(), events: make(chan *fencev1.LockEvent, 1000), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer stream.Close()
		for stream.Receive() {
			for _, ev := range stream.Msg().GetEvents() {
				r.events <- ev
			}
		}
		r.err = rpcerr.FromConnect(stream.Err())
	}()
	return r, nil
}

func mustOpenLockWatch(t *testing.T, ctx context.Context, locks fencev1connect.LockServiceClient, prefix string, start uint64) *lockWatchReader {
	t.Helper()
	r, err := openLockWatch(ctx, locks, prefix, start)
	if err != nil {
		t.Fatalf("watching %q from %d: %v", prefix, start, err)
	}
	return r
}

// within returns the next event, or nil if none comes within d.
func (r *lockWatchReader) within(d time.Duration) *fencev1.LockEvent {
	select {
	case ev := <-r.events:
		return ev
	case <-time.After(d):
		return nil
	}
}

// expect reads len(want) events and fails unless each reads as its want
// (eventText), then checks that no other event follows at once.
func (r *lockWatchReader) expect(t *testing.T, want ...string) []*fencev1.LockEvent {
	t.Helper()
	var got []*fencev1.LockEvent
	for len(got) < len(want) {
		ev := r.within(10 * time.Second)
		if ev == nil {
			t.Fatalf("got %v, then nothing; want %v", texts(got), want)
		}
		got = append(got, ev)
	}
	if texts(got) != strings.Join(want, "; ") {
		t.Fatalf("events\n  %s\nwant\n  %s", texts(got), strings.Join(want, "; "))
	}
	if ev := r.within(50 * time.Millisecond); ev != nil {
		t.Fatalf("after %v, an event more: %s", want, eventText(ev))
	}
	return got
}

// eventText reads an event as "granted w/1 s3 t5", with its give-up
// reason and session end when it has them.
func eventText(ev *fencev1.LockEvent) string {
	s := fmt.Sprintf("%s %s s%d", strings.ToLower(strings.TrimPrefix(ev.GetType().String(), "LOCK_EVENT_TYPE_")), ev.GetLock(), ev.GetSessionId())
	if ev.GetToken() != 0 {
		s += fmt.Sprintf(" t%d", ev.GetToken())
	}
	if r := ev.GetReason(); r != 0 {
		s += " " + strings.ToLower(strings.TrimPrefix(r.String(), "GIVE_UP_REASON_"))
	}
	if e := ev.GetSessionEnd(); e != 0 {
		s += " (" + strings.ToLower(strings.TrimPrefix(e.String(), "SESSION_END_")) + ")"
	}
	return s
}

func texts(evs []*fencev1.LockEvent) string {
	var out []string
	for _, ev := range evs {
		out = append(out, eventText(ev))
	}
	return strings.Join(out, "; ")
}

// A lock watch delivers every kind of event of the locks under its
// prefix, and none of the others, in the order they happened, each with a
// revision above the watch's start and the one before: a grant and its
// holder's owner and mode, a release and the hand-off it makes, a wait
// queued and given up (timed out, cancelled, its session expired), a
// holder's expiry with its lock-delay started and ended, a revoke, an
// abandonment and a close. Time passes on the leader's fake clock.
func TestLockWatchEvents(t *testing.T) {
	s, clk := startOnFakeClock(t)
	waitFor(t, "the group to move to protocol 4", func() bool { return s.fsm.Protocol() >= fsm.Protocol4 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := newAPI(t, s)
	w := mustOpenLockWatch(t, ctx, a.locks, "w/", 0)
	// advanceUntil moves the fake clock a second at a time until n events
	// came: timers are set a moment after the commands that need them.
	advanceUntil := func(want ...string) {
		t.Helper()
		var got []*fencev1.LockEvent
		for tries := 0; len(got) < len(want) && tries < 100; tries++ {
			if ev := w.within(20 * time.Millisecond); ev != nil {
				got = append(got, ev)
				continue
			}
			clk.Advance(time.Second)
		}
		if texts(got) != strings.Join(want, "; ") {
			t.Fatalf("events\n  %s\nwant\n  %s", texts(got), strings.Join(want, "; "))
		}
	}
	created, err := a.sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{Ttl: durationpb.New(time.Hour), Owner: "writer-1"}))
	if err != nil {
		t.Fatal(err)
	}
	sa := created.Msg.GetSessionId()
	sb, sc, sd := a.session(time.Hour), a.session(time.Hour), a.session(time.Hour)

	t1, err := a.acquire(ctx, &fencev1.AcquireRequest{SessionId: sa, Lock: "w/1", LockDelay: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	grant := w.expect(t, fmt.Sprintf("granted w/1 s%d t%d", sa, t1))[0]
	if grant.GetOwner() != "writer-1" || grant.GetMode() != fencev1.Mode_MODE_EXCLUSIVE || grant.GetRevision() <= w.header {
		t.Fatalf("grant event %v: want owner writer-1, exclusive, a revision above the watch's start %d", grant, w.header)
	}
	a.mustAcquire(sa, "x") // not under the prefix
	waiter := a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: sb, Lock: "w/1"})
	w.expect(t, fmt.Sprintf("queued w/1 s%d", sb))
	if err := a.release(sa, "w/1", t1); err != nil {
		t.Fatal(err)
	}
	t2, err := waiter.result(t)
	if err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("released w/1 s%d t%d", sa, t1), fmt.Sprintf("granted w/1 s%d t%d", sb, t2))

	// Waits given up: timed out, cancelled, their session expired.
	timedOut := a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: sc, Lock: "w/1", WaitTimeout: durationpb.New(time.Second)})
	w.expect(t, fmt.Sprintf("queued w/1 s%d", sc))
	advanceUntil(fmt.Sprintf("gave_up w/1 s%d timed_out", sc))
	if _, err := timedOut.result(t); !errors.Is(rpcerr.FromConnect(err), fence.ErrWaitTimeout) {
		t.Fatalf("the timed-out acquire: %v", err)
	}
	cancelled := a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: sd, Lock: "w/1", RequestId: 9})
	w.expect(t, fmt.Sprintf("queued w/1 s%d", sd))
	if _, err := a.locks.CancelAcquire(ctx, connect.NewRequest(&fencev1.CancelAcquireRequest{SessionId: sd, Lock: "w/1", RequestId: 9})); err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("gave_up w/1 s%d cancelled", sd))
	cancelled.result(t)
	short := a.session(2 * time.Second)
	a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: short, Lock: "w/1"})
	w.expect(t, fmt.Sprintf("queued w/1 s%d", short))
	advanceUntil(fmt.Sprintf("gave_up w/1 s%d session_ended (expired)", short))

	// A holder's expiry, and its lock-delay.
	short = a.session(2 * time.Second)
	t3, err := a.acquire(ctx, &fencev1.AcquireRequest{SessionId: short, Lock: "w/2", LockDelay: durationpb.New(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("granted w/2 s%d t%d", short, t3))
	advanceUntil(fmt.Sprintf("expired w/2 s%d t%d (expired)", short, t3), fmt.Sprintf("delay_started w/2 s%d t%d (expired)", short, t3))
	advanceUntil("delay_ended w/2 s0")

	// A revoke, an abandonment, a close.
	cluster := fencev1connect.NewClusterServiceClient(http.DefaultClient, "http://"+s.Addr())
	if _, err := cluster.RevokeSession(ctx, connect.NewRequest(&fencev1.RevokeSessionRequest{SessionId: sb})); err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("revoked w/1 s%d t%d (revoked)", sb, t2))
	t4 := a.mustAcquire(sc, "w/3")
	if _, err := a.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: sc, Abandon: true})); err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("granted w/3 s%d t%d", sc, t4), fmt.Sprintf("abandoned w/3 s%d t%d (abandoned)", sc, t4))
	t5 := a.mustAcquire(sd, "w/4")
	if _, err := a.sessions.CloseSession(ctx, connect.NewRequest(&fencev1.CloseSessionRequest{SessionId: sd})); err != nil {
		t.Fatal(err)
	}
	w.expect(t, fmt.Sprintf("granted w/4 s%d t%d", sd, t5), fmt.Sprintf("released w/4 s%d t%d (closed)", sd, t5))
}

// A watch from a past revision first delivers the events from there on
// that the node still keeps (--watch-history), exactly as a watch open at
// the time saw them, then new ones; revisions are sparse, so a start
// between two events means the later one. From before the oldest kept
// event it fails with ErrCompacted (FailedPrecondition, REASON_COMPACTED).
func TestLockWatchFromPastRevision(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.WatchHistory = 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newAPI(t, s)
	live := mustOpenLockWatch(t, ctx, a.locks, "", 0)
	sess := a.session(time.Hour)
	var want []string
	for i := range 4 {
		name := fmt.Sprintf("p/%d", i)
		token := a.mustAcquire(sess, name)
		if err := a.release(sess, name, token); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("granted %s s%d t%d", name, sess, token), fmt.Sprintf("released %s s%d t%d", name, sess, token))
	}
	all := live.expect(t, want...)
	for i := 1; i < len(all); i++ {
		if all[i].GetRevision() <= all[i-1].GetRevision() {
			t.Fatalf("revisions do not increase: %d after %d", all[i].GetRevision(), all[i-1].GetRevision())
		}
	}
	// The history keeps the last five: from all[3] on, and every
	// revision after all[2] (there is no event between it and all[3]).
	past := mustOpenLockWatch(t, ctx, a.locks, "", all[2].GetRevision()+1)
	past.expect(t, want[3:]...)
	between := mustOpenLockWatch(t, ctx, a.locks, "p/3", all[5].GetRevision()+1)
	between.expect(t, want[6:]...)
	_, err := openLockWatch(ctx, a.locks, "", all[2].GetRevision())
	if !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("a watch from an event no longer kept: %v, want ErrCompacted", err)
	}
	// New events follow the replay.
	token := a.mustAcquire(sess, "p/3")
	past.expect(t, fmt.Sprintf("granted p/3 s%d t%d", sess, token))
	between.expect(t, fmt.Sprintf("granted p/3 s%d t%d", sess, token))
}

// A node restarted from a snapshot knows no event up to the snapshot's
// index: a watch from before it fails with ErrCompacted, one from just
// after it (what a client that saw the events up to there asks) is served,
// and so is a watch from now.
func TestLockWatchAfterRestoreFromSnapshot(t *testing.T) {
	s := startTestServer(t, nil)
	cfg := s.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newAPI(t, s)
	w := mustOpenLockWatch(t, ctx, a.locks, "", 0)
	sess := a.session(time.Hour)
	token := a.mustAcquire(sess, "r")
	first := w.expect(t, fmt.Sprintf("granted r s%d t%d", sess, token))[0]
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustStart(t, cfg)
	snapshot := s.snapshotOpened.Load()
	if snapshot < first.GetRevision()>>lockEventBits {
		t.Fatalf("restored from the snapshot at %d, before the grant's entry %d", snapshot, first.GetRevision()>>lockEventBits)
	}
	a = newAPIAt(t, "http://"+s.Addr(), a.secrets)
	if _, err := openLockWatch(ctx, a.locks, "", first.GetRevision()); !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("a watch from before the snapshot: %v, want ErrCompacted", err)
	}
	after := mustOpenLockWatch(t, ctx, a.locks, "", lockRevision(snapshot+1, 0))
	now := mustOpenLockWatch(t, ctx, a.locks, "", 0)
	if err := a.release(sess, "r", token); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("released r s%d t%d", sess, token)
	after.expect(t, want)
	if ev := now.expect(t, want)[0]; ev.GetRevision() <= now.header || now.header < lockRevision(snapshot+1, 0)-1 {
		t.Fatalf("watch from now: in place at %d, first event at %d, snapshot at %d", now.header, ev.GetRevision(), snapshot)
	}
}

// A lock watch through the Go client survives the failure of the leader it
// streams from: it resumes on the new leader after the last revision it
// delivered. Locks change all along; the revisions it delivered are
// exactly the new leader's full sequence over the same span, with no gap
// and no duplicate, and every node that runs holds the same events under
// the same revisions.
func TestClusterLockWatchResumesAfterLeaderFailure(t *testing.T) {
	c := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := c.client()
	w, err := cl.WatchLocks(ctx, "jobs/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var (
		mu   sync.Mutex
		seen []*fencev1.LockEvent
	)
	go func() {
		for ev := range w.Events() {
			mu.Lock()
			seen = append(seen, ev)
			mu.Unlock()
		}
	}()
	numSeen := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	// A worker takes and gives back locks until told to stop; calls that
	// fail while the group elects a new leader are simply made again.
	stop := make(chan struct{})
	worked := make(chan struct{})
	go func() {
		defer close(worked)
		wc := c.client()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			sess, err := wc.NewSession(ctx, client.WithTTL(5*time.Second))
			if err != nil {
				continue
			}
			m := client.NewMutex(sess, fmt.Sprintf("jobs/%d", i%3))
			if _, err := m.Lock(ctx); err == nil {
				m.Unlock(ctx)
			}
			sess.Close(ctx)
		}
	}()
	waitFor(t, "some events before the failure", func() bool { return numSeen() >= 10 })
	old := c.leader()
	c.stop(old.cfg.NodeID)
	before := numSeen()
	waitForWithin(t, 30*time.Second, "events after the failure", func() bool { return numSeen() >= before+10 })
	close(stop)
	<-worked

	leader := c.leader()
	var full []lockEvent
	leader.lockWatches.mu.Lock()
	leader.lockWatches.history.each(func(ev lockEvent) {
		if strings.HasPrefix(ev.Lock, "jobs/") {
			full = append(full, ev)
		}
	})
	leader.lockWatches.mu.Unlock()
	mu.Lock()
	first := slices.IndexFunc(full, func(ev lockEvent) bool { return ev.Revision == seen[0].GetRevision() })
	mu.Unlock()
	if first < 0 {
		t.Fatalf("the first event seen, %d, is not in the new leader's history", seen[0].GetRevision())
	}
	full = full[first:]
	// (A session whose close failed in the election may expire later:
	// its events come after these.)
	waitFor(t, "the watch to deliver every event", func() bool { return numSeen() >= len(full) })
	mu.Lock()
	defer mu.Unlock()
	for i := range full {
		if got, want := seen[i], apiLockEvent(full[i]); got.GetRevision() != want.GetRevision() || eventText(got) != eventText(want) {
			t.Fatalf("event %d: delivered %d %s, the new leader has %d %s", i, got.GetRevision(), eventText(got), want.GetRevision(), eventText(want))
		}
	}
	// Every node derives the same events with the same revisions (once
	// the follower has applied what the leader has).
	history := func(s *Server) []string {
		var h []string
		s.lockWatches.mu.Lock()
		defer s.lockWatches.mu.Unlock()
		s.lockWatches.history.each(func(ev lockEvent) {
			h = append(h, fmt.Sprintf("%d %s", ev.Revision, eventText(apiLockEvent(ev))))
		})
		return h
	}
	follower := c.followers(leader)[0]
	var lh, fh []string
	waitFor(t, "the nodes to hold the same lock events", func() bool {
		lh, fh = history(leader), history(follower)
		n := min(len(lh), len(fh))
		return n >= len(full) && slices.Equal(lh[len(lh)-n:], fh[len(fh)-n:])
	})
}

// A lock watch needs lock read on its prefix, and ends with
// PermissionDenied once that is taken away, or Unauthenticated once its
// token is revoked, without sending anything committed after.
func TestLockWatchAuth(t *testing.T) {
	s := startTestServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	root, _, token := enableAuthWithUser(t, s, "reader", perm(client.PermLock, client.Read, "a/"))
	reader := mustClient(t, s, token)
	if _, err := reader.WatchLocks(ctx, "b/", 0); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Fatalf("watching b/ with lock read on a/: %v, want ErrPermissionDenied", err)
	}
	if _, err := reader.WatchLocks(ctx, "", 0); !errors.Is(err, fence.ErrPermissionDenied) {
		t.Fatalf("watching every lock with lock read on a/: %v, want ErrPermissionDenied", err)
	}
	w, err := reader.WatchLocks(ctx, "a/x", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sess := mustNewSession(t, root)
	m := client.NewMutex(sess, "a/x")
	g := mustLock(t, m)
	if ev := <-w.Events(); ev.GetType() != fencev1.LockEventType_LOCK_EVENT_TYPE_GRANTED || ev.GetToken() != g.Token() {
		t.Fatalf("first event %v, want the grant of token %d", ev, g.Token())
	}
	if err := root.RoleRevoke(ctx, "reader", perm(client.PermLock, client.Read, "a/")); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, m)
	for ev := range w.Events() {
		t.Errorf("the watch sent %s after its permission was taken away", eventText(ev))
	}
	if !errors.Is(w.Err(), fence.ErrPermissionDenied) {
		t.Fatalf("the watch whose permission was revoked ended with %v, want ErrPermissionDenied", w.Err())
	}

	if err := root.RoleGrant(ctx, "reader", perm(client.PermLock, client.Read, "a/")); err != nil {
		t.Fatal(err)
	}
	w, err = reader.WatchLocks(ctx, "a/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tokens, err := root.Tokens(ctx, "reader")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	mustLock(t, client.NewMutex(sess, "a/y"))
	for ev := range w.Events() {
		t.Errorf("the watch sent %s after its token was revoked", eventText(ev))
	}
	if !errors.Is(w.Err(), fence.ErrAuthFailed) {
		t.Fatalf("the watch whose token was revoked ended with %v, want ErrAuthFailed", w.Err())
	}
}

// The lock feed numbers each entry's events from 0, above every earlier
// entry's; an entry that would make more events than its revisions can
// number ends every watch and compacts past itself rather than reuse a
// revision.
func TestLockFeedNumbersEntries(t *testing.T) {
	f := newLockFeed(&watchSlots{}, clock.NewFake(), 100)
	ev := fsm.LockEvent{Kind: fsm.LockGranted, Lock: "l"}
	got := f.applied(fsm.SeqOf(7, 0), []fsm.LockEvent{ev, ev})
	got = append(got, f.applied(fsm.SeqOf(7, 1), []fsm.LockEvent{ev})...)
	got = append(got, f.applied(fsm.SeqOf(8, 0), []fsm.LockEvent{ev})...)
	var revs []uint64
	for _, e := range got {
		revs = append(revs, e.Revision)
	}
	if want := []uint64{lockRevision(7, 0), lockRevision(7, 1), lockRevision(7, 2), lockRevision(8, 0)}; !slices.Equal(revs, want) {
		t.Fatalf("revisions %v, want %v", revs, want)
	}
	if p := f.position(); p != lockRevision(8, 1)-1 {
		t.Fatalf("position %d, want %d", p, lockRevision(8, 1)-1)
	}
	w, _, err := f.add("", 0)
	if err != nil {
		t.Fatal(err)
	}
	f.applied(fsm.SeqOf(9, 0), []fsm.LockEvent{ev})
	f.n = maxEntryLockEvents - 1 // as if the entry had made that many
	if out := f.applied(fsm.SeqOf(9, 1), []fsm.LockEvent{ev, ev}); out != nil {
		t.Fatalf("an entry of too many events published %d", len(out))
	}
	select {
	case <-w.ended:
	default:
		t.Fatal("the watch is still open after an entry of too many events")
	}
	if _, _, err := f.add("", lockRevision(8, 0)); !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("a watch from before it: %v, want ErrCompacted", err)
	}
	if _, rev, err := f.add("", lockRevision(10, 0)); err != nil || rev != lockRevision(10, 0)-1 {
		t.Fatalf("a watch from the entry after: %v at %d", err, rev)
	}
}

// The API's give-up reasons and session ends are the state machine's,
// number for number.
func TestLockEventEnumsMatch(t *testing.T) {
	for _, g := range []fsm.GiveUp{fsm.GaveUpCancelled, fsm.GaveUpTimedOut, fsm.GaveUpSessionEnded} {
		if got := fencev1.GiveUpReason(g).String(); got != "GIVE_UP_REASON_"+strings.ToUpper(g.String()) {
			t.Errorf("give-up %s is %s in the API", g, got)
		}
	}
	for _, e := range []fsm.End{fsm.Closed, fsm.Expired, fsm.Revoked, fsm.Abandoned} {
		if got := fencev1.SessionEnd(e).String(); got != "SESSION_END_"+strings.ToUpper(e.String()) {
			t.Errorf("session end %s is %s in the API", e, got)
		}
	}
	for k := fsm.LockGranted; k <= fsm.LockDelayEnded; k++ {
		if got := apiLockEventType(k).String(); got != "LOCK_EVENT_TYPE_"+strings.ToUpper(k.String()) {
			t.Errorf("lock event %s is %s in the API", k, got)
		}
	}
}

// A wait's timeout goes in the log only once every member knows the field
// (protocol 4); below it the CancelWait is as older versions wrote it.
func TestCancelWaitFollowsTheProtocol(t *testing.T) {
	w := &waiter{key: fsm.WaitRef{Session: 7, Lock: "l"}, req: request{id: 3, attempt: 4}}
	for _, tc := range []struct {
		protocol uint32
		timedOut bool
		want     bool
	}{
		{fsm.Protocol3, true, false},
		{fsm.Protocol4, true, true},
		{fsm.Protocol4, false, false},
	} {
		cw := cancelWaitCommand(tc.protocol, w, tc.timedOut).GetCancelWait()
		if cw.GetTimedOut() != tc.want || cw.GetSessionId() != 7 || cw.GetLock() != "l" || cw.GetRequestId() != 3 || cw.GetAttempt() != 4 {
			t.Errorf("at protocol %d, a wait that timed out (%v) goes as %v", tc.protocol, tc.timedOut, cw)
		}
	}
}
