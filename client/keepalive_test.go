package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/rpcerr"
)

// renewingSession starts the keepalive schedule of a session of c that the
// test made up, with the renewal due at due and safe until safe, as
// NewSession would after creating it. Nothing answers for it: the test
// points c at nodes that do not.
func renewingSession(t *testing.T, c *Client, id uint64, ttl time.Duration, due, safe time.Time) *Session {
	t.Helper()
	s := &Session{client: c, id: id, secret: "secret", ttl: ttl, safety: defaultSafety}
	s.interval = ttl / 3
	s.due, s.safeUntil = due, safe
	s.startKeepAlive()
	t.Cleanup(func() {
		s.stopRenew()
		s.stopKeepAlive()
		s.wg.Wait()
	})
	return s
}

// A session whose keepalive rides in the message of a session with a
// longer TTL (which retries up to its own, later, safe-until) still ends
// at its own safe-until, as lost: the service expires it then, and may
// grant its locks to others.
func TestKeepAliveMemberEndsAtItsOwnSafeUntil(t *testing.T) {
	c := mustNew(t, WithEndpoints(freeAddr(t)))
	now := time.Now()
	shortSafe := now.Add(time.Second)
	// short is due 100ms after long, within a quarter of its interval: it
	// goes in the message long sends, bounded by long's safe-until (5s).
	short := renewingSession(t, c, 2, 2*time.Second, now.Add(100*time.Millisecond), shortSafe)
	long := renewingSession(t, c, 1, 8*time.Second, now, now.Add(5*time.Second))
	select {
	case <-short.Done():
	case <-time.After(4 * time.Second):
		t.Fatalf("the short session lives 3s past its safe-until")
	}
	if late := time.Since(shortSafe); late > 300*time.Millisecond {
		t.Errorf("the short session ended %v after its safe-until", late)
	}
	if !errors.Is(short.Err(), fence.ErrSessionLost) {
		t.Errorf("the short session ended with %v, want fence.ErrSessionLost", short.Err())
	}
	if long.Err() != nil {
		t.Errorf("the long session ended before its safe-until: %v", long.Err())
	}
}

// deposedLeader serves a session stream that answers every keepalive as
// a leader that can no longer confirm its leadership does: each session
// refused as Unavailable, naming the leader. It counts the keepalive
// messages it answered.
type deposedLeader struct {
	leader     string
	keepAlives atomic.Int32
}

func (d *deposedLeader) Session(ctx context.Context, bs *connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]) error {
	if err := bs.Send(&fencev1.StreamResponse{Result: &fencev1.StreamResponse_Opened{Opened: &fencev1.StreamOpened{MaxInFlight: 16}}}); err != nil {
		return err
	}
	notLeader := rpcerr.ToStream(&rpcerr.DetailError{
		Err:    fmt.Errorf("%w: leadership not confirmed", fence.ErrUnavailable),
		Detail: rpcerr.Detail{LeaderAddress: d.leader},
	})
	for {
		req, err := bs.Receive()
		if err != nil {
			return nil
		}
		resp := &fencev1.StreamResponse{Id: req.GetId()}
		if ka := req.GetKeepAlive(); ka != nil {
			d.keepAlives.Add(1)
			out := &fencev1.KeepAliveManyResponse{}
			for _, s := range ka.GetSessions() {
				out.Results = append(out.Results, &fencev1.KeepAliveResult{SessionId: s.GetSessionId(), Error: notLeader})
			}
			resp.Result = &fencev1.StreamResponse_KeepAlive{KeepAlive: out}
		} else {
			resp.Error = notLeader
		}
		if err := bs.Send(resp); err != nil {
			return nil
		}
	}
}

// A keepalive message whose sessions a node refuses as Unavailable (not
// the leader, or leadership not confirmed) failed as a whole: the client
// retries it at once at the leader named, as for the message's unary
// keepalives, rather than count the node's answer a success and keep
// sending its keepalives there until the sessions are lost.
func TestKeepAliveRefusedAsNotLeaderMovesToTheLeader(t *testing.T) {
	srv := startServer(t, nil)
	deposed := &deposedLeader{leader: srv.Addr()}
	mux := http.NewServeMux()
	mux.Handle(fencev1connect.NewStreamServiceHandler(deposed))
	node := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	node.Config.Protocols = &p
	node.Start()
	t.Cleanup(node.Close)

	c := mustNew(t, WithEndpoints(srv.Addr(), node.Listener.Addr().String()))
	s := mustSession(t, c, 2*time.Second)
	c.setCurrent(c.endpointAt(1)) // the next keepalive goes to the deposed leader
	select {
	case <-s.Done():
		t.Fatalf("the session was lost: %v", s.Err())
	case <-time.After(3 * time.Second): // past its TTL
	}
	if n := deposed.keepAlives.Load(); n != 1 {
		t.Errorf("the deposed leader answered %d keepalive messages, want 1 (then the leader it named)", n)
	}
	if c.currentIndex() != 0 {
		t.Errorf("the client's calls go to %s, not to the leader", c.endpointAt(c.currentIndex()).url)
	}
}

// A process paused past one session's safe-until must not renew it in the
// message of another session that wakes first: the service may have
// expired it and granted its locks, and a renewal would make a lost
// session look alive. Here the short session's own timers are held back,
// as if its callbacks had not run yet when the long one's renewal did.
func TestKeepAliveTakesNoSessionPastItsSafeUntil(t *testing.T) {
	srv := startServer(t, nil)
	clk := clock.NewFake()
	c := mustClient(t, srv, clk)
	short := mustSession(t, c, 3*time.Second)
	long := mustSession(t, c, 12*time.Second)
	short.mu.Lock()
	short.dueTimer.Stop()
	short.lostTimer.Stop()
	safe := short.safeUntil
	short.mu.Unlock()

	longSafe := long.SafeUntil()
	clk.WaitForTimers(2)
	clk.Advance(long.dueAt().Sub(clk.Now())) // past short's safe-until; long's renewal runs
	deadline := time.Now().Add(10 * time.Second)
	for !long.SafeUntil().After(longSafe) {
		if time.Now().After(deadline) || long.Err() != nil {
			t.Fatalf("the long session was not renewed: err %v", long.Err())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if got := short.SafeUntil(); !got.Equal(safe) {
		t.Fatalf("the short session, paused %v past its safe-until, was renewed to %v", clk.Now().Sub(safe), got.Sub(safe))
	}
	short.rearm()
	mustEndWith(t, "the short session, past its safe-until,", short.Done(), short.Err, fence.ErrSessionLost)
}

// An answer to a keepalive sent at or after the session's safe-until, or
// one that comes after the session ended, extends nothing: the session
// may have expired at the service meanwhile.
func TestLateKeepAliveAnswerRenewsNothing(t *testing.T) {
	c := mustNew(t, WithEndpoints(freeAddr(t)))
	now := time.Now()
	safe := now.Add(time.Hour)
	s := renewingSession(t, c, 1, 3*time.Second, safe, safe)
	s.renewed(safe, 0, 1, nil)
	if got := s.SafeUntil(); !got.Equal(safe) {
		t.Fatalf("a keepalive sent at the safe-until moved it %v", got.Sub(safe))
	}
	s.renewed(safe.Add(-time.Millisecond), 0, 2, nil)
	if !s.SafeUntil().After(safe) {
		t.Fatal("a keepalive sent before the safe-until did not renew the session")
	}
	ended := s.SafeUntil()
	s.end(fence.ErrSessionLost)
	s.renewed(ended.Add(-time.Millisecond), 0, 3, nil)
	if got := s.SafeUntil(); !got.Equal(ended) {
		t.Fatalf("an answer that came after the session ended moved its safe-until %v", got.Sub(ended))
	}
}
