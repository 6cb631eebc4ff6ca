package opstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/ops"
	"github.com/fencelock/fence/internal/wire"
	"github.com/fencelock/fence/server/internal/apinet"
)

// Conn is what a stream's messages travel on: a Connect stream over
// HTTP/2 (NewConnect) or frames on the connection itself (a Framed).
// Send may be called from many goroutines at once.
type Conn interface {
	Receive() (*fencev1.StreamRequest, error)
	Send(*fencev1.StreamResponse) error
}

// NewConnect returns the Conn of a Connect (or gRPC) stream, its sends
// made one at a time.
func NewConnect(stream *connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]) Conn {
	return &connectConn{BidiStream: stream}
}

type connectConn struct {
	*connect.BidiStream[fencev1.StreamRequest, fencev1.StreamResponse]
	mu sync.Mutex
}

func (c *connectConn) Send(resp *fencev1.StreamResponse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.BidiStream.Send(resp)
}

// Framed is a stream framed on its connection.
type Framed struct{ *wire.Conn }

// Receive reads the next operation.
func (f Framed) Receive() (*fencev1.StreamRequest, error) {
	req := &fencev1.StreamRequest{}
	if err := f.Read(req); err != nil {
		return nil, err
	}
	return req, nil
}

// Send writes an answer.
func (f Framed) Send(resp *fencev1.StreamResponse) error {
	return f.Write(resp)
}

// Streams serves open streams. Its fields are set before the first
// stream and not changed after.
type Streams struct {
	// Run runs one operation and returns its answer, with the request's
	// id; it is called once for every request but a cancel.
	Run func(ctx context.Context, req *fencev1.StreamRequest) *fencev1.StreamResponse
	// Workers runs each operation, and each framed stream's reading.
	Workers *apinet.Workers
	// Silence is how long a framed stream may go without a frame from
	// its client (which pings after 10 seconds of quiet) before it is
	// dropped: a client host gone, or a client process stopped.
	Silence time.Duration
	// MaxOps is how many operations may be in flight on one connection,
	// all its streams together.
	MaxOps int
	// Opens counts the streams opened, by transport ("framed" or
	// "http2"); Open counts those open; Requests the messages received,
	// by operation (ops.Label).
	Opens    *prometheus.CounterVec
	Open     prometheus.Gauge
	Requests *prometheus.CounterVec
	Logger   *slog.Logger
}

// ErrEnded is the cause of the operations cancelled when their stream
// ends under them.
var ErrEnded = fmt.Errorf("%w: the stream ended", fence.ErrUnavailable)

// Serve serves an open stream until it ends, and returns why: nil when
// the client closed its side and every operation was answered, the cause
// of ctx's end when that ended it. It first tells the client how many
// operations it may have in flight: the slots of the connection the
// stream came on (ConnContext), shared by every stream on it.
func (s *Streams) Serve(ctx context.Context, conn Conn) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st := &stream{s: s, conn: conn, slots: s.slotsOf(ctx), ops: map[uint64]context.CancelCauseFunc{}}
	opened := &fencev1.StreamResponse{Result: &fencev1.StreamResponse_Opened{Opened: &fencev1.StreamOpened{MaxInFlight: uint32(cap(st.slots))}}}
	if err := conn.Send(opened); err != nil {
		return err
	}
	transport := "http2"
	if f, ok := conn.(Framed); ok {
		transport = "framed"
		go st.dropWhenSilent(ctx, cancel, f)
	}
	s.Opens.WithLabelValues(transport).Inc()
	s.Open.Inc()
	defer s.Open.Dec()
	err := st.serve(ctx, cancel)
	st.wg.Wait()
	return err
}

// slotsKey is the context key of a connection's slots.
type slotsKey struct{}

// slots holds one element per stream operation in flight on one API
// connection, all its streams together: a client that opens many streams
// on one connection gets no more than one stream's worth.
type slots chan struct{}

// ConnContext is an http.Server's ConnContext: it gives each connection
// slots for MaxOps stream operations in flight.
func (s *Streams) ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, slotsKey{}, make(slots, s.MaxOps))
}

// slotsOf returns the slots of the connection a stream came on, or slots
// of its own for a stream that came another way (a handler tested alone).
func (s *Streams) slotsOf(ctx context.Context) slots {
	if sl, ok := ctx.Value(slotsKey{}).(slots); ok {
		return sl
	}
	return make(slots, s.MaxOps)
}

// LongReads lets a stream live as long as its client keeps it open: the
// server's ReadTimeout bounds a request body, and a stream's body is
// every operation the client will send. Each message is still bounded in
// size.
func LongReads(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		next.ServeHTTP(w, r)
	})
}

// stream is one open stream.
type stream struct {
	s     *Streams
	conn  Conn
	slots slots // its connection's: one per operation in flight
	wg    sync.WaitGroup

	mu  sync.Mutex
	ops map[uint64]context.CancelCauseFunc // the operations in flight, by id
}

// serve reads operations until the stream ends, and returns why.
func (st *stream) serve(ctx context.Context, cancel context.CancelCauseFunc) error {
	if f, ok := st.conn.(Framed); ok {
		// A read blocked when the stream ends is ended through the
		// connection.
		stop := context.AfterFunc(ctx, f.InterruptRead)
		defer stop()
		ended := make(chan error, 1)
		st.s.Workers.Run(func() { st.readFramed(ctx, cancel, f, ended) })
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
			cancel(ErrEnded)
			return err
		case req := <-reqs:
			run, err := st.start(ctx, req)
			if err != nil {
				cancel(err)
				return err
			}
			if run != nil {
				st.s.Workers.Run(run)
			}
		}
	}
}

// readFramed reads operations from a framed stream until one is to run:
// it hands the reading on to another goroutine and runs that operation
// itself, so that no hand-off stands between an operation's arrival and
// its work (the next reader wakes meanwhile). It reports on ended why the
// stream ended, once it did.
func (st *stream) readFramed(ctx context.Context, cancel context.CancelCauseFunc, f Framed, ended chan<- error) {
	for {
		req, err := f.Receive()
		if ctx.Err() != nil {
			ended <- context.Cause(ctx)
			return
		}
		if errors.Is(err, io.EOF) {
			// A framed client never closes only its side (the Go client
			// closes the connection when its stream ends, as a dead
			// process's kernel does): the end of its frames is its end,
			// and what it left running is given up, as a unary caller's
			// call is when it goes away.
			cancel(ErrEnded)
			st.wg.Wait()
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
			st.s.Workers.Run(func() { st.readFramed(ctx, cancel, f, ended) })
			run()
			return
		}
	}
}

// start readies one operation and returns the function that runs it and
// answers it, or cancels one in flight (and returns no function).
func (st *stream) start(ctx context.Context, req *fencev1.StreamRequest) (func(), error) {
	st.s.Requests.WithLabelValues(ops.Label(req)).Inc()
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
	// A client keeps to the slots it was told of (StreamOpened), and a
	// slot is freed before its answer is sent: this waits only for a
	// client that does not, or that runs several streams on one
	// connection.
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
		resp := st.s.Run(opCtx, req)
		st.mu.Lock()
		delete(st.ops, id)
		st.mu.Unlock()
		stop(nil)
		<-st.slots
		if err := st.conn.Send(resp); err != nil {
			st.s.Logger.Debug("answering a stream operation failed", "id", id, "err", err)
		}
	}, nil
}

// dropWhenSilent ends a framed stream that nothing came on for Silence:
// HTTP/2's pings find Connect's silent clients.
func (st *stream) dropWhenSilent(ctx context.Context, cancel context.CancelCauseFunc, f Framed) {
	t := time.NewTicker(st.s.Silence / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if idle := f.ReadIdle(); idle > st.s.Silence {
				cancel(fmt.Errorf("%w: nothing came from the client for %v, not even a ping", fence.ErrUnavailable, idle.Round(time.Second)))
				return
			}
		}
	}
}
