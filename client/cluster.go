package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// WithClusterID makes the client talk to the group with this id only
// (fence status shows it): a node of any other group is never used, even
// for the first call. Without it the client takes the id of the first node
// that answers. Either way, once the id is known, every call carries it,
// and a node of another group refuses the call before acting on it; see
// fence.ErrWrongCluster.
func WithClusterID(id string) Option {
	return func(o *options) { o.clusterID = id }
}

// ClusterID returns the id of the group the client talks to: the one given
// with WithClusterID, or the first a node answered with; empty until then.
func (c *Client) ClusterID() string {
	if p := c.cluster.Load(); p != nil {
		return *p
	}
	return ""
}

// learnCluster checks the group id a node at addr answered with against
// the client's, taking it as the client's when it has none yet. A node
// that names no id (older, or not yet caught up) passes.
func (c *Client) learnCluster(id, addr string) error {
	if id == "" {
		return nil
	}
	if c.cluster.CompareAndSwap(nil, &id) {
		return nil
	}
	if want := c.ClusterID(); id != want {
		return fmt.Errorf("%w: the node at %s belongs to cluster %s, and this client talks to cluster %s; its answer was ignored. "+
			"Either the endpoints name nodes of two groups, or the group this client first reached was replaced (its data lost, "+
			"or restored from a backup), and the new one's tokens may be lower than tokens this client was given: "+
			"to use it, make a new client (fence: --cluster-id %s)", fence.ErrWrongCluster, addr, id, want, id)
	}
	return nil
}

// pinCluster sends the client's group id with every call and checks the
// id of every answer, so that a client never acts on two groups' answers.
type pinCluster struct{ c *Client }

func (p pinCluster) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if id := p.c.ClusterID(); id != "" {
			req.Header().Set(fencev1.ClusterIDHeader, id)
		}
		resp, err := next(ctx, req)
		var header http.Header
		var ce *connect.Error
		switch {
		case err == nil:
			header = resp.Header()
		case errors.As(err, &ce):
			header = ce.Meta()
		}
		if werr := p.c.learnCluster(header.Get(fencev1.ClusterIDHeader), req.Peer().Addr); werr != nil {
			return nil, werr
		}
		return resp, err
	}
}

func (p pinCluster) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if id := p.c.ClusterID(); id != "" {
			conn.RequestHeader().Set(fencev1.ClusterIDHeader, id)
		}
		return &pinnedStream{StreamingClientConn: conn, c: p.c}
	}
}

func (pinCluster) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// pinnedStream checks the group id of a stream's answer when its first
// message, or its end, arrives.
type pinnedStream struct {
	connect.StreamingClientConn
	c       *Client
	checked bool
}

func (s *pinnedStream) Receive(msg any) error {
	err := s.StreamingClientConn.Receive(msg)
	// The answer's headers are read only once the answer arrived: a
	// Receive that failed on this side (its context ended) may return
	// while connect is still writing them, as a late answer comes in.
	if !s.checked && (err == nil || fromTheNode(err)) {
		s.checked = true
		if werr := s.c.learnCluster(s.ResponseHeader().Get(fencev1.ClusterIDHeader), s.Peer().Addr); werr != nil {
			return werr
		}
	}
	return err
}

// fromTheNode reports whether err ends a stream whose answer, headers
// included, has arrived: an error the node answered, or the answer's end.
func fromTheNode(err error) bool {
	return connect.IsWireError(err) || errors.Is(err, io.EOF)
}
