package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/rpcerr"
)

// DefaultEndpoint is where `fence serve` listens by default.
const DefaultEndpoint = "127.0.0.1:7420"

// Client talks to a fence service. It is safe for concurrent use; one
// Client per process is enough. Calls that fail because a node is not the
// leader or cannot be reached move on to the next endpoint and are retried,
// with backoff, for as long as their context and the retry budget allow;
// only calls that are safe to repeat are retried.
type Client struct {
	opts      options
	http      *http.Client
	endpoints []*endpoint

	mu      sync.Mutex
	current int // index of the endpoint that answered last
}

type endpoint struct {
	url      string
	sessions fencev1connect.SessionServiceClient
	locks    fencev1connect.LockServiceClient
	cluster  fencev1connect.ClusterServiceClient
	kv       fencev1connect.KVServiceClient
}

type options struct {
	endpoints   []string
	httpClient  *http.Client
	clock       clock.Clock
	retryBudget time.Duration
	grpc        bool
}

// Option configures a Client.
type Option func(*options)

// WithEndpoints sets the nodes to talk to, as host:port or URLs
// (default 127.0.0.1:7420). Any node will do; the client finds the leader.
func WithEndpoints(endpoints ...string) Option {
	return func(o *options) { o.endpoints = endpoints }
}

// WithHTTPClient replaces the HTTP client, for TLS or custom dialing. It
// must speak HTTP/2 for gRPC (WithGRPC); the default speaks HTTP/2 without TLS.
func WithHTTPClient(c *http.Client) Option {
	return func(o *options) { o.httpClient = c }
}

// WithRetryBudget bounds how long a call keeps retrying while no leader
// answers (default 15s). The call's context bounds it too.
func WithRetryBudget(d time.Duration) Option {
	return func(o *options) { o.retryBudget = d }
}

// WithGRPC makes the client speak gRPC instead of the Connect protocol.
func WithGRPC() Option {
	return func(o *options) { o.grpc = true }
}

// withClock injects the clock of keepalives and "safe until"; tests use a fake.
func withClock(c clock.Clock) Option {
	return func(o *options) { o.clock = c }
}

// New returns a client for the given endpoints. It does not dial; the first
// call does.
func New(opts ...Option) (*Client, error) {
	o := options{endpoints: []string{DefaultEndpoint}, clock: clock.Real, retryBudget: 15 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", fence.ErrInvalidArgument)
	}
	c := &Client{opts: o, http: o.httpClient}
	if c.http == nil {
		c.http = defaultHTTPClient()
	}
	var copts []connect.ClientOption
	if o.grpc {
		copts = append(copts, connect.WithGRPC())
	}
	for _, raw := range o.endpoints {
		url, err := endpointURL(raw)
		if err != nil {
			return nil, err
		}
		c.endpoints = append(c.endpoints, &endpoint{
			url:      url,
			sessions: fencev1connect.NewSessionServiceClient(c.http, url, copts...),
			locks:    fencev1connect.NewLockServiceClient(c.http, url, copts...),
			cluster:  fencev1connect.NewClusterServiceClient(c.http, url, copts...),
			kv:       fencev1connect.NewKVServiceClient(c.http, url, copts...),
		})
	}
	return c, nil
}

func endpointURL(raw string) (string, error) {
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
	return "http://" + raw, nil
}

func defaultHTTPClient() *http.Client {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols: &protocols,
		DialContext: (&net.Dialer{
			Timeout:   3 * time.Second,
			KeepAlive: 15 * time.Second,
		}).DialContext,
		IdleConnTimeout: 90 * time.Second,
	}}
}

// Close releases the client's idle connections. Sessions should be closed first.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// call runs fn against the endpoint that answered last, moving to the next
// endpoint and retrying while fn fails with ErrUnavailable. fn must be safe
// to repeat.
func (c *Client) call(ctx context.Context, fn func(ctx context.Context, ep *endpoint) error) error {
	start := c.opts.clock.Now()
	backoff := 20 * time.Millisecond
	c.mu.Lock()
	i := c.current
	c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		ep := c.endpoints[i%len(c.endpoints)]
		err := rpcerr.FromConnect(fn(ctx, ep))
		if err == nil {
			c.mu.Lock()
			c.current = i % len(c.endpoints)
			c.mu.Unlock()
			return nil
		}
		if !errors.Is(err, fence.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		i++
		if i%len(c.endpoints) != 0 {
			continue // try the other endpoints before backing off
		}
		if c.opts.clock.Now().Sub(start)+backoff > c.opts.retryBudget {
			return err
		}
		t := c.opts.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C():
		}
		backoff = min(2*backoff, time.Second)
	}
}

// leader returns the endpoint that answered last.
func (c *Client) leader() *endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endpoints[c.current]
}

// Status describes the node at the first endpoint that answers.
func (c *Client) Status(ctx context.Context) (*fencev1.StatusResponse, error) {
	var out *fencev1.StatusResponse
	err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.cluster.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
		if err == nil {
			out = resp.Msg
		}
		return err
	})
	return out, err
}

// LockInfo describes a lock: its holders and its queue.
type LockInfo = fencev1.LockInfo

// Locks lists the locks whose names start with prefix, in name order.
// The answer is linearizable.
func (c *Client) Locks(ctx context.Context, prefix string) ([]*LockInfo, error) {
	var out []*LockInfo
	err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.locks.ListLocks(ctx, connect.NewRequest(&fencev1.ListLocksRequest{Prefix: prefix}))
		if err == nil {
			out = resp.Msg.GetLocks()
		}
		return err
	})
	return out, err
}

// CheckResult answers Check.
type CheckResult struct {
	// Current is true when the token is a current grant of the lock.
	Current bool
	// Held is true when the lock has a holder.
	Held bool
	// CurrentToken is the newest current grant's token, 0 when free.
	CurrentToken uint64
}

// Check asks whether token is the lock's current grant. A resource that can
// reach the service uses it as the strongest fence.
func (c *Client) Check(ctx context.Context, lock string, token uint64) (CheckResult, error) {
	var out CheckResult
	err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.locks.Check(ctx, connect.NewRequest(&fencev1.CheckRequest{Lock: lock, Token: token}))
		if err == nil {
			out = CheckResult{Current: resp.Msg.GetCurrent(), Held: resp.Msg.GetHeld(), CurrentToken: resp.Msg.GetCurrentToken()}
		}
		return err
	})
	return out, err
}
