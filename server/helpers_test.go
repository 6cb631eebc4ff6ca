package server

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

// startTestServer runs a real node (raft on a temp dir, loopback ports) and
// returns it once it is a ready leader.
func startTestServer(tb testing.TB, edit func(*Config)) *Server {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	return mustStart(tb, cfg)
}

// startWithAPI is startTestServer that also returns a raw API client of
// the server (newAPI).
func startWithAPI(tb testing.TB, edit func(*Config)) (*Server, *api) {
	tb.Helper()
	s := startTestServer(tb, edit)
	return s, newAPI(tb, s)
}

func mustStart(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	s, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	waitFor(tb, "a ready leader", s.leaderReady.Load)
	return s
}

// mustHoldLock creates a session of cl with ttl and takes lock in it.
func mustHoldLock(tb testing.TB, cl *client.Client, ttl time.Duration, lock string) (*client.Session, *client.Mutex, *client.Grant) {
	tb.Helper()
	ctx := context.Background()
	sess, err := cl.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		tb.Fatal(err)
	}
	m := client.NewMutex(sess, lock)
	g, err := m.Lock(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return sess, m, g
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	waitForWithin(tb, 10*time.Second, what, cond)
}

func waitForWithin(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// api is a raw Connect client of one server, so tests see the wire API.
// It remembers the secret of every session it creates and sends it with
// every request that names the session and no secret (see secretFiller).
type api struct {
	tb       testing.TB
	sessions fencev1connect.SessionServiceClient
	locks    fencev1connect.LockServiceClient
	kv       fencev1connect.KVServiceClient
	secrets  *secretBook
}

func newAPI(tb testing.TB, s *Server) *api {
	return newAPIAt(tb, "http://"+s.Addr(), &secretBook{m: map[uint64]string{}})
}

// newAPIAt is newAPI for a URL, sharing book with other clients.
func newAPIAt(tb testing.TB, url string, book *secretBook) *api {
	opt := connect.WithInterceptors(book)
	return &api{
		tb:       tb,
		sessions: fencev1connect.NewSessionServiceClient(http.DefaultClient, url, opt),
		locks:    fencev1connect.NewLockServiceClient(http.DefaultClient, url, opt),
		kv:       fencev1connect.NewKVServiceClient(http.DefaultClient, url, opt),
		secrets:  book,
	}
}

// secretBook is a client interceptor that learns the secrets of the
// sessions created through it and fills session_secret in the requests
// that name one of them without a secret, as the Go client does.
type secretBook struct {
	mu sync.Mutex
	m  map[uint64]string
}

func (b *secretBook) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if msg, ok := req.Any().(proto.Message); ok {
			b.fill(msg.ProtoReflect())
		}
		resp, err := next(ctx, req)
		if err == nil {
			if r, ok := resp.Any().(*fencev1.CreateSessionResponse); ok {
				b.mu.Lock()
				b.m[r.GetSessionId()] = r.GetSessionSecret()
				b.mu.Unlock()
			}
		}
		return resp, err
	}
}

func (b *secretBook) fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	id, secret := fields.ByName("session_id"), fields.ByName("session_secret")
	if id == nil || secret == nil || m.Get(secret).String() != "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.m[m.Get(id).Uint()]; ok {
		m.Set(secret, protoreflect.ValueOfString(s))
	}
}

func (b *secretBook) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (b *secretBook) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// secret returns the secret of a session created through the book.
func (b *secretBook) secret(id uint64) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id]
}

func (a *api) session(ttl time.Duration) uint64 {
	a.tb.Helper()
	resp, err := a.sessions.CreateSession(context.Background(), connect.NewRequest(&fencev1.CreateSessionRequest{Ttl: durationpb.New(ttl)}))
	if err != nil {
		a.tb.Fatalf("CreateSession: %v", err)
	}
	return resp.Msg.GetSessionId()
}

func (a *api) acquire(ctx context.Context, req *fencev1.AcquireRequest) (uint64, error) {
	resp, err := a.locks.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetToken(), nil
}

func (a *api) mustAcquire(session uint64, lock string) uint64 {
	a.tb.Helper()
	token, err := a.acquire(context.Background(), &fencev1.AcquireRequest{SessionId: session, Lock: lock})
	if err != nil {
		a.tb.Fatalf("Acquire(%d, %q): %v", session, lock, err)
	}
	return token
}

func (a *api) release(session uint64, lock string, token uint64) error {
	_, err := a.locks.Release(context.Background(), connect.NewRequest(&fencev1.ReleaseRequest{SessionId: session, Lock: lock, Token: token}))
	return err
}

func (a *api) keepAlive(session uint64) error {
	_, err := a.sessions.KeepAlive(context.Background(), connect.NewRequest(&fencev1.KeepAliveRequest{SessionId: session}))
	return err
}

func (a *api) lock(name string) *fencev1.LockInfo {
	a.tb.Helper()
	resp, err := a.locks.ListLocks(context.Background(), connect.NewRequest(&fencev1.ListLocksRequest{Prefix: name}))
	if err != nil {
		a.tb.Fatalf("ListLocks: %v", err)
	}
	for _, l := range resp.Msg.GetLocks() {
		if l.GetName() == name {
			return l
		}
	}
	return &fencev1.LockInfo{Name: name}
}

// mustHaveNoWaiters fails the test with why and the waiters if lock has
// any.
func (a *api) mustHaveNoWaiters(lock, why string) {
	a.tb.Helper()
	if w := a.lock(lock).GetWaiters(); len(w) != 0 {
		a.tb.Fatalf("%s: %v", why, w)
	}
}

// mustOpenWatch opens a watch of prefix through kv and returns it once its
// first answer came, which says that it started; if either fails, the
// test fails with what and the error. Closing it is the caller's.
func mustOpenWatch(tb testing.TB, ctx context.Context, kv fencev1connect.KVServiceClient, prefix, what string) *connect.ServerStreamForClient[fencev1.WatchResponse] {
	tb.Helper()
	stream, err := kv.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: prefix}))
	if err != nil {
		tb.Fatal(err)
	}
	if !stream.Receive() {
		err := stream.Err()
		stream.Close()
		tb.Fatalf("%s: %v", what, err)
	}
	return stream
}

// pending is an Acquire running in the background.
type pending struct {
	token uint64
	err   error
	done  chan struct{}
}

func (a *api) acquireAsync(ctx context.Context, req *fencev1.AcquireRequest) *pending {
	p := &pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.token, p.err = a.acquire(ctx, req)
	}()
	return p
}

// acquireQueued runs req in the background, as acquireAsync does, and
// waits until it is queued as the only waiter of its lock; who names the
// caller in the failure if it never is.
func (a *api) acquireQueued(ctx context.Context, who string, req *fencev1.AcquireRequest) *pending {
	a.tb.Helper()
	p := a.acquireAsync(ctx, req)
	waitFor(a.tb, who+" to queue", func() bool { return len(a.lock(req.GetLock()).GetWaiters()) == 1 })
	return p
}

// result waits for the Acquire to return, failing after 10 s.
func (p *pending) result(tb testing.TB) (uint64, error) {
	tb.Helper()
	select {
	case <-p.done:
		return p.token, p.err
	case <-time.After(10 * time.Second):
		tb.Fatal("Acquire did not return within 10s")
		return 0, nil
	}
}

func (p *pending) returned() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

// listenBelowEphemeral listens on a loopback port below the kernel's
// ephemeral range, for an address a node must bind again after a restart:
// a port from the range (":0") may meanwhile be lent to any outgoing
// connection, of this test or another, and held by it for seconds.
func listenBelowEphemeral(tb testing.TB) net.Listener {
	tb.Helper()
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if low > 11000 {
		for range 200 {
			port := 10000 + rand.IntN(low-10000)
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
				return ln
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}

// startOnFakeClock is startTestServer with a fake clock, which it returns
// with the server.
func startOnFakeClock(tb testing.TB) (*Server, *clock.Fake) {
	tb.Helper()
	clk := clock.NewFake()
	return startTestServer(tb, func(c *Config) { c.Clock = clk }), clk
}

// mustAuthEnable turns auth on through c, failing the test if it cannot.
func mustAuthEnable(tb testing.TB, c *client.Client) {
	tb.Helper()
	if err := c.AuthEnable(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// mustRootClient sets up user root on s (setupRoot) while auth is off and
// returns a client of root and root's token.
func mustRootClient(tb testing.TB, s *Server) (root *client.Client, rootToken string) {
	tb.Helper()
	rootToken = setupRoot(tb, mustClient(tb, s, ""))
	return mustClient(tb, s, rootToken), rootToken
}

// enableAuthWithUser sets up user root (setupRoot) and user with perms
// (addUser) on s while auth is off, then turns auth on. It returns a
// client of root, root's token and the user's token.
func enableAuthWithUser(tb testing.TB, s *Server, user string, perms ...*client.Permission) (root *client.Client, rootToken, userToken string) {
	tb.Helper()
	root, rootToken = mustRootClient(tb, s)
	userToken = addUser(tb, root, user, perms...)
	mustAuthEnable(tb, root)
	return root, rootToken, userToken
}

// mustNewSession creates a session of cl with opts, failing the test if it
// cannot. Closing it is the caller's.
func mustNewSession(tb testing.TB, cl *client.Client, opts ...client.SessionOption) *client.Session {
	tb.Helper()
	sess, err := cl.NewSession(context.Background(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return sess
}

// mustLock takes m, failing the test if it cannot, and returns the grant.
func mustLock(tb testing.TB, m *client.Mutex) *client.Grant {
	tb.Helper()
	g, err := m.Lock(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// mustUnlock releases m, failing the test if it cannot.
func mustUnlock(tb testing.TB, m *client.Mutex) {
	tb.Helper()
	if err := m.Unlock(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// nodeTLS is the TLS configuration of a node serving as name with a
// certificate from ca, that requires every caller to show a certificate
// from ca.
func nodeTLS(tb testing.TB, ca *testtls.CA, name string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{ca.Cert(tb, name)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// peerTLS is nodeTLS for a node that also dials its peers, and trusts ca
// for that.
func peerTLS(tb testing.TB, ca *testtls.CA, name string) *tls.Config {
	cfg := nodeTLS(tb, ca, name)
	cfg.RootCAs = ca.Pool()
	return cfg
}

// clientTLS is the TLS configuration of a client that trusts ca and shows
// the certificate ca issues to name.
func clientTLS(tb testing.TB, ca *testtls.CA, name string) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Cert(tb, name)}}
}
