// Package fencingconnect guards Connect and gRPC services with the fenced
// write rule of package fencing: a server interceptor that admits each
// guarded call through a fencing.Guard, and a client interceptor that sends
// the caller's lock and token as metadata. It is a package of its own so
// that fencing and its stores do not depend on Connect.
package fencingconnect

import (
	"context"
	"strconv"

	"connectrpc.com/connect"

	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/internal/rpcerr"
)

// InterceptorOption configures ServerInterceptor.
type InterceptorOption func(*interceptor)

type interceptor struct {
	key     func(ctx context.Context, req connect.AnyRequest) string
	guarded func(procedure string) bool
}

// WithRPCKey sets how a request names the resource it writes (default: the
// fence-lock metadata, or the procedure when there is none).
func WithRPCKey(key func(ctx context.Context, req connect.AnyRequest) string) InterceptorOption {
	return func(i *interceptor) { i.key = key }
}

// WithGuardedProcedures sets which procedures are writes that need a token
// (default: every unary procedure).
func WithGuardedProcedures(guarded func(procedure string) bool) InterceptorOption {
	return func(i *interceptor) { i.guarded = guarded }
}

// ServerInterceptor guards Connect and gRPC handlers with the fenced write
// rule: a guarded unary call must carry fence-token metadata (and fence-lock
// in strict mode) and runs inside g.Admit. A stale token is answered with
// FailedPrecondition and a fence.v1.ErrorDetail naming both tokens; a
// missing or malformed one with InvalidArgument. The handler is not called.
func ServerInterceptor(g *fencing.Guard, opts ...InterceptorOption) connect.Interceptor {
	i := interceptor{
		key: func(_ context.Context, req connect.AnyRequest) string {
			if lock := req.Header().Get(fencing.HeaderLock); lock != "" {
				return lock
			}
			return req.Spec().Procedure
		},
		guarded: func(string) bool { return true },
	}
	for _, opt := range opts {
		opt(&i)
	}
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if req.Spec().IsClient || !i.guarded(req.Spec().Procedure) {
				return next(ctx, req)
			}
			token, err := fencing.ParseToken(req.Header().Get(fencing.HeaderToken))
			if err != nil {
				return nil, rpcerr.ToConnect(err)
			}
			lock := req.Header().Get(fencing.HeaderLock)
			var resp connect.AnyResponse
			err = g.Admit(ctx, i.key(ctx, req), lock, token, func(ctx context.Context) error {
				var err error
				resp, err = next(fencing.WithToken(ctx, lock, token), req)
				return err
			})
			if err != nil {
				return nil, rpcerr.ToConnect(err)
			}
			return resp, nil
		}
	})
}

// ClientInterceptor stamps the lock and token of each call's context (see
// fencing.WithToken) onto its metadata, and turns fence errors in responses back
// into errors that wrap fence's sentinels, so that
// errors.Is(err, fence.ErrStaleToken) holds on the client.
func ClientInterceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if !req.Spec().IsClient {
				return next(ctx, req)
			}
			if lock, token, ok := fencing.TokenFrom(ctx); ok {
				req.Header().Set(fencing.HeaderToken, strconv.FormatUint(token, 10))
				if lock != "" {
					req.Header().Set(fencing.HeaderLock, lock)
				}
			}
			resp, err := next(ctx, req)
			return resp, rpcerr.FromConnect(err)
		}
	})
}
