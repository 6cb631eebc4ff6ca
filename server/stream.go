package server

import (
	"context"
	"fmt"
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
	"github.com/fencelock/fence/internal/wire"
	"github.com/fencelock/fence/server/internal/opstream"
)

// The session stream (docs/design.md, The session stream): one
// bidirectional stream per client carries every operation of its sessions.
// opstream runs each in a goroutine of its own and answers it by id when
// it completes, so that a blocked acquire holds up nothing else on the
// stream; here each runs through the same function its unary handler
// calls, checked as that call is checked (runStreamOp).

// maxKeepAliveSessions bounds the sessions of one KeepAliveManyRequest.
const maxKeepAliveSessions = 10_000

// Session implements fencev1connect.StreamServiceHandler. Only a ready
// leader serves a stream, and it ends its streams when it stops leading or
// shuts down, and a stream whose credential no longer authenticates.
func (s handlers) Session(ctx context.Context, stream *connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]) error {
	term := s.leaderTerm.current()
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	ctx = withClientAddr(ctx, stream.Peer().Addr, stream.RequestHeader())
	return s.serveStream(ctx, term, opstream.NewConnect(stream))
}

// serveStream serves an open stream of a leader in term until it ends,
// and returns why. The stream ends when this node stops leading (term is
// closed then) or shuts down, and when its caller's credential no longer
// authenticates.
func (s *Server) serveStream(ctx context.Context, term <-chan struct{}, conn opstream.Conn) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		auth := s.watchAuth(ctx)
		defer auth.Stop()
		select {
		case <-ctx.Done():
		case <-term:
			cancel(fmt.Errorf("%w: this node lost leadership; open the stream at the new leader", fence.ErrUnavailable))
		case <-s.done:
			cancel(fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable))
		case <-auth.Lost():
			cancel(fmt.Errorf("the stream ended: %w", auth.Err()))
		}
	}()
	return s.streams.Serve(ctx, conn)
}

// The session stream framed on the connection (docs/design.md, The
// session stream): a client asks for it with an HTTP/1.1 upgrade to
// wire.Protocol on the stream's path, and the same operations then travel
// as frames on the bare connection, each answered from the goroutine that
// ran it. Everything but the transport is the Connect stream's
// (serveStream).

// framedSilence is how long a framed stream may go without a frame from
// its client (which pings after 10 seconds of quiet) before the node
// drops it (opstream.Streams.Silence). A variable for tests; a Server
// reads it when made.
var framedSilence = 45 * time.Second

// framedStreams serves the framed session stream to the requests that ask
// for it, and passes every other request to next.
func (s *Server) framedStreams(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+fencev1connect.StreamServiceName+"/Session" || !wire.Asked(r.Header) {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.serveFramed(w, r); err != nil {
			errs.Write(w, r, rpcerr.ToConnect(s.leaderHint(err)))
		}
	})
}

// serveFramed serves one framed stream. It returns an error, for the
// caller to answer, only while nothing was written: a refusal (not the
// leader, no credential) is answered as the Connect stream's open would
// be, with the connection still HTTP.
func (s *Server) serveFramed(w http.ResponseWriter, r *http.Request) error {
	term := s.leaderTerm.current()
	if r.ProtoMajor != 1 {
		return fmt.Errorf("%w: the framed session stream is an HTTP/1.1 upgrade; over HTTP/2 open %s", fence.ErrInvalidArgument, fencev1connect.StreamServiceSessionProcedure)
	}
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	ctx := withClientAddr(r.Context(), r.RemoteAddr, r.Header)
	ctx, err := s.checkStreamOpen(ctx, r.RemoteAddr, r.Header)
	if err != nil {
		return err
	}
	// A stream's writes are bounded by the write timeout or, with none,
	// by the silence after which a stream is dropped: a client that reads
	// nothing for as long is as gone as one that says nothing.
	writeTimeout := s.cfg.WriteTimeout
	if writeTimeout == 0 {
		writeTimeout = s.streams.Silence
	}
	return s.upgrades.Serve(w, s.cfg.MaxRequestBytes, writeTimeout, func(f opstream.Framed) {
		if err := s.serveStream(ctx, term, f); err != nil {
			// Why the stream ended, as the Connect stream's trailers say
			// it, to a client that still reads.
			_ = f.Finish(&fencev1.StreamResponse{Error: rpcerr.ToStream(s.leaderHint(err))}, time.Second)
		}
	})
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
