package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/wire"
)

// The session stream framed on the connection (docs/design.md, The
// session stream): the client asks the node to switch an HTTP/1.1
// connection to wire.Protocol, and then writes each operation itself and
// reads the answers in one goroutine, without HTTP/2's goroutines in
// between. A node that does not switch (an older version, a proxy that
// drops upgrades, a follower, a refusal) is asked again with the Connect
// stream, whose answer the client acts on as before.

// maxFramedAnswer bounds an answer's frame: the largest KV value and more.
const maxFramedAnswer = 64 << 20

// Liveness of a framed stream, as HTTP/2's pings give the Connect stream:
// a ping after framedPingAfter without a frame from the node (or to it),
// and the stream ends when framedDeadAfter passes without one from it.
// Variables for tests.
var (
	framedPingAfter = 10 * time.Second
	framedDeadAfter = 15 * time.Second
)

// framedTo reports whether a stream at ep is opened framed first: only
// with the client's own transport (a custom WithHTTPClient may dial
// through a proxy or a tunnel this client cannot see), and not while ep
// is given Connect's stream after it did not switch.
func (c *Client) framedTo(ep *endpoint) bool {
	return c.opts.httpClient == nil && !c.opts.noFramed && ep.clk.Now().UnixNano() >= ep.noFramedUntil.Load()
}

// errNotSwitched is a node's answer to the upgrade other than switching.
type errNotSwitched struct {
	status  int
	refusal bool // the node's refusal (not the leader, no credential): Connect's open hears it too
}

func (e *errNotSwitched) Error() string {
	return fmt.Sprintf("the node answered the framed stream's upgrade with %d %s", e.status, http.StatusText(e.status))
}

// openFramed opens a framed stream at ep and waits, within ctx, for the
// node's StreamOpened.
func (c *Client) openFramed(ctx context.Context, ep *endpoint) (*opStream, error) {
	target, err := url.Parse(ep.url + "/" + fencev1connect.StreamServiceName + "/Session")
	if err != nil {
		return nil, err
	}
	conn, err := c.dialStream(ctx, target)
	if err != nil {
		return nil, err
	}
	// The open is bounded by ctx: a node that accepts the connection and
	// never answers (paused) fails it when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	fc, first, err := c.upgrade(conn, target)
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if first.GetError() != nil {
		_ = conn.Close()
		return nil, rpcerr.FromStream(first.GetError())
	}
	if first.GetOpened() == nil {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: %s opened the framed stream with %v, not StreamOpened", fence.ErrUnavailable, ep.url, first)
	}
	st := newOpStream(ep, first.GetOpened())
	st.framed = fc
	go st.receive()
	go st.keepFresh(framedPingAfter, framedDeadAfter)
	return st, nil
}

// dialStream connects to the node of target, with TLS for https.
func (c *Client) dialStream(ctx context.Context, target *url.URL) (net.Conn, error) {
	host := target.Host
	if target.Port() == "" {
		port := "80"
		if target.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(target.Hostname(), port)
	}
	dialer := &net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}
	raw, err := dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	conn := c.streamConns.add(raw)
	if target.Scheme != "https" {
		return conn, nil
	}
	cfg := c.opts.tls.Clone()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.NextProtos = []string{"http/1.1"}
	if cfg.ServerName == "" {
		cfg.ServerName = target.Hostname()
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return tc, nil
}

// upgrade asks the node at the other end of conn to switch to the framed
// stream, and reads its first message.
func (c *Client) upgrade(conn net.Conn, target *url.URL) (*wire.Conn, *fencev1.StreamResponse, error) {
	req := &http.Request{Method: http.MethodGet, URL: target, Host: target.Host, Header: http.Header{}, ProtoMajor: 1, ProtoMinor: 1}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", wire.Protocol)
	req.Header.Set(fencev1.FollowLeaderHeader, "1")
	if id := c.ClusterID(); id != "" {
		req.Header.Set(fencev1.ClusterIDHeader, id)
	}
	if c.opts.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.bearer)
	}
	if err := req.Write(conn); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !wire.Switched(resp.Header) {
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusServiceUnavailable, http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
			return nil, nil, &errNotSwitched{status: resp.StatusCode, refusal: true}
		}
		return nil, nil, &errNotSwitched{status: resp.StatusCode}
	}
	if err := c.learnCluster(resp.Header.Get(fencev1.ClusterIDHeader), conn.RemoteAddr().String()); err != nil {
		return nil, nil, err
	}
	fc := wire.NewConn(conn, br, maxFramedAnswer, framedDeadAfter)
	first := &fencev1.StreamResponse{}
	if err := fc.Read(first); err != nil {
		return nil, nil, err
	}
	return fc, first, nil
}

// framedFailed sorts out a framed open that failed for a reason other
// than the call's end: the node's answer to it stands; a node that does
// not speak it (or a hop on the way that does not) is given Connect's
// stream for a while; either way Connect's stream is tried now.
func (c *Client) framedFailed(ep *endpoint, err error) (stands bool) {
	var ns *errNotSwitched
	switch {
	case errors.Is(err, fence.ErrWrongCluster):
		return true
	case dialFailed(err):
		return false // Connect's open dials again, and says so in its terms
	case errors.As(err, &ns) && ns.refusal:
		return false
	}
	ep.noFramedUntil.Store(ep.clk.Now().Add(streamRetry).UnixNano())
	return false
}

// keepFresh pings the node while the stream is quiet, and ends the stream
// when nothing, not even a pong, came for deadAfter: the node's
// host is gone, or the node stopped (a stream with operations in flight
// finds that out sooner, from their attempt timeouts). It pings too when
// the client wrote nothing for pingAfter, however much it reads
// (answers to long waits coming in one by one): the node drops a stream
// that it hears nothing on. A ping is written from a goroutine of its own,
// one at a time, so that a write held up by a node that stopped reading
// does not hold up the check.
func (st *opStream) keepFresh(pingAfter, deadAfter time.Duration) {
	t := time.NewTicker(deadAfter - pingAfter)
	defer t.Stop()
	var pinging atomic.Bool
	for {
		select {
		case <-st.done:
			return
		case <-t.C:
			idle := st.framed.ReadIdle()
			if idle >= deadAfter {
				st.end(connect.NewError(connect.CodeUnavailable, fmt.Errorf("the stream to %s broke: nothing came for %v, not even a pong", st.ep.url, idle.Round(time.Second))))
				return
			}
			if (idle >= pingAfter || st.framed.WriteIdle() >= pingAfter) && pinging.CompareAndSwap(false, true) {
				go func() {
					defer pinging.Store(false)
					if err := st.framed.Ping(); err != nil {
						st.end(err)
					}
				}()
			}
		}
	}
}
