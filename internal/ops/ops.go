// Package ops is the table of the operations that travel both as unary
// calls and on a session stream (fence.v1.StreamService/Session): create
// and close a session, acquire, release, cancel an acquire, check a token,
// put, get and delete a key.
//
// Each operation is declared here once, by its request and answer types;
// the rest is read from the API's descriptors: the oneof field that names
// it in StreamRequest.op and StreamResponse.result (its label in the
// stream's metrics), and the unary call it stands for (whose permission,
// metrics and audit lines the stream's operation takes). The node serves
// both forms of every operation from this table (server/operations.go) and
// the Go client falls back from the stream to the unary call through it.
// A new operation is a proto change, a line here and its handler in the
// node; TestTableCoversTheStream keeps the table and the proto in step.
//
// Keepalives (one stream message renews many sessions, where the unary call
// renews one) and a stream's cancel are not in the table: they have no
// unary call of the same shape.
package ops

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// The operations.
var (
	CreateSession = define[fencev1.CreateSessionRequest, fencev1.CreateSessionResponse](false)
	CloseSession  = define[fencev1.CloseSessionRequest, fencev1.CloseSessionResponse](false)
	Acquire       = define[fencev1.AcquireRequest, fencev1.AcquireResponse](false)
	Release       = define[fencev1.ReleaseRequest, fencev1.ReleaseResponse](false)
	CancelAcquire = define[fencev1.CancelAcquireRequest, fencev1.CancelAcquireResponse](false)
	Check         = define[fencev1.CheckRequest, fencev1.CheckResponse](false)
	Put           = define[fencev1.PutRequest, fencev1.PutResponse](true)
	Get           = define[fencev1.GetRequest, fencev1.GetResponse](false)
	Delete        = define[fencev1.DeleteRequest, fencev1.DeleteResponse](true)
)

// All lists the operations, in the proto's order.
var All = []Any{CreateSession, CloseSession, Acquire, Release, CancelAcquire, Check, Put, Get, Delete}

// Any is an operation of any types.
type Any interface {
	// Name is the operation's oneof field in StreamRequest.op and
	// StreamResponse.result, and its label in fence_stream_requests_total.
	Name() protoreflect.Name
	// Procedure is its unary call.
	Procedure() string
	// Keyed reports whether it takes an idempotency key: the unary call's
	// Idempotency-Key header, the stream request's idempotency_key.
	Keyed() bool
	// Answer sets resp's result to m, the operation's answer.
	Answer(resp *fencev1.StreamResponse, m proto.Message)
	// Caller returns a function that runs the operation as its unary call
	// at the node at baseURL.
	Caller(hc connect.HTTPClient, baseURL string, opts ...connect.ClientOption) Caller
}

// Caller runs an operation as its unary call: msg is its request, key its
// idempotency key ("" for none).
type Caller func(ctx context.Context, msg proto.Message, key string) (proto.Message, error)

// Op is an operation whose request is a Req and whose answer a Resp.
type Op[Req, Resp any] struct {
	name      protoreflect.Name
	result    protoreflect.FieldDescriptor
	method    protoreflect.MethodDescriptor
	procedure string
	keyed     bool
}

var (
	requestOp  = (&fencev1.StreamRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("op")
	responseOp = (&fencev1.StreamResponse{}).ProtoReflect().Descriptor().Oneofs().ByName("result")
	// byName finds an operation by its oneof field's name.
	byName = map[protoreflect.Name]Any{}
)

// define declares the operation whose request is a Req: its oneof fields
// and its unary call are found in the API's descriptors. A Req that is not
// in StreamRequest.op, a Resp that is not the same field of
// StreamResponse.result, or a Req that no unary call takes is a mistake of
// this table, and panics when the program starts.
func define[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](keyed bool) *Op[Req, Resp] {
	req := PReq(new(Req)).ProtoReflect().Descriptor()
	resp := PResp(new(Resp)).ProtoReflect().Descriptor()
	field := fieldOf(requestOp, req)
	if field == nil {
		panic(fmt.Sprintf("ops: %s is no operation of StreamRequest.op", req.FullName()))
	}
	result := responseOp.Fields().ByName(field.Name())
	if result == nil || result.Message() == nil || result.Message().FullName() != resp.FullName() {
		panic(fmt.Sprintf("ops: StreamResponse.result has no field %s of type %s", field.Name(), resp.FullName()))
	}
	method := methodOf(req, resp)
	if method == nil {
		panic(fmt.Sprintf("ops: no unary call takes %s and answers %s", req.FullName(), resp.FullName()))
	}
	procedure := "/" + string(method.Parent().FullName()) + "/" + string(method.Name())
	op := &Op[Req, Resp]{name: field.Name(), result: result, method: method, procedure: procedure, keyed: keyed}
	byName[op.name] = op
	return op
}

func fieldOf(oneof protoreflect.OneofDescriptor, msg protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	fields := oneof.Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); f.Message() != nil && f.Message().FullName() == msg.FullName() {
			return f
		}
	}
	return nil
}

// methodOf finds the unary method of the API that takes req and answers
// resp.
func methodOf(req, resp protoreflect.MessageDescriptor) protoreflect.MethodDescriptor {
	services := fencev1.File_fence_v1_fence_proto.Services()
	for i := range services.Len() {
		methods := services.Get(i).Methods()
		for j := range methods.Len() {
			m := methods.Get(j)
			if !m.IsStreamingClient() && !m.IsStreamingServer() && m.Input().FullName() == req.FullName() && m.Output().FullName() == resp.FullName() {
				return m
			}
		}
	}
	return nil
}

// Of returns the operation a stream request carries, and its request
// message; nil when it carries none of the table's (a keepalive, a cancel,
// or a field this build does not know).
func Of(req *fencev1.StreamRequest) (Any, proto.Message) {
	m := req.ProtoReflect()
	field := m.WhichOneof(requestOp)
	if field == nil {
		return nil, nil
	}
	op := byName[field.Name()]
	if op == nil {
		return nil, nil
	}
	return op, m.Get(field).Message().Interface()
}

// Label is the name of the oneof field req carries, whether in the table
// or not (keep_alive, cancel), or "unknown" for none this build knows: a
// stream operation's label in fence_stream_requests_total.
func Label(req *fencev1.StreamRequest) string {
	if f := req.ProtoReflect().WhichOneof(requestOp); f != nil {
		return string(f.Name())
	}
	return "unknown"
}

func (o *Op[Req, Resp]) Name() protoreflect.Name { return o.name }
func (o *Op[Req, Resp]) Procedure() string       { return o.procedure }
func (o *Op[Req, Resp]) Keyed() bool             { return o.keyed }

func (o *Op[Req, Resp]) Answer(resp *fencev1.StreamResponse, m proto.Message) {
	resp.ProtoReflect().Set(o.result, protoreflect.ValueOfMessage(m.ProtoReflect()))
}

func (o *Op[Req, Resp]) Caller(hc connect.HTTPClient, baseURL string, opts ...connect.ClientOption) Caller {
	c := connect.NewClient[Req, Resp](hc, baseURL+o.procedure, connect.WithSchema(o.method), connect.WithClientOptions(opts...))
	return func(ctx context.Context, msg proto.Message, key string) (proto.Message, error) {
		req, ok := any(msg).(*Req)
		if !ok {
			return nil, fmt.Errorf("ops: %s takes a %T, not a %T", o.name, new(Req), msg)
		}
		r := connect.NewRequest(req)
		if key != "" {
			r.Header().Set(fencev1.IdempotencyKeyHeader, key)
		}
		resp, err := c.CallUnary(ctx, r)
		if err != nil {
			return nil, err
		}
		return any(resp.Msg).(proto.Message), nil
	}
}

// Handler returns the unary handler of o at its procedure: run serves a
// call with its request and idempotency key ("" for none, or when o takes
// none).
func (o *Op[Req, Resp]) Handler(run func(ctx context.Context, req *connect.Request[Req], key string) (*Resp, error), opts ...connect.HandlerOption) (string, http.Handler) {
	return o.procedure, connect.NewUnaryHandler(o.procedure, func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Resp], error) {
		var key string
		if o.keyed {
			key = req.Header().Get(fencev1.IdempotencyKeyHeader)
		}
		out, err := run(ctx, req, key)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(out), nil
	}, connect.WithSchema(o.method), connect.WithHandlerOptions(opts...))
}
