package server

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/ops"
)

// operations are the node's handlers of the table of internal/ops: each
// takes the request message, the call's context (which carries the
// caller's checked identity, see callerUser, and address) and, for writes,
// the idempotency key, so that the unary call and the session stream
// (stream.go) run exactly the same code. The unary handlers are mounted at
// the operations' procedures, in front of the generated services (handler).
var operations = []operation{
	handle(ops.CreateSession, (*Server).createSession),
	handle(ops.CloseSession, (*Server).closeSession),
	handle(ops.Acquire, (*Server).acquire),
	handle(ops.Release, (*Server).release),
	handle(ops.CancelAcquire, (*Server).cancelAcquire),
	handle(ops.Check, (*Server).check),
	handleKeyed(ops.Put, (*Server).put),
	handle(ops.Get, (*Server).get),
	handleKeyed(ops.Delete, (*Server).delete),
}

// byOperation finds an operation's handler by its name in the table.
var byOperation = func() map[protoreflect.Name]operation {
	m := make(map[protoreflect.Name]operation, len(operations))
	for _, o := range operations {
		m[o.op.Name()] = o
	}
	return m
}()

// operation is the handler of one operation of the table.
type operation struct {
	op ops.Any
	// run runs it with its request and idempotency key.
	run func(s *Server, ctx context.Context, msg proto.Message, key string) (proto.Message, error)
	// unary returns its unary handler and the path it serves.
	unary func(s *Server, opts []connect.HandlerOption) (string, http.Handler)
}

// handle makes the handler of an operation that takes no idempotency key.
func handle[Req, Resp any](op *ops.Op[Req, Resp], fn func(*Server, context.Context, *Req) (*Resp, error)) operation {
	return handleKeyed(op, func(s *Server, ctx context.Context, m *Req, _ string) (*Resp, error) { return fn(s, ctx, m) })
}

// handleKeyed makes the handler of an operation that takes one.
func handleKeyed[Req, Resp any](op *ops.Op[Req, Resp], fn func(*Server, context.Context, *Req, string) (*Resp, error)) operation {
	return operation{
		op: op,
		run: func(s *Server, ctx context.Context, msg proto.Message, key string) (proto.Message, error) {
			out, err := fn(s, ctx, any(msg).(*Req), key)
			if err != nil {
				return nil, err
			}
			return any(out).(proto.Message), nil
		},
		unary: func(s *Server, opts []connect.HandlerOption) (string, http.Handler) {
			return op.Handler(func(ctx context.Context, req *connect.Request[Req], key string) (*Resp, error) {
				return fn(s, withClientAddr(ctx, req.Peer().Addr, req.Header()), req.Msg, key)
			}, opts...)
		},
	}
}

// The generated services' interfaces ask for the table's operations too;
// these stand in for them, and are never called: the table's handlers are
// mounted at those procedures' paths, which the mux prefers to the
// services' prefixes (TestOperationsAreServedByTheTable).
type (
	unservedSession = fencev1connect.UnimplementedSessionServiceHandler
	unservedLock    = fencev1connect.UnimplementedLockServiceHandler
	unservedKV      = fencev1connect.UnimplementedKVServiceHandler
)
