package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/wire"
	"github.com/fencelock/fence/server"
)

// metric returns one sample of a node's /metrics, as written
// (`fence_stream_requests_total{op="keep_alive"}`); 0 when absent.
func metric(t *testing.T, srv *server.Server, sample string) float64 {
	t.Helper()
	return metricAt(t, http.DefaultClient, "http://"+srv.Addr()+"/metrics", sample)
}

// metricAt is metric of the /metrics at url, fetched with hc.
func metricAt(t *testing.T, hc *http.Client, url, sample string) float64 {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), " "); ok && name == sample {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

func streamOps(t *testing.T, srv *server.Server, op string) float64 {
	return metric(t, srv, `fence_stream_requests_total{op="`+op+`"}`)
}

// streamOpens is how many streams srv opened over transport ("framed",
// "http2").
func streamOpens(t *testing.T, srv *server.Server, transport string) float64 {
	return metric(t, srv, `fence_stream_opens_total{transport="`+transport+`"}`)
}

func unaryCalls(t *testing.T, srv *server.Server, procedure string) float64 {
	return metric(t, srv, `fence_requests_total{code="ok",procedure="`+procedure+`"}`) - streamOpsAs(t, srv, procedure)
}

// streamOpsAs is what the stream counted under procedure: stream
// operations are counted under their unary call's procedure too.
func streamOpsAs(t *testing.T, srv *server.Server, procedure string) float64 {
	op := map[string]string{
		fencev1connect.SessionServiceCreateSessionProcedure: "create_session",
		fencev1connect.LockServiceAcquireProcedure:          "acquire",
		fencev1connect.KVServicePutProcedure:                "put",
	}[procedure]
	return streamOps(t, srv, op)
}

// lockCycle creates a session, locks, writes, checks, unlocks and closes.
// lockCycleUnary runs lockCycle on c and checks that its acquire went
// unary: no acquire on a stream, and at least unary acquires in all on
// srv so far.
func lockCycleUnary(t *testing.T, srv *server.Server, c *Client, unary float64, who string) {
	t.Helper()
	before := streamOps(t, srv, "acquire")
	lockCycle(t, c)
	if n := streamOps(t, srv, "acquire"); n != before {
		t.Fatalf("%s sent %v acquires on a stream", who, n-before)
	}
	if n := unaryCalls(t, srv, fencev1connect.LockServiceAcquireProcedure); n < unary {
		t.Fatalf("%s: %v unary acquires, want at least %v", who, n, unary)
	}
}

func lockCycle(t *testing.T, c *Client) {
	t.Helper()
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMutex(s, "cycle")
	g := mustLock(t, ctx, m)
	mustPut(t, ctx, c.KV(), "cycle", []byte("v"), WithGrant(g))
	if res, err := c.Check(ctx, "cycle", g.Token()); err != nil || !res.Current {
		t.Fatalf("Check = %+v, %v", res, err)
	}
	if kv, err := c.KV().Get(ctx, "cycle"); err != nil || string(kv.GetValue()) != "v" {
		t.Fatalf("Get = %v, %v", kv, err)
	}
	if _, err := NewMutex(s, "other").TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Delete(ctx, "cycle", WithGrant(g)); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, ctx, m)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// By default a client's operations go on the stream, framed on its
// connection, not as unary calls; WithoutFramedStream carries the stream
// over HTTP/2; WithoutStream sends unary calls, as before.
func TestOperationsGoOnTheStream(t *testing.T) {
	srv := startServer(t, nil)
	lockCycle(t, mustClient(t, srv, nil))
	for _, op := range []string{"create_session", "acquire", "put", "check", "get", "release", "delete", "close_session"} {
		if n := streamOps(t, srv, op); n < 1 {
			t.Errorf("no %s on the stream", op)
		}
	}
	if n := unaryCalls(t, srv, fencev1connect.LockServiceAcquireProcedure); n != 0 {
		t.Errorf("%v unary acquires", n)
	}
	if framed, h2 := streamOpens(t, srv, "framed"), streamOpens(t, srv, "http2"); framed != 1 || h2 != 0 {
		t.Errorf("streams opened: %v framed, %v over HTTP/2; want one framed", framed, h2)
	}

	h2 := mustNew(t, WithEndpoints(srv.Addr()), WithoutFramedStream())
	before := streamOps(t, srv, "acquire")
	lockCycle(t, h2)
	if n := streamOps(t, srv, "acquire"); n <= before {
		t.Error("WithoutFramedStream sent no acquire on the stream")
	}
	if n := streamOpens(t, srv, "http2"); n != 1 {
		t.Errorf("WithoutFramedStream opened %v streams over HTTP/2, want 1", n)
	}

	c := mustNew(t, WithEndpoints(srv.Addr()), WithoutStream())
	lockCycleUnary(t, srv, c, 2, "WithoutStream")
}

// The keepalives of many sessions go in a few messages: 200 sessions with
// a TTL of 2s (a renewal every 667ms) for 2.5s would be 600 unary calls.
func TestKeepAlivesShareMessages(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	mustSession(t, c, 2*time.Second) // the stream and its goroutines
	base := runtime.NumGoroutine()
	var sessions []*Session
	for range 200 {
		sessions = append(sessions, mustSession(t, c, 2*time.Second))
	}
	// A session's keepalive schedule is two timers, not a goroutine.
	if n := runtime.NumGoroutine() - base; n > 50 {
		t.Errorf("200 sessions took %d more goroutines", n)
	}
	before := metric(t, srv, `fence_requests_total{code="ok",procedure="`+fencev1connect.SessionServiceKeepAliveProcedure+`"}`)
	time.Sleep(2500 * time.Millisecond)
	messages := streamOps(t, srv, "keep_alive")
	renewals := metric(t, srv, `fence_requests_total{code="ok",procedure="`+fencev1connect.SessionServiceKeepAliveProcedure+`"}`) - before
	for _, s := range sessions {
		if s.Err() != nil {
			t.Fatalf("session %d ended: %v", s.ID(), s.Err())
		}
	}
	if renewals < 400 {
		t.Fatalf("%v renewals of 200 sessions in 2.5s; want at least 400", renewals)
	}
	// Each message renews many sessions: a few messages per keepalive
	// interval, whatever the sessions' phases. (How few depends on how far
	// apart the sessions were created and on how loaded the machine is, so
	// the bound is on sessions per message, not on messages: one keepalive
	// a session would renew one.)
	if messages == 0 || renewals/messages < 10 {
		t.Fatalf("%v keepalive messages renewed 200 sessions %v times: want at least 10 renewals a message", messages, renewals)
	}
	t.Logf("%v renewals in %v messages", renewals, messages)
	// Every session still acts: each holds a lock.
	for _, s := range sessions[:5] {
		if _, err := NewMutex(s, "k"+strconv.FormatUint(s.ID(), 10)).TryLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// cutter is a TCP proxy whose connections can be cut while their answers
// are held back: what the server sends is dropped once it is armed, and
// cut closes every connection, as a network that fails between a
// request's arrival and its answer's.
type cutter struct {
	ln    net.Listener
	armed atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func newCutter(t *testing.T, target string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutter{ln: ln}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go io.Copy(out, in)
			go p.answers(in, out)
		}
	}()
	return p
}

func (p *cutter) answers(in, out net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 && !p.armed.Load() {
			if _, werr := in.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			in.Close()
			return
		}
	}
}

// cut closes every connection and disarms.
func (p *cutter) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	p.armed.Store(false)
}

func (p *cutter) addr() string { return p.ln.Addr().String() }

// A stream cut after the server applied an operation and before its
// answer arrived: the client retries on a new stream, and nothing is
// applied twice (the put's idempotency key, the acquire's request id).
func TestStreamCutMidOperationAppliesOnce(t *testing.T) {
	srv := startServer(t, nil)
	p := newCutter(t, srv.Addr())
	c := mustNew(t, WithEndpoints(p.addr()))
	observer := mustClient(t, srv, nil)
	ctx := context.Background()
	s, err := c.NewSession(ctx, WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	// cutOnce arms the proxy, runs op, and cuts once applied reports that
	// the server applied it.
	cutOnce := func(what string, op func() error, applied func() bool) {
		t.Helper()
		before := streamOps(t, srv, what)
		p.armed.Store(true)
		done := make(chan error, 1)
		go func() { done <- op() }()
		deadline := time.Now().Add(5 * time.Second)
		for !applied() {
			if time.Now().After(deadline) {
				t.Fatalf("%s was not applied", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
		p.cut()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := streamOps(t, srv, what) - before; n < 2 {
			t.Fatalf("%s was sent %v times: the cut missed it", what, n)
		}
	}

	var rev uint64
	cutOnce("put", func() (err error) {
		rev, err = c.KV().Put(ctx, "k", []byte("v"))
		return err
	}, func() bool {
		kv, err := observer.KV().Get(ctx, "k")
		return err == nil && kv != nil
	})
	kv, err := observer.KV().Get(ctx, "k")
	if err != nil || kv.GetVersion() != 1 || kv.GetModRevision() != rev {
		t.Fatalf("after a retried put: %v (answered revision %d), %v; want version 1", kv, rev, err)
	}

	var g *Grant
	lastToken := func() uint64 {
		st, err := observer.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.GetLastToken()
	}
	tokenBefore := lastToken()
	cutOnce("acquire", func() (err error) {
		g, err = NewMutex(s, "once").Lock(ctx)
		return err
	}, func() bool { return lastToken() > tokenBefore })
	if g.Token() != tokenBefore+1 || lastToken() != tokenBefore+1 {
		t.Fatalf("the retried acquire answered token %d; last token %d, %d before", g.Token(), lastToken(), tokenBefore)
	}
	locks, err := observer.Locks(ctx, "once")
	if err != nil || len(locks) != 1 || len(locks[0].GetHolders()) != 1 || locks[0].GetHolders()[0].GetToken() != g.Token() {
		t.Fatalf("after a retried acquire: %v, %v", locks, err)
	}
}

// unaryOnly serves srv's API without the stream, as a node of a version
// before it does: it answers the stream's path 404 (Unimplemented).
func unaryOnly(t *testing.T, srv *server.Server) string {
	t.Helper()
	target, _ := url.Parse("http://" + srv.Addr())
	proxy := httputil.NewSingleHostReverseProxy(target)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/"+fencev1connect.StreamServiceName+"/") {
			http.NotFound(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	ts := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	ts.Config.Protocols = &p
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// Where the stream is unavailable the client sends unary calls: a node
// that does not serve it, and a custom HTTP client that speaks HTTP/1.1.
func TestStreamFallsBackToUnary(t *testing.T) {
	srv := startServer(t, nil)
	older := mustNew(t, WithEndpoints(unaryOnly(t, srv)))
	lockCycle(t, older)
	if n := streamOps(t, srv, "acquire"); n != 0 {
		t.Fatalf("%v acquires on a stream", n)
	}
	if !older.endpointAt(0).unaryOnly.Load() {
		t.Fatal("the endpoint without the stream is not remembered")
	}

	h1 := mustNew(t, WithEndpoints(srv.Addr()), WithHTTPClient(&http.Client{Transport: &http.Transport{}}))
	lockCycleUnary(t, srv, h1, 2, "an HTTP/1.1 client")
}

// A blocked Lock on the stream does not hold up the session's other
// operations, and a cancelled one leaves nothing queued.
func TestBlockedLockHoldsUpNothing(t *testing.T) {
	c := clientOfNewServer(t)
	ctx := context.Background()
	a, b := mustSession(t, c, 5*time.Second), mustSession(t, c, 5*time.Second)
	ga := mustLock(t, ctx, NewMutex(a, "hot"))
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := NewMutex(b, "hot").Lock(wctx)
		waited <- err
	}()
	waitFor(t, func() bool {
		locks, err := c.Locks(ctx, "hot")
		return err == nil && len(locks) == 1 && len(locks[0].GetWaiters()) == 1
	})
	for i := range 20 {
		mustPut(t, ctx, c.KV(), "k", []byte(strconv.Itoa(i)))
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Lock: %v", err)
	}
	waitFor(t, func() bool {
		locks, err := c.Locks(ctx, "hot")
		return err == nil && len(locks) == 1 && len(locks[0].GetWaiters()) == 0
	})
	if res, err := c.Check(ctx, "hot", ga.Token()); err != nil || !res.Current {
		t.Fatalf("Check = %+v, %v", res, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Close ends the stream; calls made after it still work, as unary calls,
// as they did before the stream (Close only released connections).
func TestCallsAfterCloseGoUnary(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	lockCycle(t, c)
	c.Close()
	before := streamOps(t, srv, "acquire")
	lockCycle(t, c)
	if n := streamOps(t, srv, "acquire"); n != before {
		t.Fatalf("%v acquires on a stream after Close", n-before)
	}
}

// A node that accepts connections and never answers (paused with SIGSTOP)
// holds up the opening of a stream there only for the calls that wait on
// it, each within its own attempt: a keepalive with a long attempt (a
// quarter of a 40s TTL) opening a stream at the paused node does not keep
// a call with a 1s attempt from moving on to a node that answers.
func TestPausedNodeHoldsUpOnlyItsOwnAttempts(t *testing.T) {
	srv := startServer(t, nil)
	c := mustNew(t, WithEndpoints(hungListener(t), srv.Addr()), WithAttemptTimeout(time.Second))
	now := time.Now()
	renewingSession(t, c, 1, 40*time.Second, now, now.Add(30*time.Second)) // opens at the paused node, for 10s
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	s, err := c.NewSession(ctx, WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("NewSession behind a stream opening at a paused node, after %v: %v", time.Since(start), err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("NewSession took %v behind a stream opening at a paused node, want about its 1s attempt", took)
	}
}

// A proxy that speaks only HTTP/1.1 in front of a node (a load balancer
// without HTTP/2 to its backends, say), and that passes upgrades on (as
// Go's, nginx's with its Upgrade lines, HAProxy's do), carries the framed
// stream.
func TestHTTP1ProxyCarriesTheFramedStream(t *testing.T) {
	srv := startServer(t, nil)
	target, _ := url.Parse("http://" + srv.Addr())
	proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(target)) // HTTP/1.1 only
	t.Cleanup(proxy.Close)
	c := mustNew(t, WithEndpoints(proxy.Listener.Addr().String()))
	lockCycle(t, c)
	if n := streamOps(t, srv, "acquire"); n < 1 {
		t.Fatalf("%v acquires on a stream through an HTTP/1.1 proxy that passes upgrades", n)
	}
	if n := unaryCalls(t, srv, fencev1connect.LockServiceAcquireProcedure); n != 0 {
		t.Fatalf("%v unary acquires", n)
	}
}

// A proxy that speaks only HTTP/1.1 and drops upgrades answers the framed
// stream's upgrade as a plain request, and the Connect stream's h2c
// preface in HTTP/1.1, a transport failure as for a node going away; but
// the node answers unary calls through it, so the client sends it unary
// calls.
func TestHTTP1ProxyGetsUnaryCalls(t *testing.T) {
	srv := startServer(t, nil)
	target, _ := url.Parse("http://" + srv.Addr())
	reverse := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Upgrade")
		r.Header.Del("Connection")
		reverse.ServeHTTP(w, r)
	})) // HTTP/1.1 only, no upgrades
	t.Cleanup(proxy.Close)
	c := mustNew(t, WithEndpoints(proxy.Listener.Addr().String()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("NewSession through an HTTP/1.1 proxy: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if c.streamTo(c.endpointAt(0)) {
		t.Error("the client still opens streams through the HTTP/1.1 proxy")
	}
	lockCycleUnary(t, srv, c, 1, "a client through an HTTP/1.1 proxy")
}

// Callers that give up (their contexts ending before, during and just
// after their writes) do not break the stream the client's other
// operations share: a framed write, once begun, is finished for all the
// frames in it.
func TestCallersGivingUpKeepTheStream(t *testing.T) {
	srv := startServer(t, nil)
	c := mustClient(t, srv, nil)
	ctx := context.Background()
	mustPut(t, ctx, c.KV(), "k", []byte("v"))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				cctx, cancel := context.WithTimeout(ctx, time.Duration((i*200+j)%50)*10*time.Microsecond)
				_, _ = c.KV().Get(cctx, "k")
				cancel()
			}
		})
	}
	wg.Wait()
	if _, err := c.KV().Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := streamOpens(t, srv, "framed"); n != 1 {
		t.Fatalf("the client opened %v framed streams, want 1: callers that gave up broke the one it had", n)
	}
}

// A client that reads all the time but writes nothing still pings its
// framed stream: the node hears nothing else from it, and drops a stream
// it hears nothing on. The node here answers the stream's open and its
// first operation, then sends a frame every 20ms.
func TestFramedStreamPingsWhileOnlyReading(t *testing.T) {
	savedPing, savedDead := framedPingAfter, framedDeadAfter
	framedPingAfter, framedDeadAfter = 300*time.Millisecond, 1500*time.Millisecond
	t.Cleanup(func() { framedPingAfter, framedDeadAfter = savedPing, savedDead })
	node := make(chan *wire.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + wire.Protocol + "\r\n\r\n")
		_ = brw.Flush()
		fc := wire.NewConn(conn, brw.Reader, 1<<20, time.Second)
		if fc.Write(&fencev1.StreamResponse{Result: &fencev1.StreamResponse_Opened{Opened: &fencev1.StreamOpened{MaxInFlight: 8}}}) != nil {
			return
		}
		req := &fencev1.StreamRequest{}
		if fc.Read(req) != nil || fc.Write(&fencev1.StreamResponse{Id: req.GetId(), Result: &fencev1.StreamResponse_Get{Get: &fencev1.GetResponse{}}}) != nil {
			return
		}
		node <- fc
		go func() {
			for fc.Read(&fencev1.StreamRequest{}) == nil { // answers pings
			}
		}()
		for fc.Write(&fencev1.StreamResponse{Id: 1 << 40}) == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}))
	t.Cleanup(srv.Close)
	c := mustNew(t, WithEndpoints(strings.TrimPrefix(srv.URL, "http://")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.KV().Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	fc := <-node
	// The client checks every 1.2s (the dead bound less the ping's), and
	// pings once it wrote nothing for 300ms: the node hears from it at
	// least every 1.5s.
	time.Sleep(4 * time.Second)
	if idle := fc.ReadIdle(); idle > 2500*time.Millisecond {
		t.Fatalf("the node heard nothing from the client for %v, though it pings after %v of writing nothing", idle, framedPingAfter)
	}
}
