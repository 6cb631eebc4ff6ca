// Package fencetest runs a real fence node inside a test, in one call: raft
// on a temporary directory, the API on a loopback port, a client that
// reaches it, all stopped when the test ends. It is to fence what httptest
// is to net/http, except that nothing is faked: the node is the one
// `fence serve` runs, with timeouts short enough that it leads within
// milliseconds.
//
//	func TestMyJob(t *testing.T) {
//		node := fencetest.Start(t)
//		s, err := node.Client().NewSession(context.Background())
//		...
//	}
package fencetest

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/server"
)

// Node is a running single-node fence service.
type Node struct {
	// Server is the node itself, for what the client cannot do (Close it
	// early to see how your code copes with a service that went away).
	Server *server.Server
	tb     testing.TB
	client *client.Client
}

// Option adjusts the node's configuration before it starts.
type Option func(*server.Config)

// WithConfig lets edit change the node's configuration (limits, the clock,
// a data dir to reuse) before it starts.
func WithConfig(edit func(*server.Config)) Option { return Option(edit) }

// Start starts a node on a temporary data dir and a free loopback port,
// waits until it is the leader, and stops it when the test ends. It fails
// the test if the node cannot start.
func Start(tb testing.TB, opts ...Option) *Node {
	tb.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	for _, opt := range opts {
		opt(&cfg)
	}
	srv, err := server.Start(cfg)
	if err != nil {
		tb.Fatalf("fencetest: starting a node: %v", err)
	}
	tb.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitLeader(ctx); err != nil {
		tb.Fatalf("fencetest: %v", err)
	}
	return &Node{Server: srv, tb: tb}
}

// Endpoint returns the node's API address, host:port, for
// client.WithEndpoints or the fence CLI's --endpoints.
func (n *Node) Endpoint() string { return n.Server.Addr() }

// Client returns a client of the node, made on first use and closed when
// the test ends. It is safe for concurrent use.
func (n *Node) Client() *client.Client {
	if n.client == nil {
		n.client = n.NewClient()
	}
	return n.client
}

// NewClient returns another client of the node, with opts, closed when the
// test ends.
func (n *Node) NewClient(opts ...client.Option) *client.Client {
	n.tb.Helper()
	c, err := client.New(append([]client.Option{client.WithEndpoints(n.Endpoint())}, opts...)...)
	if err != nil {
		n.tb.Fatalf("fencetest: a client: %v", err)
	}
	n.tb.Cleanup(func() { c.Close() })
	return c
}
