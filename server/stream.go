package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/ops"
	"github.com/fencelock/fence/internal/rpcerr"
)

// The session stream (docs/design.md, The session stream): one
// bidirectional stream per client carries every operation of its sessions.
// Each operation runs in a goroutine of its own (one of s.workers), through the same function
// its unary handler calls, checked as that call is checked, and is
// answered by id when it completes, so that a blocked acquire holds up
// nothing else on the stream.

// maxKeepAliveSessions bounds the sessions of one KeepAliveManyRequest.
const maxKeepAliveSessions = 10_000

// connOpsKey is the context key of a connection's streamSlots.
type connOpsKey struct{}

// streamSlots holds one element per stream operation in flight on one API
// connection, all its streams together (Config.MaxStreamOps): a client
// that opens many streams on one connection gets no more than one
// stream's worth.
type streamSlots chan struct{}

// withStreamSlots is the http.Server's ConnContext: each connection gets
// its own slots.
func (s *Server) withStreamSlots(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connOpsKey{}, make(streamSlots, s.cfg.MaxStreamOps))
}

// slotsOf returns the slots of the connection a call came on, or slots of
// its own for a call that came another way (a handler tested alone).
func (s *Server) slotsOf(ctx context.Context) streamSlots {
	if slots, ok := ctx.Value(connOpsKey{}).(streamSlots); ok {
		return slots
	}
	return make(streamSlots, s.cfg.MaxStreamOps)
}

// Session implements fencev1connect.StreamServiceHandler. Only a ready
// leader serves a stream, and it ends its streams when it stops leading or
// shuts down, and a stream whose credential no longer authenticates.
func (s handlers) Session(ctx context.Context, stream *connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]) error {
	term := s.leaderTerm.current()
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	ctx = withClientAddr(ctx, stream.Peer().Addr, stream.RequestHeader())
	return s.serveStream(ctx, term, &connectStream{BidiStream: stream})
}

// streamConn is what a stream's messages travel on: a Connect stream over
// HTTP/2 (connectStream) or frames on the connection itself
// (framedStream). Send may be called from many goroutines at once.
type streamConn interface {
	Receive() (*fencev1.StreamRequest, error)
	Send(*fencev1.StreamResponse) error
}

// connectStream is a Connect (or gRPC) stream, its sends one at a time.
type connectStream struct {
	*connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]
	mu sync.Mutex
}

func (c *connectStream) Send(resp *fencev1.StreamResponse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.BidiStream.Send(resp)
}

// serveStream serves an open stream of a leader in term until it ends.
func (s *Server) serveStream(ctx context.Context, term <-chan struct{}, conn streamConn) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st := &serverStream{s: s, conn: conn, slots: s.slotsOf(ctx), ops: map[uint64]context.CancelCauseFunc{}}
	opened := &fencev1.StreamResponse{Result: &fencev1.StreamResponse_Opened{Opened: &fencev1.StreamOpened{MaxInFlight: uint32(cap(st.slots))}}}
	if err := st.conn.Send(opened); err != nil {
		return err
	}
	transport := "http2"
	if _, ok := conn.(framedStream); ok {
		transport = "framed"
	}
	s.metrics.streamOpens.WithLabelValues(transport).Inc()
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	go st.watch(ctx, cancel, term)
	err := st.serve(ctx, cancel)
	st.wg.Wait()
	return err
}

// serverStream is one open stream.
type serverStream struct {
	s     *Server
	conn  streamConn
	slots streamSlots // its connection's: one per operation in flight
	wg    sync.WaitGroup

	mu  sync.Mutex
	ops map[uint64]context.CancelCauseFunc // the operations in flight, by id
}

// errStreamEnded is the cause of the operations cancelled when their
// stream ends under them.
var errStreamEnded = fmt.Errorf("%w: the stream ended", fence.ErrUnavailable)

// serve reads operations until the stream ends, and returns why: nil when
// the client closed its side and every operation was answered.
func (st *serverStream) serve(ctx context.Context, cancel context.CancelCauseFunc) error {
	if f, ok := st.conn.(framedStream); ok {
		// A read blocked when the stream ends is ended through the
		// connection.
		stop := context.AfterFunc(ctx, f.InterruptRead)
		defer stop()
		ended := make(chan error, 1)
		st.s.workers.Run(func() { st.readFramed(ctx, cancel, f, ended) })
		return <-ended
	}
	reqs, readErr := make(chan *fencev1.StreamRequest), make(chan error, 1)
	go func() {
		for {
			req, err := st.conn.Receive()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				st.wg.Wait() // the client is done sending: answer what it sent
				return nil
			}
			cancel(errStreamEnded)
			return err
		case req := <-reqs:
			run, err := st.start(ctx, req)
			if err != nil {
				cancel(err)
				return err
			}
			if run != nil {
				st.s.workers.Run(run)
			}
		}
	}
}

// readFramed reads operations from a framed stream until one is to run:
// it hands the reading on to another goroutine and runs that operation
// itself, so that no hand-off stands between an operation's arrival and
// its work (the next reader wakes meanwhile). It reports on ended why the
// stream ended, once it did.
func (st *serverStream) readFramed(ctx context.Context, cancel context.CancelCauseFunc, f framedStream, ended chan<- error) {
	for {
		req, err := f.Receive()
		if ctx.Err() != nil {
			ended <- context.Cause(ctx)
			return
		}
		if errors.Is(err, io.EOF) {
			st.wg.Wait() // the client is done sending: answer what it sent
			ended <- nil
			return
		}
		var run func()
		if err == nil {
			run, err = st.start(ctx, req)
		}
		if err != nil {
			cancel(err)
			ended <- err
			return
		}
		if run != nil {
			st.s.workers.Run(func() { st.readFramed(ctx, cancel, f, ended) })
			run()
			return
		}
	}
}

// start readies one operation and returns the function that runs it and
// answers it, or cancels one in flight (and returns no function).
func (st *serverStream) start(ctx context.Context, req *fencev1.StreamRequest) (func(), error) {
	st.s.metrics.streamRequests.WithLabelValues(ops.Label(req)).Inc()
	id := req.GetId()
	if id == 0 {
		return nil, fmt.Errorf("%w: a stream operation needs an id other than 0", fence.ErrInvalidArgument)
	}
	if _, ok := req.GetOp().(*fencev1.StreamRequest_Cancel); ok {
		st.mu.Lock()
		if stop := st.ops[id]; stop != nil {
			stop(context.Canceled)
		}
		st.mu.Unlock()
		return nil, nil
	}
	// A client keeps to MaxStreamOps (StreamOpened), and a slot is freed
	// before its answer is sent: this waits only for a client that does
	// not, or that runs several streams on one connection.
	select {
	case st.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	opCtx, stop := context.WithCancelCause(ctx)
	st.mu.Lock()
	if st.ops[id] != nil {
		st.mu.Unlock()
		stop(nil)
		<-st.slots
		return nil, fmt.Errorf("%w: operation id %d is already in flight on this stream", fence.ErrInvalidArgument, id)
	}
	st.ops[id] = stop
	st.mu.Unlock()
	st.wg.Add(1)
	return func() {
		defer st.wg.Done()
		resp := st.s.runStreamOp(opCtx, req)
		st.mu.Lock()
		delete(st.ops, id)
		st.mu.Unlock()
		stop(nil)
		<-st.slots
		if err := st.conn.Send(resp); err != nil {
			st.s.logger.Debug("answering a stream operation failed", "id", id, "err", err)
		}
	}, nil
}

// watch ends the stream when this node stops leading (term is closed then)
// or shuts down, and when its caller's credential no longer authenticates.
func (st *serverStream) watch(ctx context.Context, cancel context.CancelCauseFunc, term <-chan struct{}) {
	s := st.s
	auth := s.watchAuth(ctx)
	defer auth.Stop()
	var quiet <-chan time.Time // framed streams: HTTP/2 pings find Connect's silent clients
	framed, isFramed := st.conn.(framedStream)
	if isFramed {
		t := time.NewTicker(s.framed.silence / 3)
		defer t.Stop()
		quiet = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-quiet:
			if idle := framed.ReadIdle(); idle > s.framed.silence {
				cancel(fmt.Errorf("%w: nothing came from the client for %v, not even a ping", fence.ErrUnavailable, idle.Round(time.Second)))
				return
			}
		case <-term:
			cancel(fmt.Errorf("%w: this node lost leadership; open the stream at the new leader", fence.ErrUnavailable))
			return
		case <-s.done:
			cancel(fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable))
			return
		case <-auth.Lost():
			cancel(fmt.Errorf("the stream ended: %w", auth.Err()))
			return
		}
	}
}

// runStreamOp runs one operation and returns its answer, counting it in
// the metrics under its unary call's procedure.
func (s *Server) runStreamOp(ctx context.Context, req *fencev1.StreamRequest) (resp *fencev1.StreamResponse) {
	start := time.Now()
	op, msg := ops.Of(req)
	procedure := fencev1connect.StreamServiceSessionProcedure
	switch {
	case op != nil:
		procedure = op.Procedure()
	case req.GetKeepAlive() != nil:
		procedure = fencev1connect.SessionServiceKeepAliveProcedure
	}
	resp = &fencev1.StreamResponse{Id: req.GetId()}
	defer func() {
		if p := recover(); p != nil {
			s.logger.Error("stream operation panicked", "procedure", procedure, "panic", p)
			resp = &fencev1.StreamResponse{Id: req.GetId(), Error: rpcerr.ToStream(connect.NewError(connect.CodeInternal, fmt.Errorf("internal error in %s", procedure)))}
		}
	}()
	var err error
	switch {
	case op != nil:
		err = s.streamOp(ctx, op, msg, req, resp)
	case req.GetKeepAlive() != nil:
		err = s.streamKeepAlive(ctx, req.GetKeepAlive(), resp, start)
	default:
		err = fmt.Errorf("%w: stream operation %d carries no operation this node knows", fence.ErrInvalidArgument, req.GetId())
	}
	if err != nil {
		resp.Result = nil
		resp.Error = rpcerr.ToStream(s.leaderHint(err))
		s.metrics.observe(procedure, start, connect.Code(resp.Error.GetCode()))
	} else if req.GetKeepAlive() == nil {
		s.metrics.observe(procedure, start, 0)
	}
	return resp
}

// streamOp checks an operation of the table as its unary call is checked,
// runs it with the same handler, and sets its answer in resp.
func (s *Server) streamOp(ctx context.Context, op ops.Any, msg proto.Message, req *fencev1.StreamRequest, resp *fencev1.StreamResponse) error {
	ctx, err := s.checkStreamOp(ctx, op.Procedure(), msg)
	if err != nil {
		return err
	}
	key, err := checkIdempotencyKeyAs("idempotency_key", req.GetIdempotencyKey())
	if err != nil {
		return err
	}
	out, err := byOperation[op.Name()].run(s, ctx, msg, key)
	if err != nil {
		return err
	}
	op.Answer(resp, out)
	return nil
}

// streamKeepAlive renews the sessions of one message, each answered on
// its own, as the unary KeepAlive would answer it.
func (s *Server) streamKeepAlive(ctx context.Context, m *fencev1.KeepAliveManyRequest, resp *fencev1.StreamResponse, start time.Time) error {
	procedure := fencev1connect.SessionServiceKeepAliveProcedure
	if n := len(m.GetSessions()); n > maxKeepAliveSessions {
		return fmt.Errorf("%w: a keepalive message names %d sessions, over the limit of %d", fence.ErrInvalidArgument, n, maxKeepAliveSessions)
	}
	if _, err := s.checkStreamOp(ctx, procedure, m); err != nil {
		return err
	}
	results := s.keepAlive(ctx, m.GetSessions())
	out := &fencev1.KeepAliveManyResponse{Results: make([]*fencev1.KeepAliveResult, len(results))}
	renewed := 0
	for i, r := range results {
		res := &fencev1.KeepAliveResult{SessionId: m.GetSessions()[i].GetSessionId(), Ok: r.resp}
		if r.err != nil {
			res.Error = rpcerr.ToStream(s.leaderHint(r.err))
			s.metrics.observe(procedure, start, connect.Code(res.Error.GetCode()))
		} else {
			renewed++
		}
		out.Results[i] = res
	}
	s.metrics.observeN(procedure, start, 0, renewed)
	resp.Result = &fencev1.StreamResponse_KeepAlive{KeepAlive: out}
	return nil
}

// leaderTerm tells streams that this node stopped leading: current's
// channel is closed when the leadership it was taken in ends.
type leaderTerm struct {
	mu  sync.Mutex
	end chan struct{}
}

// begin starts a term, ending the one before if it was not ended; it is
// called before the node is marked ready.
func (t *leaderTerm) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end != nil {
		close(t.end)
	}
	t.end = make(chan struct{})
}

// over ends the term; it is called after the node is marked not ready.
func (t *leaderTerm) over() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end != nil {
		close(t.end)
		t.end = nil
	}
}

// current returns the channel of the term in force. Read before checking
// that the node is ready, it is closed whenever that readiness ends.
func (t *leaderTerm) current() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.end == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return t.end
}

// streamReads lets a stream live as long as its client keeps it open:
// the server's ReadTimeout bounds a request body, and a stream's body is
// every operation the client will send. Each message is still bounded in
// size (MaxRequestBytes).
func streamReads(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		next.ServeHTTP(w, r)
	})
}
