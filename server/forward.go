package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/server/internal/apinet"
)

// forwarder sends calls that reach a follower on to the leader, so that
// clients that cannot follow the leader hint (curl, a load balancer in
// front of the group) are served by any node. Stale reads stay here, and
// so do calls with fencev1.FollowLeaderHeader. When the leader cannot be
// reached at all, the call is handled here, as if never forwarded: a
// follower answers it Unavailable with the leader's address.
type forwarder struct {
	s      *Server
	local  http.Handler
	client *http.Transport
	errors *connect.ErrorWriter
}

func newForwarder(s *Server, local http.Handler) *forwarder {
	var p http.Protocols
	if s.cfg.TLS != nil {
		p.SetHTTP2(true) // gRPC needs HTTP/2; Connect and JSON are fine with it
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	tr := &http.Transport{
		Protocols:   &p,
		DialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		// A leader gone silent shows as failed pings, not as a hang until
		// TCP gives up; blocked acquires and watches rule out a response
		// timeout.
		HTTP2:           &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second},
		TLSClientConfig: peerAPITLS(s.cfg),
	}
	return &forwarder{s: s, local: local, client: tr, errors: connect.NewErrorWriter()}
}

// close drops the connections to the leader.
func (f *forwarder) close() { f.client.CloseIdleConnections() }

// fenceServices are the services whose calls carry one request message.
var fenceServices = slices.Concat(forwardable, []string{"/" + fencev1connect.ClusterServiceName + "/"})

// forwardable are the services whose calls a follower forwards; cluster
// status and membership are each node's own.
var forwardable = []string{
	"/" + fencev1connect.SessionServiceName + "/",
	"/" + fencev1connect.LockServiceName + "/",
	"/" + fencev1connect.KVServiceName + "/",
	"/" + fencev1connect.AuthServiceName + "/",
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	leader := f.leaderAPI(r)
	if leader == "" {
		f.local.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(f.s.cfg.MaxRequestBytes)+5))
	if err != nil {
		f.errors.Write(w, r, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("reading the request: %w", err)))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if staleRead(r, body) {
		f.local.ServeHTTP(w, r) // a follower's own state is what was asked for
		return
	}
	// End the forwarded call when this node shuts down, as its own calls do.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-f.s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	r = r.WithContext(ctx)
	r.Header.Set(fencev1.ForwardedByHeader, f.s.cfg.NodeID)
	if id := f.s.clusterID(); id != "" && r.Header.Get(fencev1.ClusterIDHeader) == "" {
		// The leader's address came from the state; still, a node that
		// now listens there must be of this group to be given the call.
		r.Header.Set(fencev1.ClusterIDHeader, id)
	}
	w.Header().Del(fencev1.ClusterIDHeader) // the leader's answer names its group
	f.proxy(leader, body).ServeHTTP(w, r)
}

// leaderAPI returns the leader's API address if r should be forwarded.
func (f *forwarder) leaderAPI(r *http.Request) string {
	if f.s.leaderReady.Load() || r.Header.Get(fencev1.ForwardedByHeader) != "" || r.Header.Get(fencev1.FollowLeaderHeader) != "" {
		return ""
	}
	if !apinet.HasAnyPrefix(r.URL.Path, forwardable) {
		return ""
	}
	if r.Header.Get("Authorization") == "" && f.s.AuthEnabled() {
		// The leader would see this node's certificate, not the
		// caller's: the call is checked and answered here (docs/design.md,
		// Auth on followers).
		return ""
	}
	return f.s.leaderAPI()
}

// proxy returns a reverse proxy to the leader at api. A call that never
// reached the leader (it could not be dialed) is handled here, with its
// kept body; one that may have reached it is not, for it may have been
// applied there: it fails with Unavailable, and the client decides.
func (f *forwarder) proxy(api string, body []byte) http.Handler {
	target := &url.URL{Scheme: strings.TrimSuffix(f.s.apiScheme(), "://"), Host: api}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded() // the caller's address, for the leader's rate limits (ratelimit.go)
		},
		Transport:     f.client,
		FlushInterval: -1, // watch streams flush at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var op *net.OpError
			switch {
			case r.Context().Err() != nil:
				return // the caller went away, or this node is shutting down
			case errors.As(err, &op) && op.Op == "dial":
				r.Body = io.NopCloser(bytes.NewReader(body))
				r.Header.Del(fencev1.ForwardedByHeader)
				f.local.ServeHTTP(w, r)
			default:
				f.errors.Write(w, r, connect.NewError(connect.CodeUnavailable,
					fmt.Errorf("%w: forwarding to the leader at %s failed (%v); the call may or may not have been applied", fence.ErrUnavailable, api, err)))
			}
		},
	}
}

// staleRead reports whether r is a read that asks for this node's own
// state (stale: true). It decodes the request, in JSON or protobuf, Connect
// or gRPC; a body it cannot read (compressed, say) counts as not stale.
func staleRead(r *http.Request, body []byte) bool {
	var msg interface {
		proto.Message
		GetStale() bool
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/Get"):
		msg = &fencev1.GetRequest{}
	case strings.HasSuffix(r.URL.Path, "/List"):
		msg = &fencev1.ListRequest{}
	case strings.HasSuffix(r.URL.Path, "/ListLocks"):
		msg = &fencev1.ListLocksRequest{}
	case strings.HasSuffix(r.URL.Path, "/Check"):
		msg = &fencev1.CheckRequest{}
	case strings.HasSuffix(r.URL.Path, "/ListSessions"):
		msg = &fencev1.ListSessionsRequest{}
	default:
		return false
	}
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/grpc") || strings.HasPrefix(ct, "application/connect+") {
		// An enveloped message: a flags byte (bit 0: compressed) and a length.
		if len(body) < 5 || body[0]&1 != 0 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
			return false
		}
		body = body[5:]
	} else if r.Header.Get("Content-Encoding") != "" {
		return false
	}
	var err error
	if strings.Contains(ct, "json") {
		err = protojson.Unmarshal(body, msg)
	} else {
		err = proto.Unmarshal(body, msg)
	}
	return err == nil && msg.GetStale()
}
