package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/ops"
	"github.com/fencelock/fence/internal/rpcerr"
)

// DefaultEndpoint is where `fence serve` listens by default.
const DefaultEndpoint = "127.0.0.1:7420"

// Client talks to a fence service. It is safe for concurrent use; one
// Client per process is enough. Calls that fail because a node is not the
// leader or cannot be reached move on to the next endpoint and are retried,
// with backoff; only calls that are safe to repeat are retried.
//
// How long a call retries depends on whether the client has talked to its
// group. Until one of its calls has succeeded, a call that no node
// answers at all (every connection refused, or not made, or not answered
// in time) fails after the dial timeout (WithDialTimeout, 1s by default,
// as `fence --dial-timeout`) with ErrUnreachable, which names the
// endpoints it tried: there is most likely no node there (no `fence
// serve` yet, wrong endpoints), and waiting longer would only hide that.
// Once a call has succeeded the group is known to exist, and a call that
// no node answers is taken for one that meets a restart (a node's, or a
// single-node group's): it retries for the retry budget (WithRetryBudget,
// 15s by default) and its context, then fails with ErrUnreachable. A call
// that a node answers with "no leader" or "not the leader" retries for
// the budget, first call or not: the group is there, electing. This is
// etcd's choice (its DialTimeout bounds the first connection; calls then
// wait for a lost one to come back), and Consul's servers hold calls
// through an election the same way (rpc_hold_timeout). A session's
// keepalives retry on their own until its safe-until, whatever the call
// does. A program started together with its nodes (one compose file, a
// test that starts its server after its client) waits for them with a
// longer dial timeout: WithDialTimeout(15*time.Second).
type Client struct {
	opts  options
	http  *http.Client
	copts []connect.ClientOption
	// streamHTTP carries the session stream, over HTTP/2.
	streamHTTP  *http.Client
	streamConns connSet // streamHTTP's, when it is the client's own
	streams     *streams
	keepAlives  *keepAliver
	wake        *wakeWatch

	// cluster is the id of the group the client talks to, once known.
	cluster atomic.Pointer[string]
	// answered is set once a call succeeded: from then on, nodes that do
	// not answer are taken for restarting, not missing, and calls retry
	// for the budget rather than the dial timeout.
	answered atomic.Bool

	mu        sync.Mutex
	endpoints []*endpoint // grows when a leader the client did not know is named
	current   int         // index of the endpoint that answered last
}

type endpoint struct {
	url      string
	sessions fencev1connect.SessionServiceClient
	locks    fencev1connect.LockServiceClient
	cluster  fencev1connect.ClusterServiceClient
	kv       fencev1connect.KVServiceClient
	auth     fencev1connect.AuthServiceClient
	stream   fencev1connect.StreamServiceClient
	// clk is the client's clock, for the instants below.
	clk clock.Clock
	// unary runs the operations of internal/ops as their unary calls.
	unary map[protoreflect.Name]ops.Caller
	// unaryOnly is set once the node answered that it does not serve the
	// session stream (an older version, or HTTP/1.1 on the way): its
	// operations go as unary calls from then on. noStreamUntil (unix
	// nanoseconds) does the same for a while after another failure to
	// open one.
	unaryOnly     atomic.Bool
	noStreamUntil atomic.Int64
	// noFramedUntil (unix nanoseconds) gives ep Connect's stream, not the
	// framed one, for a while after it did not switch to it.
	noFramedUntil atomic.Int64
	// silentUntil (unix nanoseconds) is set when an attempt here got no
	// answer in time: until then, retries pass this node over while
	// another may answer.
	silentUntil atomic.Int64
	// foreign is set once the node turned out to be of another group than
	// the client's: it is never used again.
	foreign atomic.Bool
}

// silentFor is how long a node that did not answer in time is passed
// over: about the time a group takes to elect a new leader and more.
const silentFor = 3 * time.Second

func (ep *endpoint) silent() bool {
	return ep.foreign.Load() || ep.clk.Now().UnixNano() < ep.silentUntil.Load()
}

type options struct {
	endpoints   []string
	httpClient  *http.Client
	clock       clock.Clock
	retryBudget time.Duration
	attempt     time.Duration
	dial        time.Duration
	grpc        bool
	tls         *tls.Config
	clusterID   string
	bearer      string
	noStream    bool
	noFramed    bool
}

// Option configures a Client.
type Option func(*options)

// WithEndpoints sets the nodes to talk to, as host:port or URLs
// (default 127.0.0.1:7420). Any node will do; the client finds the leader.
func WithEndpoints(endpoints ...string) Option {
	return func(o *options) { o.endpoints = endpoints }
}

// WithHTTPClient replaces the HTTP client, for custom dialing. It must
// speak HTTP/2 for gRPC (WithGRPC). The default speaks HTTP/1.1, or HTTP/2
// with WithGRPC; for TLS use WithTLS (with WithHTTPClient, also give
// endpoints as https:// URLs).
func WithHTTPClient(c *http.Client) Option {
	return func(o *options) { o.httpClient = c }
}

// WithRetryBudget bounds how long a call keeps retrying while no leader
// answers (default 15s): while the group elects one, or, once the client
// has talked to its group, while no node answers at all (a restart; see
// Client). The call's context bounds it too. 0 tries each endpoint once.
func WithRetryBudget(d time.Duration) Option {
	return func(o *options) { o.retryBudget = d }
}

// WithTLS talks to the nodes over TLS with config: RootCAs to verify their
// certificates (nil: the system's), Certificates to present one where the
// nodes require client certificates. Endpoints given as host:port, and the
// leader addresses nodes name, are reached over https.
func WithTLS(config *tls.Config) Option {
	return func(o *options) { o.tls = config }
}

// WithAttemptTimeout bounds each attempt of a call on one node (default
// 1s): a node that accepts the connection but does not answer in time
// (paused, its disk stuck, its VM half dead) is given up for the next one,
// as a node that refuses is. A blocked Lock waits in steps of the same
// length, each its own attempt, keeping its place in the queue. Retries
// are safe: writes carry idempotency keys and acquires request ids.
func WithAttemptTimeout(d time.Duration) Option {
	return func(o *options) { o.attempt = d }
}

// WithDialTimeout bounds how long a call of a client that has not yet
// talked to its group keeps trying while no node answers at all (every
// connection refused, or not made, or not answered in time) before it
// fails with ErrUnreachable (default 1s, as `fence --dial-timeout`):
// nothing is listening, so waiting longer rarely helps. A client started
// before its nodes (in the same compose file, or a test that starts its
// server later) gives the time they take to start, such as
// 15*time.Second. 0 waits for the whole retry budget. Once a call has
// succeeded the dial timeout no longer applies: see Client.
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) { o.dial = d }
}

// ErrUnreachable is a call's failure when no node answered it: within
// the dial timeout (WithDialTimeout) for a client that has not yet talked
// to its group, within the retry budget for one that has. Its message
// names the endpoints tried and what to do. It wraps fence.ErrUnavailable.
var ErrUnreachable = fmt.Errorf("%w: no fence node could be reached", fence.ErrUnavailable)

// unreachableHint ends an ErrUnreachable's message.
const unreachableHint = "is a node running? Start one with `fence serve`, or check the endpoints (--endpoints or FENCE_ENDPOINTS for the fence command, WithEndpoints in Go)"

// WithGRPC makes the client speak gRPC instead of the Connect protocol.
func WithGRPC() Option {
	return func(o *options) { o.grpc = true }
}

// withClock injects the clock of keepalives and "safe until" (its Missed
// too); tests use a fake.
func withClock(c clock.Clock) Option {
	return func(o *options) { o.clock = c }
}

// New returns a client for the given endpoints. It does not dial; the first
// call does.
func New(opts ...Option) (*Client, error) {
	o := options{endpoints: []string{DefaultEndpoint}, clock: clock.Real, retryBudget: 15 * time.Second, attempt: time.Second, dial: time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", fence.ErrInvalidArgument)
	}
	if o.attempt <= 0 {
		return nil, fmt.Errorf("%w: attempt timeout %v must be positive", fence.ErrInvalidArgument, o.attempt)
	}
	c := &Client{opts: o, http: o.httpClient}
	if c.http == nil {
		c.http = defaultHTTPClient(o.grpc, o.tls)
	}
	hc := *c.http // a copy: the caller's client is left as it was
	hc.Transport = plainToTLS{hc.Transport}
	c.http = &hc
	c.streamHTTP = c.http // a client of the caller's: HTTP/2 if it can
	if o.httpClient == nil {
		c.streamHTTP = streamHTTPClient(o.tls, &c.streamConns)
	}
	c.streams = &streams{c: c}
	c.keepAlives = &keepAliver{c: c, sessions: map[*Session]struct{}{}}
	c.wake = &wakeWatch{c: c}
	if o.clusterID != "" {
		c.cluster.Store(&o.clusterID)
	}
	copts := []connect.ClientOption{connect.WithInterceptors(followLeader{}, pinCluster{c}, bearerToken(o.bearer))}
	if o.grpc {
		copts = append(copts, connect.WithGRPC())
	}
	c.copts = copts
	for _, raw := range o.endpoints {
		url, err := c.endpointURL(raw)
		if err != nil {
			return nil, err
		}
		c.endpoints = append(c.endpoints, c.newEndpoint(url))
	}
	return c, nil
}

func (c *Client) newEndpoint(url string) *endpoint {
	unary := make(map[protoreflect.Name]ops.Caller, len(ops.All))
	for _, op := range ops.All {
		unary[op.Name()] = op.Caller(c.http, url, c.copts...)
	}
	return &endpoint{
		clk:      c.opts.clock,
		unary:    unary,
		url:      url,
		sessions: fencev1connect.NewSessionServiceClient(c.http, url, c.copts...),
		locks:    fencev1connect.NewLockServiceClient(c.http, url, c.copts...),
		cluster:  fencev1connect.NewClusterServiceClient(c.http, url, c.copts...),
		kv:       fencev1connect.NewKVServiceClient(c.http, url, c.copts...),
		auth:     fencev1connect.NewAuthServiceClient(c.http, url, c.copts...),
		stream:   fencev1connect.NewStreamServiceClient(c.streamHTTP, url, c.copts...),
	}
}

// endpointURL makes an endpoint's URL of host:port (or takes a URL as is).
func (c *Client) endpointURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", fmt.Errorf("%w: empty endpoint", fence.ErrInvalidArgument)
	}
	if strings.Contains(raw, "://") {
		return strings.TrimRight(raw, "/"), nil
	}
	if _, _, err := net.SplitHostPort(raw); err != nil {
		return "", fmt.Errorf("%w: endpoint %q: want host:port or a URL", fence.ErrInvalidArgument, raw)
	}
	if c.opts.tls != nil {
		return "https://" + raw, nil
	}
	return "http://" + raw, nil
}

// defaultHTTPClient speaks HTTP/1.1 for the Connect protocol, which costs
// less per call than HTTP/2 on a local network (167 against 244
// microseconds a round trip here), and HTTP/2 for gRPC, which needs it
// (without TLS, unless tlsConfig is set). Blocked Acquire calls each hold
// a connection.
func defaultHTTPClient(grpc bool, tlsConfig *tls.Config) *http.Client {
	var protocols http.Protocols
	switch {
	case grpc && tlsConfig == nil:
		protocols.SetUnencryptedHTTP2(true)
	case grpc:
		protocols.SetHTTP2(true)
	default:
		protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: inMemoryBodies{&http.Transport{
		Protocols: &protocols,
		// A copy: HTTP/2 adds "h2" to its NextProtos, which must not
		// reach the caller's config, nor the other transport's.
		TLSClientConfig: tlsConfig.Clone(),
		DialContext: (&net.Dialer{
			Timeout:   3 * time.Second,
			KeepAlive: 15 * time.Second,
		}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}}}
}

// plainToTLS recognises the answer Go's HTTPS server gives a plain HTTP
// request (a bare 400 whose body says so), and reports it as
// rpcerr.ErrPlainToTLS rather than as a failed call.
type plainToTLS struct{ next http.RoundTripper }

// plainToTLSBody starts the body of that answer.
const plainToTLSBody = "Client sent an HTTP request to an HTTPS server"

func (t plainToTLS) RoundTrip(req *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(req)
	if err != nil || req.URL.Scheme != "http" || resp.StatusCode != http.StatusBadRequest {
		return resp, err
	}
	head := make([]byte, len(plainToTLSBody))
	n, _ := io.ReadFull(resp.Body, head)
	if string(head[:n]) == plainToTLSBody {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %w", req.URL.Host, rpcerr.ErrPlainToTLS)
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head[:n]), resp.Body), resp.Body}
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the transport.
func (t plainToTLS) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// inMemoryBodies hands net/http a unary call's body as a *bytes.Reader.
// net/http writes the headers of a request whose body it does not know to
// be in memory in a packet of their own, so a lock call took two writes,
// two TCP segments and two wake-ups of the server instead of one (Connect
// passes its own reader type). Streaming bodies, of unknown length, pass
// through untouched.
type inMemoryBodies struct{ next http.RoundTripper }

// maxInMemoryBody bounds the bodies inMemoryBodies copies.
const maxInMemoryBody = 64 << 10

func (t inMemoryBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > maxInMemoryBody {
		return t.next.RoundTrip(req)
	}
	buf := make([]byte, req.ContentLength)
	_, err := io.ReadFull(req.Body, buf)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return t.next.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the transport.
func (t inMemoryBodies) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Close ends the client's session stream and releases its idle
// connections. Sessions should be closed first.
func (c *Client) Close() error {
	c.streams.close()
	c.http.CloseIdleConnections()
	c.streamHTTP.CloseIdleConnections()
	c.streamConns.closeAll()
	return nil
}

// call runs fn against the endpoint that answered last, and while fn fails
// with ErrUnavailable it follows the leader the error names, or moves on
// to the next endpoint, backing off once all were tried. fn must be safe to
// repeat. The retry budget counts from the first failure of the streak, so
// a call that waited long (a blocked Lock) still survives a leader change.
// A call of a client that has not yet talked to its group, that no node
// answers, gives up after the dial timeout instead (see Client).
func (c *Client) call(ctx context.Context, fn func(ctx context.Context, ep *endpoint) error) error {
	var failingSince time.Time
	backoff := 20 * time.Millisecond
	i := c.currentIndex()
	tried, hints, refused, attempts := 0, 0, 0, 0
	var (
		start   = c.opts.clock.Now()
		reached = c.answered.Load() // a node answered, this call or an earlier one
		// heard is whether a node answered any attempt since the last
		// backoff: if none did, the call ends as unreachable.
		heard   bool
		foreign error // a node of another group, passed over
	)
	// giveUp returns the call's error, err from its last attempt (raw
	// before FromConnect).
	giveUp := func(err, raw error) error {
		if !heard && unanswered(raw) {
			err = c.unreachable(c.opts.clock.Now().Sub(start), raw)
		}
		return withForeign(err, foreign)
	}
	for {
		i = c.skipSilent(i)
		ep := c.endpointAt(i)
		raw := fn(ctx, ep)
		attempts++
		if raw == nil || !unanswered(raw) {
			reached, heard = true, true
		}
		// Every endpoint gets one attempt first: the first may drop the
		// connection for longer than the dial timeout while the next answers.
		if !reached && c.opts.dial > 0 && attempts >= c.numEndpoints() && c.opts.clock.Now().Sub(start) >= c.opts.dial {
			return giveUp(raw, raw)
		}
		err := rpcerr.FromConnect(raw)
		if err == nil {
			ep.silentUntil.Store(0)
			c.setCurrent(ep)
			c.answered.Store(true)
			return nil
		}
		if next, final := c.passOver(ctx, ep, err, &refused, &foreign); final != nil {
			return final
		} else if next {
			i++
			continue
		}
		now := c.opts.clock.Now()
		if failingSince.IsZero() {
			failingSince = now
		}
		if leader := leaderHint(err); leader != "" && hints < 3 {
			hints++
			if j := c.endpointFor(leader); j != i%c.numEndpoints() {
				c.endpointAt(j).silentUntil.Store(0) // it leads, and its followers hear from it
				i = j
				continue // go straight to the leader
			}
		}
		i++
		if tried++; tried < c.numEndpoints() {
			continue // try the other endpoints before backing off
		}
		if now.Sub(failingSince)+backoff > c.opts.retryBudget {
			return giveUp(err, raw)
		}
		t := c.opts.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return giveUp(err, raw)
		case <-t.C():
		}
		tried, hints, heard = 0, 0, false
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

// passOver says what an attempt at ep that failed with err, not
// Unavailable while ctx lives, means for its call: try the next node
// (next), or end with final. Neither means the node is unavailable, and the
// call retries as for any. refused counts the nodes that refused the
// client's credentials, foreign keeps the error of a node of another group.
func (c *Client) passOver(ctx context.Context, ep *endpoint, err error, refused *int, foreign *error) (next bool, final error) {
	switch {
	case errors.Is(err, fence.ErrWrongCluster):
		// Never act on this node again; fail once every node is of
		// another group.
		ep.foreign.Store(true)
		if c.allForeign() {
			return false, err
		}
		*foreign = err
		return true, nil
	case errors.Is(err, rpcerr.ErrPlainToTLS):
		return false, fmt.Errorf("%w (is %s serving TLS? then use client.WithTLS, or fence --cacert)", err, ep.url)
	case errors.Is(err, fence.ErrUnauthenticated) && ctx.Err() == nil:
		// This node refused the TLS handshake (or we refused its
		// certificate): another may not. Give up once every node has.
		if *refused++; *refused < c.numEndpoints() {
			return true, nil
		}
		return false, err
	case !errors.Is(err, fence.ErrUnavailable) || ctx.Err() != nil:
		return false, err
	}
	return false, nil
}

// unreachable is the error of a call that no node answered for d; last
// is its last attempt's failure.
func (c *Client) unreachable(d time.Duration, last error) error {
	return fmt.Errorf("%w: tried %s for %v (%v); %s", ErrUnreachable, strings.Join(c.Endpoints(), ", "), d.Round(10*time.Millisecond), last, unreachableHint)
}

// withForeign adds to a call's last error that a node it passed over is
// of another group: the likelier reason no node of the client's answered.
func withForeign(err, foreign error) error {
	if foreign == nil {
		return err
	}
	return fmt.Errorf("%w; and %w", err, foreign)
}

// unary is call for calls answered at once: each attempt on a node gets
// the attempt timeout, measured on the real clock (it bounds the network,
// not a session's time).
func (c *Client) unary(ctx context.Context, fn func(ctx context.Context, ep *endpoint) error) error {
	return c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		return withAttemptDeadline(ctx, clock.Real, c.opts.attempt, ep, func(ctx context.Context) error { return fn(ctx, ep) })
	})
}

// callOp runs one operation answered at once, as unary retries it, and
// returns what answer reads from the response of the attempt that
// succeeded.
func callOp[T any](ctx context.Context, c *Client, req *fencev1.StreamRequest, answer func(*fencev1.StreamResponse) T) (T, error) {
	var out T
	err := c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := c.op(ctx, ep, req)
		if err == nil {
			out = answer(resp)
		}
		return err
	})
	return out, err
}

// newIdempotencyKey returns a key for one write call, sent with each of
// its attempts, so that the service applies a retry of a write whose
// answer was lost only once (fencev1.IdempotencyKeyHeader).
func newIdempotencyKey() string { return rand.Text() }

// keyed returns req carrying the idempotency key.
func keyed[T any](msg *T, key string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(fencev1.IdempotencyKeyHeader, key)
	return req
}

// withAttemptDeadline runs one attempt of a call, giving up on it after d
// on clk: a node that accepts the connection but never answers (paused,
// a stuck disk, a GC storm) fails the attempt as Unavailable, so that call
// moves on to the next node while ctx still has time.
func withAttemptDeadline(ctx context.Context, clk clock.Clock, d time.Duration, ep *endpoint, fn func(context.Context) error) error {
	attemptCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var expired atomic.Bool
	t := clk.AfterFunc(d, func() { expired.Store(true); cancel() })
	defer t.Stop()
	err := fn(attemptCtx)
	if err != nil && expired.Load() && ctx.Err() == nil {
		ep.silentUntil.Store(clk.Now().Add(silentFor).UnixNano())
		return connect.NewError(connect.CodeUnavailable, &noAnswerError{url: ep.url, after: d})
	}
	return err
}

// noAnswerError is an attempt that a node did not answer in time. The
// connection may not have been made at all: an address that drops it (a
// firewall, a host that is gone) looks the same from here.
type noAnswerError struct {
	url   string
	after time.Duration
}

func (e *noAnswerError) Error() string {
	return fmt.Sprintf("%s did not answer within %v", e.url, e.after)
}

// unanswered reports whether err is an attempt that no node answered: its
// connection failed, or nothing came back in time.
func unanswered(err error) bool {
	var na *noAnswerError
	return dialFailed(err) || errors.As(err, &na)
}

// dialFailed reports whether err is a failure to connect at all: the call
// never reached a node.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// leaderHint returns the leader's API address that an Unavailable error names.
func leaderHint(err error) string {
	var re *rpcerr.RemoteError
	if errors.As(err, &re) && re.Detail != nil {
		return re.Detail.GetLeaderAddress()
	}
	return ""
}

func (c *Client) currentIndex() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

func (c *Client) numEndpoints() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.endpoints)
}

// skipSilent returns the first index from i on whose node has not lately
// failed to answer in time; i itself if every node has.
func (c *Client) skipSilent(i int) int {
	n := c.numEndpoints()
	for k := range n {
		if !c.endpointAt(i + k).silent() {
			return i + k
		}
	}
	return i
}

func (c *Client) allForeign() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range c.endpoints {
		if !ep.foreign.Load() {
			return false
		}
	}
	return true
}

func (c *Client) endpointAt(i int) *endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endpoints[i%len(c.endpoints)]
}

func (c *Client) setCurrent(ep *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.endpoints {
		if e == ep {
			c.current = i
		}
	}
}

// endpointFor returns the index of the endpoint at addr, adding it when
// the client did not know it: a cluster's leader may be a node the client
// was not configured with.
func (c *Client) endpointFor(addr string) int {
	url, err := c.endpointURL(addr)
	if err != nil {
		return c.currentIndex()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.endpoints {
		if e.url == url {
			return i
		}
	}
	c.endpoints = append(c.endpoints, c.newEndpoint(url))
	return len(c.endpoints) - 1
}

// Status describes the node at the first endpoint that answers.
func (c *Client) Status(ctx context.Context) (*fencev1.StatusResponse, error) {
	var out *fencev1.StatusResponse
	err := c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.cluster.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// AddMember adds a node, started with --join, to the raft group. The node
// must answer at raftAddress; it joins as a non-voter and, with voter, is
// made a voter once it has caught up with the leader's log, which the
// call waits for (bounded by ctx only, not by the attempt timeout). A
// refused change fails with fence.ErrMembership, saying why.
func (c *Client) AddMember(ctx context.Context, id, raftAddress string, voter bool) error {
	return c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.cluster.AddMember(ctx, connect.NewRequest(&fencev1.AddMemberRequest{Id: id, RaftAddress: raftAddress, Nonvoter: !voter}))
		return err
	})
}

// RemoveMember removes a node from the raft group. A removal that would
// leave the voters without a quorum of reachable ones fails with
// fence.ErrMembership. Like AddMember, it is bounded by ctx only.
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	return c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.cluster.RemoveMember(ctx, connect.NewRequest(&fencev1.RemoveMemberRequest{Id: id}))
		return err
	})
}

// Endpoints returns the API addresses the client knows, the configured
// ones first, then leaders it was pointed to.
func (c *Client) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.endpoints))
	for i, e := range c.endpoints {
		out[i] = e.url
	}
	return out
}

// StatusOf asks one node, by API address, to describe itself, without
// retrying elsewhere: for health checks of every member.
func (c *Client) StatusOf(ctx context.Context, addr string) (*fencev1.StatusResponse, error) {
	url, err := c.endpointURL(addr)
	if err != nil {
		return nil, err
	}
	resp, err := fencev1connect.NewClusterServiceClient(c.http, url, c.copts...).Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		return nil, rpcerr.FromConnect(err)
	}
	return resp.Msg, nil
}

// LockInfo describes a lock: its holders and its queue.
type LockInfo = fencev1.LockInfo

// ReadOption configures a read.
type ReadOption func(*readOptions)

type readOptions struct{ stale bool }

// Stale lets any node answer from its own state, without confirming with
// the leader: faster, and available without a leader, but possibly behind.
// Reads are linearizable without it.
func Stale() ReadOption { return func(o *readOptions) { o.stale = true } }

func readOpts(opts []ReadOption) readOptions {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Locks lists the locks whose names start with prefix, in name order, a
// page at a time. Each page is linearizable unless Stale is given; a list
// of more than one page is not one snapshot.
func (c *Client) Locks(ctx context.Context, prefix string, opts ...ReadOption) ([]*LockInfo, error) {
	var (
		out   []*LockInfo
		token string
	)
	for {
		page, next, err := c.LocksPage(ctx, prefix, token, 0, opts...)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		token = next
	}
}

// LocksPage lists at most size locks (0: as many as the service answers
// at once, 10,000) whose names start with prefix, in name order, from
// pageToken on (""; the first page). next is the token of the page after,
// "" after the last.
func (c *Client) LocksPage(ctx context.Context, prefix, pageToken string, size uint32, opts ...ReadOption) (locks []*LockInfo, next string, err error) {
	req := &fencev1.ListLocksRequest{Prefix: prefix, Stale: readOpts(opts).stale, PageSize: size, PageToken: pageToken}
	err = c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.locks.ListLocks(ctx, connect.NewRequest(req))
		if err == nil {
			locks, next = resp.Msg.GetLocks(), resp.Msg.GetNextPageToken()
		}
		return err
	})
	return locks, next, err
}

// SessionInfo describes a session: its id, owner, TTL, how long it lives
// without a keepalive (when the leader answered) and the grants it holds.
type SessionInfo = fencev1.SessionInfo

// Sessions lists every session, in id order, with the grants each holds.
// It is linearizable unless Stale is given.
func (c *Client) Sessions(ctx context.Context, opts ...ReadOption) ([]*SessionInfo, error) {
	req := &fencev1.ListSessionsRequest{Stale: readOpts(opts).stale}
	var out []*SessionInfo
	err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.sessions.ListSessions(ctx, connect.NewRequest(req))
		if err == nil {
			out = resp.Msg.GetSessions()
		}
		return err
	})
	return out, err
}

// RevokeSession closes the session id, whoever holds it, as if it had
// expired: the locks it holds are released (each after the lock-delay its
// holder asked for), its waits dropped and its bound keys deleted, all in
// one commit. Revoking a session that does not
// exist (any more) succeeds. The session's own client learns at its next
// keepalive that the session is gone (fence.ErrSessionLost).
func (c *Client) RevokeSession(ctx context.Context, id uint64) error {
	req := &fencev1.RevokeSessionRequest{SessionId: id}
	return c.unary(ctx, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.cluster.RevokeSession(ctx, connect.NewRequest(req))
		return err
	})
}

// CheckResult answers Check.
type CheckResult = fence.TokenStatus

// Check asks whether token is the lock's current grant. A resource that can
// reach the service uses it as the strongest fence.
func (c *Client) Check(ctx context.Context, lock string, token uint64, opts ...ReadOption) (CheckResult, error) {
	stale := readOpts(opts).stale
	req := &fencev1.StreamRequest{Op: &fencev1.StreamRequest_Check{Check: &fencev1.CheckRequest{Lock: lock, Token: token, Stale: stale}}}
	return callOp(ctx, c, req, func(resp *fencev1.StreamResponse) CheckResult {
		r := resp.GetCheck()
		return CheckResult{Current: r.GetCurrent(), Held: r.GetHeld(), CurrentToken: r.GetCurrentToken()}
	})
}

// TokenStatus is Check with default options (a linearizable answer); with
// it *Client is a fencing.TokenChecker, for strict fencing at a resource.
func (c *Client) TokenStatus(ctx context.Context, lock string, token uint64) (fence.TokenStatus, error) {
	return c.Check(ctx, lock, token)
}

// followLeader asks nodes not to forward the client's calls to the leader:
// the client follows the leader's address itself, and then talks to the
// leader directly, without the extra hop.
type followLeader struct{}

func (followLeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set(fencev1.FollowLeaderHeader, "1")
		return next(ctx, req)
	}
}

func (followLeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(fencev1.FollowLeaderHeader, "1")
		return conn
	}
}

func (followLeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
