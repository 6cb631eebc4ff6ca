package server

import (
	"context"
	"errors"
	"net/http"
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
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/rpcerr"
)

// rawStream is a session stream at the wire level: operations are sent
// with ids and their answers collected by id, in whatever order they come.
type rawStream struct {
	tb      testing.TB
	send    func(*fencev1.StreamRequest) error
	recv    func() (*fencev1.StreamResponse, error)
	opened  *fencev1.StreamOpened
	mu      sync.Mutex
	sendMu  sync.Mutex
	nextID  uint64
	waiting map[uint64]chan *fencev1.StreamResponse
	ended   chan struct{}
	err     error // why the stream ended, once ended is closed
}

// h2c is an HTTP client that speaks HTTP/2 without TLS, as the stream needs.
func h2c(header http.Header) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: headerTransportOver{header, &http.Transport{Protocols: &p}}}
}

type headerTransportOver struct {
	h    http.Header
	next http.RoundTripper
}

func (t headerTransportOver) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header[k] = v
	}
	return t.next.RoundTrip(r)
}

// openStream opens a stream at url and waits for StreamOpened; the error
// is the stream's refusal.
func openStream(tb testing.TB, ctx context.Context, url string, header http.Header) (*rawStream, error) {
	tb.Helper()
	return openStreamOn(tb, ctx, h2c(header), url)
}

// openStreamOn is openStream over hc's connections: streams opened with
// one h2c client share its connection.
func openStreamOn(tb testing.TB, ctx context.Context, hc *http.Client, url string) (*rawStream, error) {
	tb.Helper()
	conn := fencev1connect.NewStreamServiceClient(hc, url).Session(ctx)
	if err := conn.Send(nil); err != nil {
		return nil, err
	}
	first, err := conn.Receive()
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { conn.CloseRequest(); conn.CloseResponse() })
	return newRawStream(tb, first, conn.Send, conn.Receive), nil
}

func newRawStream(tb testing.TB, first *fencev1.StreamResponse, send func(*fencev1.StreamRequest) error, recv func() (*fencev1.StreamResponse, error)) *rawStream {
	rs := &rawStream{tb: tb, send: send, recv: recv, opened: first.GetOpened(), waiting: map[uint64]chan *fencev1.StreamResponse{}, ended: make(chan struct{})}
	go rs.read()
	return rs
}

// streamOpener opens a session stream at url with header, and waits for
// StreamOpened; the error is the stream's refusal.
type streamOpener func(tb testing.TB, ctx context.Context, url string, header http.Header) (*rawStream, error)

// forEachTransport runs test with the stream over HTTP/2 (Connect) and
// framed on the connection: the two must behave alike.
func forEachTransport(t *testing.T, test func(t *testing.T, open streamOpener)) {
	for _, tr := range []struct {
		name string
		open streamOpener
	}{{"http2", openStream}, {"framed", openFramedStream}} {
		t.Run(tr.name, func(t *testing.T) { test(t, tr.open) })
	}
}

// mustOpen opens a stream at s that must open.
func mustOpen(tb testing.TB, open streamOpener, s *Server) *rawStream {
	tb.Helper()
	rs, err := open(tb, context.Background(), "http://"+s.Addr(), nil)
	if err != nil {
		tb.Fatalf("opening the stream: %v", err)
	}
	return rs
}

func mustOpenStream(tb testing.TB, s *Server) *rawStream {
	tb.Helper()
	return mustOpen(tb, openStream, s)
}

func (rs *rawStream) read() {
	for {
		resp, err := rs.recv()
		if err != nil {
			rs.err = err
			close(rs.ended)
			return
		}
		rs.mu.Lock()
		ch := rs.waiting[resp.GetId()]
		delete(rs.waiting, resp.GetId())
		rs.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

// start sends an operation and returns the channel its answer comes on.
func (rs *rawStream) start(req *fencev1.StreamRequest) (uint64, <-chan *fencev1.StreamResponse) {
	rs.tb.Helper()
	ch := make(chan *fencev1.StreamResponse, 1)
	rs.mu.Lock()
	rs.nextID++
	req.Id = rs.nextID
	rs.waiting[req.Id] = ch
	rs.mu.Unlock()
	rs.sendMu.Lock()
	defer rs.sendMu.Unlock()
	if err := rs.send(req); err != nil {
		rs.tb.Fatalf("sending operation %d: %v", req.Id, err)
	}
	return req.Id, ch
}

// do runs one operation and returns its answer.
func (rs *rawStream) do(req *fencev1.StreamRequest) *fencev1.StreamResponse {
	rs.tb.Helper()
	_, ch := rs.start(req)
	return rs.await(ch)
}

func (rs *rawStream) await(ch <-chan *fencev1.StreamResponse) *fencev1.StreamResponse {
	rs.tb.Helper()
	select {
	case resp := <-ch:
		return resp
	case <-rs.ended:
		rs.tb.Fatalf("the stream ended: %v", rs.err)
	case <-time.After(10 * time.Second):
		rs.tb.Fatal("no answer within 10s")
	}
	return nil
}

// mustDo is do for an operation that must succeed.
func (rs *rawStream) mustDo(req *fencev1.StreamRequest) *fencev1.StreamResponse {
	rs.tb.Helper()
	resp := rs.do(req)
	if resp.GetError() != nil {
		rs.tb.Fatalf("operation %T failed: %v", req.GetOp(), rpcerr.FromStream(resp.GetError()))
	}
	return resp
}

func (rs *rawStream) session(ttl time.Duration) *fencev1.CreateSessionResponse {
	rs.tb.Helper()
	return rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_CreateSession{CreateSession: &fencev1.CreateSessionRequest{Ttl: durationpb.New(ttl)}}}).GetCreateSession()
}

func acquireOp(sess *fencev1.CreateSessionResponse, lock string, try bool) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Acquire{Acquire: &fencev1.AcquireRequest{
		SessionId: sess.GetSessionId(), SessionSecret: sess.GetSessionSecret(), Lock: lock, Try: try,
	}}}
}

func releaseOp(sess *fencev1.CreateSessionResponse, lock string, token uint64) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Release{Release: &fencev1.ReleaseRequest{
		SessionId: sess.GetSessionId(), SessionSecret: sess.GetSessionSecret(), Lock: lock, Token: token,
	}}}
}

func putOp(key, value, idempotencyKey string) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{IdempotencyKey: idempotencyKey, Op: &fencev1.StreamRequest_Put{Put: &fencev1.PutRequest{Key: key, Value: []byte(value)}}}
}

// waitersOf counts the waiters of a lock in s's state.
func waitersOf(s *Server, lock string) int {
	var n int
	s.fsm.Read(func(st *fsm.State) {
		info, _ := st.Lock(lock)
		n = len(info.Waiters)
	})
	return n
}

// streamErr returns an answer's error as the client sees it.
func streamErr(resp *fencev1.StreamResponse) error { return rpcerr.FromStream(resp.GetError()) }

// Every operation on the stream means what its unary call means: the same
// answers, the same errors (as the same sentinels), the same checks.
func TestStreamOperationsMatchUnary(t *testing.T) {
	forEachTransport(t, func(t *testing.T, open streamOpener) {
		s := startTestServer(t, nil)
		rs := mustOpen(t, open, s)
		if rs.opened.GetMaxInFlight() != uint32(DefaultConfig().MaxStreamOps) {
			t.Fatalf("StreamOpened = %v", rs.opened)
		}
		a, b := rs.session(10*time.Second), rs.session(10*time.Second)

		grant := rs.mustDo(acquireOp(a, "orders", false)).GetAcquire()
		if grant.GetToken() == 0 || grant.GetLock() != "orders" || grant.GetMode() != fencev1.Mode_MODE_EXCLUSIVE {
			t.Fatalf("acquire = %v", grant)
		}
		var locked *fence.LockedError
		if err := streamErr(rs.do(acquireOp(b, "orders", true))); !errors.As(err, &locked) || locked.HolderSession != a.GetSessionId() || locked.HolderToken != grant.GetToken() {
			t.Fatalf("a try of a held lock failed with %v", err)
		}
		check := rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_Check{Check: &fencev1.CheckRequest{Lock: "orders", Token: grant.GetToken()}}}).GetCheck()
		if !check.GetCurrent() || !check.GetHeld() || check.GetCurrentToken() != grant.GetToken() {
			t.Fatalf("check = %v", check)
		}

		// Writes with an idempotency key apply once, and answer as the first did.
		put := rs.mustDo(putOp("k", "v1", "key-1")).GetPut()
		again := rs.mustDo(putOp("k", "v2", "key-1")).GetPut()
		if again.GetRevision() != put.GetRevision() {
			t.Fatalf("a repeated put answered revision %d, the first %d", again.GetRevision(), put.GetRevision())
		}
		got := rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_Get{Get: &fencev1.GetRequest{Key: "k"}}}).GetGet()
		if string(got.GetKv().GetValue()) != "v1" || got.GetKv().GetVersion() != 1 {
			t.Fatalf("get = %v: the repeated put was applied", got)
		}
		if err := streamErr(rs.do(putOp("k", "v", strings.Repeat("x", 65)))); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Fatalf("an oversized idempotency key: %v", err)
		}
		del := rs.mustDo(&fencev1.StreamRequest{IdempotencyKey: "key-2", Op: &fencev1.StreamRequest_Delete{Delete: &fencev1.DeleteRequest{Key: "k"}}}).GetDelete()
		if !del.GetDeleted() {
			t.Fatalf("delete = %v", del)
		}
		// Fenced writes refuse stale tokens, as a *fence.StaleTokenError.
		other := rs.mustDo(acquireOp(b, "other", false)).GetAcquire()
		fenced := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Put{Put: &fencev1.PutRequest{Key: "f", Fence: &fencev1.Fence{Lock: "other", Token: other.GetToken()}}}}
		rs.mustDo(fenced)
		stale := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Put{Put: &fencev1.PutRequest{Key: "f", Fence: &fencev1.Fence{Lock: "orders", Token: grant.GetToken()}}}}
		var staleErr *fence.StaleTokenError
		if err := streamErr(rs.do(stale)); !errors.As(err, &staleErr) || staleErr.Highest != other.GetToken() {
			t.Fatalf("a stale write failed with %v", err)
		}
		rs.mustDo(releaseOp(b, "other", other.GetToken()))

		// Validation: the unary checks hold.
		if err := streamErr(rs.do(acquireOp(a, "", false))); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Fatalf("an empty lock name: %v", err)
		}
		if err := streamErr(rs.do(&fencev1.StreamRequest{})); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Fatalf("an operation without an op: %v", err)
		}

		// Session secrets: without it, or with another, nothing happens.
		thief := &fencev1.CreateSessionResponse{SessionId: a.GetSessionId(), SessionSecret: b.GetSessionSecret()}
		if err := streamErr(rs.do(releaseOp(thief, "orders", grant.GetToken()))); !errors.Is(err, fence.ErrSessionSecret) {
			t.Fatalf("a release with another session's secret: %v", err)
		}
		noSecret := &fencev1.CreateSessionResponse{SessionId: a.GetSessionId()}
		if err := streamErr(rs.do(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_CloseSession{CloseSession: &fencev1.CloseSessionRequest{SessionId: noSecret.GetSessionId()}}})); !errors.Is(err, fence.ErrSessionSecret) {
			t.Fatalf("a close without the secret: %v", err)
		}
		if check := rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_Check{Check: &fencev1.CheckRequest{Lock: "orders", Token: grant.GetToken()}}}).GetCheck(); !check.GetCurrent() {
			t.Fatal("a refused call released the lock")
		}

		// Keepalives: per session, with what the session holds, or its error.
		ka := rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_KeepAlive{KeepAlive: &fencev1.KeepAliveManyRequest{Sessions: []*fencev1.KeepAliveRequest{
			{SessionId: a.GetSessionId(), SessionSecret: a.GetSessionSecret()},
			{SessionId: b.GetSessionId(), SessionSecret: a.GetSessionSecret()},
			{SessionId: 999, SessionSecret: "x"},
		}}}}).GetKeepAlive().GetResults()
		if len(ka) != 3 || ka[0].GetOk().GetTtl().AsDuration() != 10*time.Second || len(ka[0].GetOk().GetHeld().GetTokens()) != 1 || ka[0].GetOk().GetHeld().GetTokens()[0] != grant.GetToken() {
			t.Fatalf("keepalive answers %v", ka)
		}
		if err := rpcerr.FromStream(ka[1].GetError()); ka[1].GetOk() != nil || !errors.Is(err, fence.ErrSessionSecret) {
			t.Fatalf("a keepalive with another session's secret: %v", ka[1])
		}
		if err := rpcerr.FromStream(ka[2].GetError()); !errors.Is(err, fence.ErrSessionNotFound) {
			t.Fatalf("a keepalive of no session: %v", ka[2])
		}

		// A blocked acquire whose operation is cancelled gives up its wait,
		// as a unary call whose caller went away does.
		waitReq := acquireOp(b, "orders", false)
		waitReq.GetAcquire().RequestId = 7
		id, waiting := rs.start(waitReq)
		waitFor(t, "b to queue", func() bool { return waitersOf(s, "orders") == 1 })
		rs.sendMu.Lock()
		if err := rs.send(&fencev1.StreamRequest{Id: id, Op: &fencev1.StreamRequest_Cancel{Cancel: &fencev1.StreamCancel{}}}); err != nil {
			t.Fatal(err)
		}
		rs.sendMu.Unlock()
		if err := streamErr(rs.await(waiting)); !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled acquire answered %v", err)
		}
		waitFor(t, "the cancelled wait to be dropped", func() bool { return waitersOf(s, "orders") == 0 })
		// CancelAcquire gives up a granted request by its id.
		byID := acquireOp(b, "jobs", false)
		byID.GetAcquire().RequestId = 8
		rs.mustDo(byID)
		cancelled := rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_CancelAcquire{CancelAcquire: &fencev1.CancelAcquireRequest{
			SessionId: b.GetSessionId(), SessionSecret: b.GetSessionSecret(), Lock: "jobs", RequestId: 8,
		}}}).GetCancelAcquire()
		if !cancelled.GetReleased() {
			t.Fatalf("cancel = %v", cancelled)
		}

		rs.mustDo(releaseOp(a, "orders", grant.GetToken()))
		rs.mustDo(&fencev1.StreamRequest{Op: &fencev1.StreamRequest_CloseSession{CloseSession: &fencev1.CloseSessionRequest{SessionId: a.GetSessionId(), SessionSecret: a.GetSessionSecret()}}})
		if err := streamErr(rs.do(acquireOp(a, "orders", true))); !errors.Is(err, fence.ErrSessionNotFound) {
			t.Fatalf("an acquire of a closed session: %v", err)
		}
		samples := scrape(t, "http://"+s.Addr()+"/metrics")
		if n := samples[`fence_requests_total{code="ok",procedure="`+fencev1connect.LockServiceAcquireProcedure+`"}`]; n < 1 {
			t.Fatalf("stream acquires are not counted in fence_requests_total: %v", n)
		}
		if n := samples[`fence_stream_requests_total{op="keep_alive"}`]; n != 1 {
			t.Fatalf("fence_stream_requests_total counted %v keepalive messages", n)
		}
	})
}

// Operations complete out of order: an acquire blocked behind a holder
// holds up neither a put nor the release that grants it, sent after it on
// the same stream.
func TestStreamOutOfOrderCompletion(t *testing.T) {
	forEachTransport(t, func(t *testing.T, open streamOpener) {
		s := startTestServer(t, nil)
		rs := mustOpen(t, open, s)
		a, b := rs.session(10*time.Second), rs.session(10*time.Second)
		held := rs.mustDo(acquireOp(a, "hot", false)).GetAcquire()
		_, blocked := rs.start(acquireOp(b, "hot", false))
		waitFor(t, "b to queue", func() bool { return waitersOf(s, "hot") == 1 })
		if put := rs.mustDo(putOp("k", "v", "")).GetPut(); put.GetRevision() == 0 {
			t.Fatalf("put = %v", put)
		}
		select {
		case resp := <-blocked:
			t.Fatalf("the blocked acquire answered before the release: %v", resp)
		default:
		}
		rs.mustDo(releaseOp(a, "hot", held.GetToken()))
		got := rs.await(blocked)
		if got.GetError() != nil || got.GetAcquire().GetToken() <= held.GetToken() {
			t.Fatalf("the blocked acquire answered %v", got)
		}
	})
}

// A stream lives as long as its client keeps it open: neither the read
// timeout, which bounds a request's body, nor the write timeout, which
// bounds each write of an answer, ends an idle stream.
func TestStreamOutlivesReadAndWriteTimeouts(t *testing.T) {
	forEachTransport(t, func(t *testing.T, open streamOpener) {
		s := startTestServer(t, func(c *Config) {
			c.ReadTimeout = 200 * time.Millisecond
			c.WriteTimeout = 200 * time.Millisecond
		})
		rs := mustOpen(t, open, s)
		sess := rs.session(10 * time.Second)
		time.Sleep(600 * time.Millisecond)
		rs.mustDo(acquireOp(sess, "idle", false))
		time.Sleep(600 * time.Millisecond)
		rs.mustDo(putOp("k", "v", ""))
	})
}

// Only a ready leader serves the stream; a follower refuses it at open with
// the not-leader error of the unary calls, naming the leader. A leader
// that loses leadership ends its streams the same way.
func TestStreamAtLeaderOnly(t *testing.T) {
	forEachTransport(t, func(t *testing.T, open streamOpener) {
		c := startCluster(t, 3, nil)
		leader := c.leader()
		follower := c.followers(leader)[0]
		waitFor(t, "the follower to know the leader's API", func() bool { return follower.leaderAPI() == leader.Addr() })
		_, err := open(t, context.Background(), "http://"+follower.Addr(), http.Header{fencev1.FollowLeaderHeader: {"1"}})
		var re *rpcerr.RemoteError
		if err = rpcerr.FromConnect(err); !errors.Is(err, fence.ErrUnavailable) || !errors.As(err, &re) || re.Detail.GetLeaderAddress() != leader.Addr() {
			t.Fatalf("a follower answered the stream with %v", err)
		}
		// Without the follow-leader header too: the stream is never forwarded.
		if _, err := open(t, context.Background(), "http://"+follower.Addr(), nil); !errors.Is(rpcerr.FromConnect(err), fence.ErrUnavailable) {
			t.Fatalf("a follower answered the stream with %v", err)
		}

		rs := mustOpen(t, open, leader)
		rs.session(10 * time.Second)
		if err := leader.node.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rs.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream outlived its leader's leadership")
		}
		if err := rpcerr.FromConnect(rs.err); !errors.Is(err, fence.ErrUnavailable) {
			t.Fatalf("the stream ended with %v", err)
		}
	})
}

// With auth on, the stream needs a credential at open, each operation the
// permission its unary call needs on the names it carries when it comes
// (a refused one changes nothing; a permission taken while the stream is
// open refuses the next), and the stream ends once its token is revoked.
func TestStreamAuth(t *testing.T) {
	forEachTransport(t, func(t *testing.T, open streamOpener) {
		s := startTestServer(t, nil)
		ctx := context.Background()
		anon := mustClient(t, s, "")
		root := mustClient(t, s, setupRoot(t, anon))
		token := addUser(t, anon, "worker", perm(client.PermLock, client.Write, "jobs/"), perm(client.PermKV, client.Read, "cfg/"))
		if err := root.AuthEnable(ctx); err != nil {
			t.Fatal(err)
		}
		url := "http://" + s.Addr()
		if _, err := open(t, ctx, url, nil); !errors.Is(rpcerr.FromConnect(err), fence.ErrAuthFailed) {
			t.Fatalf("a stream without a credential: %v", err)
		}
		rs, err := open(t, ctx, url, http.Header{"Authorization": {"Bearer " + token}})
		if err != nil {
			t.Fatal(err)
		}
		sess := rs.session(10 * time.Second)
		rs.mustDo(acquireOp(sess, "jobs/1", false))
		if err := streamErr(rs.do(acquireOp(sess, "billing", false))); !errors.Is(err, fence.ErrPermissionDenied) {
			t.Fatalf("an acquire outside the user's prefix: %v", err)
		}
		if err := streamErr(rs.do(putOp("cfg/x", "v", "k1"))); !errors.Is(err, fence.ErrPermissionDenied) {
			t.Fatalf("a put with read access only: %v", err)
		}
		if locks, err := root.Locks(ctx, "billing"); err != nil || len(locks) != 0 {
			t.Fatalf("a refused acquire changed the state: %v %v", locks, err)
		}
		if kv, err := root.KV().Get(ctx, "cfg/x"); err != nil || kv != nil {
			t.Fatalf("a refused put changed the state: %v %v", kv, err)
		}
		// Each operation is checked against the auth state it meets, not
		// the one the stream opened in.
		get := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Get{Get: &fencev1.GetRequest{Key: "cfg/x"}}}
		rs.mustDo(get)
		if err := root.RoleRevoke(ctx, "worker", perm(client.PermKV, client.Read, "cfg/")); err != nil {
			t.Fatal(err)
		}
		if err := streamErr(rs.do(get)); !errors.Is(err, fence.ErrPermissionDenied) {
			t.Fatalf("a get on the open stream after its permission was taken: %v", err)
		}
		tokens, err := root.Tokens(ctx, "worker")
		if err != nil {
			t.Fatal(err)
		}
		if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rs.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream of a revoked token stayed open")
		}
		if err := rpcerr.FromConnect(rs.err); !errors.Is(err, fence.ErrAuthFailed) {
			t.Fatalf("the stream ended with %v", err)
		}
	})
}

// A client's stream moves with the leader: when the leader stops, the
// operations in flight are retried at the new leader, on a stream opened
// there, and the sessions live on.
func TestClusterStreamFollowsLeader(t *testing.T) {
	c := startCluster(t, 3, nil)
	cl := c.client()
	ctx := context.Background()
	sess, m, g := mustHoldLock(t, cl, 5*time.Second, "moving")
	streams := func(s *Server) float64 { return scrape(t, "http://"+s.Addr()+"/metrics")["fence_streams"] }
	old := c.leader()
	if n := streams(old); n != 1 {
		t.Fatalf("the leader has %v streams open", n)
	}
	// An acquire blocked on the stream when the leader goes.
	waiter, err := cl.NewSession(ctx, client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := client.NewMutex(waiter, "moving").Lock(ctx)
		got <- err
	}()
	waitFor(t, "the waiter to queue", func() bool { return waitersOf(old, "moving") == 1 })
	c.stop(old.cfg.NodeID)
	leader := c.leader()
	if _, err := cl.KV().Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream at the new leader", func() bool { return streams(leader) == 1 })
	time.Sleep(2 * time.Second) // keepalive rounds at the new leader
	if sess.Err() != nil || g.Err() != nil {
		t.Fatalf("the session did not survive the leader's change: %v", sess.Err())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not granted at the new leader")
	}
	for _, f := range c.followers(leader) {
		if n := streams(f); n != 0 {
			t.Fatalf("follower %s has %v streams", f.cfg.NodeID, n)
		}
	}
}

// A term begun while the one before was never ended (raft drops the
// notice of a lost leadership won again before it is read) ends the one
// before, so that the streams of that term end.
func TestLeaderTermBeginEndsTheTermBefore(t *testing.T) {
	var lt leaderTerm
	lt.begin()
	first := lt.current()
	lt.begin()
	select {
	case <-first:
	default:
		t.Fatal("the earlier term's channel is still open")
	}
	second := lt.current()
	lt.over()
	select {
	case <-second:
	default:
		t.Fatal("over left the term open")
	}
}

// The operations in flight on one connection are bounded all its streams
// together (MaxStreamOps): a client that opens many streams on one
// connection gets no more than one stream's worth of the node, and waits,
// read no further, while the node serves every other connection.
func TestStreamOpsBoundedPerConnection(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.MaxStreamOps = 2 })
	url := "http://" + s.Addr()
	hc := h2c(nil)
	a, err := openStreamOn(t, context.Background(), hc, url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := openStreamOn(t, context.Background(), hc, url)
	if err != nil {
		t.Fatal(err)
	}
	if a.opened.GetMaxInFlight() != 2 {
		t.Fatalf("StreamOpened = %v, want MaxInFlight 2", a.opened)
	}
	holder, waiter := a.session(time.Hour), a.session(time.Hour)
	held := a.mustDo(acquireOp(holder, "l1", true)).GetAcquire()
	a.mustDo(acquireOp(holder, "l2", true))

	// Two acquires blocked on stream a take the connection's two slots.
	_, w1 := a.start(acquireOp(waiter, "l1", false))
	_, w2 := a.start(acquireOp(waiter, "l2", false))
	waitFor(t, "both acquires to queue", func() bool { return waitersOf(s, "l1") == 1 && waitersOf(s, "l2") == 1 })
	_, put := b.start(putOp("k", "v", ""))
	select {
	case resp := <-put:
		t.Fatalf("an operation ran on the connection past its bound of 2: %v", resp)
	case <-time.After(300 * time.Millisecond):
	}
	// Another connection is served meanwhile.
	mustOpenStream(t, s).mustDo(putOp("other", "v", ""))

	// A grant ends one blocked acquire, and frees its slot for b's put.
	if _, err := newAPI(t, s).locks.Release(context.Background(), connect.NewRequest(&fencev1.ReleaseRequest{
		SessionId: holder.GetSessionId(), SessionSecret: holder.GetSessionSecret(), Lock: "l1", Token: held.GetToken(),
	})); err != nil {
		t.Fatal(err)
	}
	if resp := a.await(w1); resp.GetAcquire().GetToken() <= held.GetToken() {
		t.Fatalf("the waiter's acquire = %v, want a grant after token %d", resp, held.GetToken())
	}
	if resp := b.await(put); resp.GetError() != nil {
		t.Fatalf("put, once a slot was free: %v", streamErr(resp))
	}
	select {
	case resp := <-w2:
		t.Fatalf("the acquire of a held lock was answered: %v", resp)
	default:
	}
}
