package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/ops"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/wire"
)

// The session stream (docs/design.md, The session stream). A Client sends
// the operations of all its sessions (create, keepalive, close, acquire,
// release, cancel, check, KV put, get and delete) on one bidirectional
// stream to the leader, each with an id, and matches the answers by id, in
// whatever order they come. An operation runs inside Client.call as a
// unary call does, so it is retried, moved to the leader and bounded per
// attempt in the same way: a broken stream fails the operations in flight
// on it as Unavailable, and call retries them (on a new stream, opened
// lazily at whichever node the retry reaches) with the same idempotency
// key or request id, so none is applied twice. A node that does not serve
// the stream (an older version, or no HTTP/2 between the client and it) is
// given unary calls instead.

// WithoutStream makes the client send every operation as a unary call of
// its own (one HTTP request each), as clients before the session stream
// did, instead of on one HTTP/2 stream per client. Use it where HTTP/2
// cannot reach the nodes (a proxy that speaks only HTTP/1.1, and a custom
// WithHTTPClient that cannot speak HTTP/2, are found out and given unary
// calls anyway), or to compare the two.
func WithoutStream() Option {
	return func(o *options) { o.noStream = true }
}

// WithoutFramedStream makes the client carry the session stream over
// HTTP/2 (the Connect protocol, h2c without TLS), as clients before the
// framed stream did, instead of framed directly on an HTTP/1.1 connection
// it upgrades. Use it where something on the way mangles upgraded
// connections but passes HTTP/2, or to compare the two.
func WithoutFramedStream() Option {
	return func(o *options) { o.noFramed = true }
}

// errNoStream is the failure to open a stream at a node that cannot serve
// one: the operation is sent as a unary call instead.
var errNoStream = errors.New("the node does not serve the session stream")

// streamRetry is how long a node whose stream could not be opened for a
// reason other than its answer (a protocol the client and the node do not
// share, say) is given unary calls before the stream is tried again.
const streamRetry = 10 * time.Second

// streamHTTPClient speaks HTTP/2 to the nodes for the stream: without TLS
// (h2c) for http endpoints, with ALPN h2 over TLS. Its pings find a
// connection whose far end went away while the stream was idle.
// Its connections are the client's alone: Client.Close closes them (conns),
// as a connection whose stream just ended may not count as idle yet.
func streamHTTPClient(tlsConfig *tls.Config, conns *connSet) *http.Client {
	var protocols http.Protocols
	if tlsConfig == nil {
		protocols.SetUnencryptedHTTP2(true)
	} else {
		protocols.SetHTTP2(true)
	}
	dialer := &net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}
	return &http.Client{Transport: plainToTLS{&http.Transport{
		Protocols:       &protocols,
		TLSClientConfig: tlsConfig.Clone(), // HTTP/2 adds "h2" to its NextProtos
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return conns.add(conn), nil
		},
		HTTP2: &http.HTTP2Config{SendPingTimeout: 10 * time.Second, PingTimeout: 5 * time.Second},
	}}}
}

// connSet is the open connections of a transport.
type connSet struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.conns, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

func (s *connSet) add(conn net.Conn) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		s.conns = map[*trackedConn]struct{}{}
	}
	c := &trackedConn{Conn: conn, set: s}
	s.conns[c] = struct{}{}
	return c
}

// closeAll closes every connection open.
func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// op runs one operation on ep: on the client's stream when ep serves it,
// else as its unary call. The error is what the unary call would fail with.
func (c *Client) op(ctx context.Context, ep *endpoint, req *fencev1.StreamRequest) (*fencev1.StreamResponse, error) {
	if c.streamTo(ep) && !staleRead(req) {
		resp, err := c.streams.do(ctx, ep, req)
		var broke *openBroke
		switch {
		case errors.As(err, &broke):
			return c.unaryInstead(ctx, ep, req)
		case !errors.Is(err, errNoStream):
			return resp, err
		}
	}
	return c.unaryOp(ctx, ep, req)
}

// openBroke is the failure of a stream's open in the transport, without
// an answer of the node's: the node going away, or a hop on the way that
// does not speak HTTP/2 (a proxy that speaks only HTTP/1.1 answers the
// h2c preface in HTTP/1.1, which the client's HTTP/2 reads as a frame too
// large, and Connect reports as Unavailable). The operation was not sent.
type openBroke struct{ err error }

func (e *openBroke) Error() string { return e.err.Error() }
func (e *openBroke) Unwrap() error { return e.err }

// unaryInstead runs req as its unary call at ep, where a stream could not
// be opened (openBroke). When the node answers it, it is the stream that
// cannot reach the node, not the node that is gone: ep is given unary
// calls for a while (streamRetry), as a node whose stream failed for a
// reason other than its answer. When the node does not answer either, the
// call retries as for any node that went away.
func (c *Client) unaryInstead(ctx context.Context, ep *endpoint, req *fencev1.StreamRequest) (*fencev1.StreamResponse, error) {
	resp, err := c.unaryOp(ctx, ep, req)
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) && rpcerr.ErrorDetailOf(ce) != nil {
		ep.noStreamUntil.Store(ep.clk.Now().Add(streamRetry).UnixNano())
	}
	return resp, err
}

// staleRead reports whether req asks a node for its own state: only the
// leader serves the stream, and a stale read is for any node, the one
// the call reached (a follower cut off from the leader included).
func staleRead(req *fencev1.StreamRequest) bool {
	return req.GetGet().GetStale() || req.GetCheck().GetStale()
}

// streamTo reports whether operations to ep go on a stream.
func (c *Client) streamTo(ep *endpoint) bool {
	return !c.opts.noStream && !ep.unaryOnly.Load() && ep.clk.Now().UnixNano() >= ep.noStreamUntil.Load()
}

// streams holds the client's one stream. Opening one at another node
// (the leader moved) replaces it.
type streams struct {
	c      *Client
	mu     sync.Mutex
	cur    *opStream
	closed bool
	// opening holds, per node, a token for the one open in progress there
	// (a channel of capacity one). A call that waits for it gives up on
	// its own deadline: a node that accepts connections and never answers
	// (paused) holds up only the calls that go to it, each for no longer
	// than its attempt, as for a unary call; and an opener that gives up
	// lets the next one try.
	opening map[*endpoint]chan struct{}
}

// do sends req on the stream at ep, opening one there when there is none.
func (m *streams) do(ctx context.Context, ep *endpoint, req *fencev1.StreamRequest) (*fencev1.StreamResponse, error) {
	st, err := m.at(ctx, ep)
	if err != nil {
		return nil, err
	}
	return st.do(ctx, req)
}

// at returns a live stream at ep, opening it if need be.
func (m *streams) at(ctx context.Context, ep *endpoint) (*opStream, error) {
	if st := m.live(ep); st != nil {
		return st, nil
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, errNoStream
	}
	token := m.openingAt(ep)
	select {
	case token <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-token }()
	if st := m.live(ep); st != nil {
		return st, nil
	}
	st, err := m.c.openStream(ctx, ep)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	old, closed := m.cur, m.closed
	if !closed {
		m.cur = st
	}
	m.mu.Unlock()
	if closed {
		st.end(errClientClosed)
		return nil, errNoStream // calls after Close go as unary calls, as before the stream
	}
	if old != nil {
		// Its operations fail as Unavailable and are retried here.
		old.end(fmt.Errorf("%w: the stream moved from %s to %s", fence.ErrUnavailable, old.ep.url, ep.url))
	}
	return st, nil
}

// openingAt returns the token of opens at ep.
func (m *streams) openingAt(ep *endpoint) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.opening == nil {
		m.opening = map[*endpoint]chan struct{}{}
	}
	token, ok := m.opening[ep]
	if !ok {
		token = make(chan struct{}, 1)
		m.opening[ep] = token
	}
	return token
}

var errClientClosed = fmt.Errorf("%w: the client is closed", fence.ErrUnavailable)

func (m *streams) live(ep *endpoint) *opStream {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.cur; st != nil && st.ep == ep && st.alive() {
		return st
	}
	return nil
}

// close ends the client's stream.
func (m *streams) close() {
	m.mu.Lock()
	st := m.cur
	m.cur, m.closed = nil, true
	m.mu.Unlock()
	if st != nil {
		st.end(errClientClosed)
		<-st.closed // so that its connection is idle, and closed with the others
	}
}

// opStream is one open stream at one node: framed on its connection
// (framed), or Connect's over HTTP/2 (conn, written by send).
type opStream struct {
	ep     *endpoint
	framed *wire.Conn
	conn   *connect.BidiStreamForClient[fencev1.StreamRequest, fencev1.StreamResponse]
	cancel context.CancelFunc
	sends  chan *fencev1.StreamRequest
	slots  chan struct{} // one per operation in flight, up to the server's bound

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *fencev1.StreamResponse
	done    chan struct{} // closed when the stream ended, err set
	err     error
	closed  chan struct{} // closed once its connection or HTTP/2 stream is closed too
}

// newOpStream makes the stream a node opened with opened.
func newOpStream(ep *endpoint, opened *fencev1.StreamOpened) *opStream {
	limit := int(opened.GetMaxInFlight())
	if limit <= 0 {
		limit = 1
	}
	return &opStream{
		ep:      ep,
		sends:   make(chan *fencev1.StreamRequest),
		slots:   make(chan struct{}, limit),
		pending: map[uint64]chan *fencev1.StreamResponse{},
		done:    make(chan struct{}),
		closed:  make(chan struct{}),
	}
}

// openStream opens a stream at ep and waits, within ctx, for the node to
// accept it (its StreamOpened): framed when it can, else Connect's.
func (c *Client) openStream(ctx context.Context, ep *endpoint) (*opStream, error) {
	if c.framedTo(ep) {
		st, err := c.openFramed(ctx, ep)
		if err == nil {
			return st, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if c.framedFailed(ep, err) {
			return nil, err
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	conn := ep.stream.Session(sctx)
	opened := make(chan error, 1)
	var first *fencev1.StreamResponse
	go func() {
		err := conn.Send(nil) // the headers: the node answers them with StreamOpened
		if err == nil {
			first, err = conn.Receive()
		}
		opened <- err
	}()
	var err error
	select {
	case err = <-opened:
	case <-ctx.Done():
		cancel()
		<-opened
		return nil, ctx.Err()
	}
	if err == nil && first.GetOpened() == nil {
		err = fmt.Errorf("%w: %s opened the stream with %v, not StreamOpened", fence.ErrUnavailable, ep.url, first)
	}
	if err != nil {
		cancel()
		return nil, c.streamRefused(ep, err)
	}
	st := newOpStream(ep, first.GetOpened())
	st.conn, st.cancel = conn, cancel
	go st.receive()
	go st.send()
	return st, nil
}

// streamRefused sorts out why a stream could not be opened: a node that
// does not serve it is given unary calls from then on; an answer of the
// node's (not the leader, auth, another group) stands; a connection that
// could not be made is retried as any call's, and one that broke is tried
// with a unary call (openBroke); anything else (a protocol the two sides
// do not share) sends unary calls there for a while.
func (c *Client) streamRefused(ep *endpoint, err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce) && ce.Code() == connect.CodeUnimplemented:
		ep.unaryOnly.Store(true)
		return fmt.Errorf("%w: %v", errNoStream, err)
	case errors.Is(err, fence.ErrWrongCluster), dialFailed(err), errors.Is(err, rpcerr.ErrPlainToTLS):
		return err
	case errors.As(err, &ce) && rpcerr.ErrorDetailOf(ce) != nil:
		return err
	case errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable:
		return &openBroke{err}
	case errors.As(err, &ce) && (ce.Code() == connect.CodeCanceled || ce.Code() == connect.CodeDeadlineExceeded):
		return err // a node going away, or the call's end: as any call
	}
	ep.noStreamUntil.Store(ep.clk.Now().Add(streamRetry).UnixNano())
	return fmt.Errorf("%w: %v", errNoStream, err)
}

// do sends one operation and waits for its answer. When ctx ends first the
// node is told to cancel the operation, as a unary call's node learns that
// its caller went away.
func (st *opStream) do(ctx context.Context, req *fencev1.StreamRequest) (*fencev1.StreamResponse, error) {
	select {
	case st.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-st.done:
		return nil, st.broken()
	}
	ch := make(chan *fencev1.StreamResponse, 1)
	st.mu.Lock()
	st.nextID++
	id := st.nextID
	st.pending[id] = ch
	st.mu.Unlock()
	// A message of its own: the caller's is sent again on the next
	// attempt, perhaps while this one is still being written.
	msg := &fencev1.StreamRequest{Id: id, IdempotencyKey: req.GetIdempotencyKey(), Op: req.GetOp()}
	if err := st.write(ctx, msg); err != nil {
		if errors.Is(err, wire.ErrLeftQueued) {
			// It goes out all the same: as below, its answer frees the slot.
			go st.cancelOp(id)
			return nil, ctx.Err()
		}
		st.forget(id)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, st.broken()
	}
	select {
	case resp := <-ch:
		if err := rpcerr.FromStream(resp.GetError()); err != nil {
			return nil, err
		}
		return resp, nil
	case <-st.done:
		return nil, st.broken()
	case <-ctx.Done():
		// The answer, if it comes, frees the slot.
		go st.cancelOp(id)
		return nil, ctx.Err()
	}
}

// write sends req: on a framed stream from the caller's goroutine (which
// may write others' too, see wire.Conn), else through send. It fails when
// ctx ended before, or the stream ended. A framed write that this caller
// is making is not given up when ctx ends (the frames of others may be in
// it): a node that stops reading fails it, and the stream, once the write
// made no progress for framedDeadAfter. A caller whose frame waits behind
// another's write stops waiting when ctx ends; its frame may still go out,
// as a unary call's request may arrive after its caller gave up.
func (st *opStream) write(ctx context.Context, req *fencev1.StreamRequest) error {
	if st.framed != nil {
		err := st.framed.WriteContext(ctx, req)
		if err != nil && ctx.Err() == nil {
			st.end(err)
		}
		return err
	}
	select {
	case st.sends <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-st.done:
		return st.broken()
	}
}

// forget drops an operation whose sending failed. Its slot is freed here
// unless its answer came meanwhile and freed it (receive): the write may
// have failed after the operation's frame went out.
func (st *opStream) forget(id uint64) {
	st.mu.Lock()
	_, waiting := st.pending[id]
	delete(st.pending, id)
	st.mu.Unlock()
	if waiting {
		<-st.slots
	}
}

// cancelOp tells the node to cancel operation id, unless the stream ends
// first.
func (st *opStream) cancelOp(id uint64) {
	_ = st.write(context.Background(), &fencev1.StreamRequest{Id: id, Op: &fencev1.StreamRequest_Cancel{Cancel: &fencev1.StreamCancel{}}})
}

// send writes the operations, one at a time, until the stream ends. A
// write blocked by a node that stopped reading holds up only this
// goroutine: operations give up on their own deadlines.
func (st *opStream) send() {
	for {
		select {
		case req := <-st.sends:
			if err := st.conn.Send(req); err != nil {
				st.end(err)
				return
			}
		case <-st.done:
			return
		}
	}
}

// receive hands each answer to its operation until the stream ends.
func (st *opStream) receive() {
	for {
		resp, err := st.read()
		if err != nil {
			st.end(err)
			return
		}
		st.mu.Lock()
		ch, ok := st.pending[resp.GetId()]
		delete(st.pending, resp.GetId())
		st.mu.Unlock()
		if ok {
			<-st.slots
			ch <- resp
		}
	}
}

// read reads the next answer. A framed stream's node says why it ended
// the stream in a last message (id 0), as Connect's trailers do.
func (st *opStream) read() (*fencev1.StreamResponse, error) {
	if st.framed == nil {
		return st.conn.Receive()
	}
	resp := &fencev1.StreamResponse{}
	if err := st.framed.Read(resp); err != nil {
		return nil, err
	}
	if resp.GetId() == 0 && resp.GetError() != nil {
		return nil, rpcerr.FromStream(resp.GetError())
	}
	return resp, nil
}

// end ends the stream with err, failing the operations in flight.
func (st *opStream) end(err error) {
	st.mu.Lock()
	if st.err != nil {
		st.mu.Unlock()
		return
	}
	st.err = err
	close(st.done)
	st.mu.Unlock()
	if st.framed != nil {
		// Outside mu: a TLS connection's close writes its close_notify,
		// which waits on a node that stopped reading.
		_ = st.framed.Close()
		close(st.closed)
		return
	}
	st.cancel()
	go func() {
		_ = st.conn.CloseRequest()
		_ = st.conn.CloseResponse()
		close(st.closed)
	}()
}

func (st *opStream) alive() bool {
	select {
	case <-st.done:
		return false
	default:
		return true
	}
}

// broken is the error of an operation whose stream ended under it: as for
// a unary call whose connection broke, Unavailable, so that it is retried
// (naming the leader when the node that ended the stream named one).
func (st *opStream) broken() error {
	st.mu.Lock()
	err := st.err
	st.mu.Unlock()
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable {
		return err
	}
	if errors.Is(err, fence.ErrUnavailable) {
		return err
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the stream to %s broke: %w", st.ep.url, err))
}

// unaryOp runs an operation as its unary call.
func (c *Client) unaryOp(ctx context.Context, ep *endpoint, req *fencev1.StreamRequest) (*fencev1.StreamResponse, error) {
	out := &fencev1.StreamResponse{Id: req.GetId()}
	if ka := req.GetKeepAlive(); ka != nil {
		r, err := c.unaryKeepAlives(ctx, ep, ka)
		if err != nil {
			return nil, err
		}
		out.Result = &fencev1.StreamResponse_KeepAlive{KeepAlive: r}
		return out, nil
	}
	op, msg := ops.Of(req)
	if op == nil {
		return nil, fmt.Errorf("%w: no unary call for operation %T", fence.ErrInvalidArgument, req.GetOp())
	}
	r, err := ep.unary[op.Name()](ctx, msg, req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	op.Answer(out, r)
	return out, nil
}

// unaryKeepAlives renews the sessions of one keepalive message with a
// unary KeepAlive each, in parallel. A failure that is not the session's
// own (the node is not the leader, or went away) fails them all, so that
// the message is retried as a whole; renewing a session twice is harmless.
func (c *Client) unaryKeepAlives(ctx context.Context, ep *endpoint, m *fencev1.KeepAliveManyRequest) (*fencev1.KeepAliveManyResponse, error) {
	out := &fencev1.KeepAliveManyResponse{Results: make([]*fencev1.KeepAliveResult, len(m.GetSessions()))}
	errs := make([]error, len(m.GetSessions()))
	var wg sync.WaitGroup
	for i, s := range m.GetSessions() {
		wg.Go(func() {
			res := &fencev1.KeepAliveResult{SessionId: s.GetSessionId()}
			r, err := ep.sessions.KeepAlive(ctx, connect.NewRequest(s))
			if err == nil {
				res.Ok = r.Msg
			} else if se := rpcerr.FromConnect(err); sessionsOwn(se) {
				res.Error = toStreamError(se)
			} else {
				errs[i] = err
			}
			out.Results[i] = res
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range errs {
			if e != nil {
				return nil, e
			}
		}
	}
	return out, nil
}

// sessionsOwn reports whether a keepalive's error is about its session
// (gone, or the wrong secret), not about the node or the call.
func sessionsOwn(err error) bool {
	return errors.Is(err, fence.ErrSessionNotFound) || errors.Is(err, fence.ErrSessionSecret) || errors.Is(err, fence.ErrInvalidArgument)
}

// toStreamError carries a remote error of a unary call as a stream's.
func toStreamError(err error) *fencev1.StreamError {
	var re *rpcerr.RemoteError
	if errors.As(err, &re) {
		return &fencev1.StreamError{Code: uint32(re.Code), Message: re.Message, Detail: re.Detail}
	}
	return rpcerr.ToStream(err)
}
