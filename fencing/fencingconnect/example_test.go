package fencingconnect_test

import (
	"connectrpc.com/connect"

	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/fencingconnect"
)

// A Connect or gRPC service guards its writes with the server interceptor;
// its callers send their lock and token with the client interceptor and
// fencing.WithToken on each call's context.
func ExampleServerInterceptor() {
	guard := fencing.NewGuard(fencing.NewMemory())
	handlerOpts := connect.WithInterceptors(fencingconnect.ServerInterceptor(guard))
	clientOpts := connect.WithInterceptors(fencingconnect.ClientInterceptor())
	_, _ = handlerOpts, clientOpts // pass to your New...Handler and New...Client
}
