package fencingconnect_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/fencingconnect"
)

// rpcStorage is a Connect service guarded by the interceptor.
type rpcStorage struct {
	fencev1connect.UnimplementedKVServiceHandler
	mu     sync.Mutex
	values map[string]string
}

func (s *rpcStorage) Put(ctx context.Context, req *connect.Request[fencev1.PutRequest]) (*connect.Response[fencev1.PutResponse], error) {
	if _, token, ok := fencing.TokenFrom(ctx); !ok || token == 0 {
		return nil, connect.NewError(connect.CodeInternal, errors.New("the admitted token is not in the context"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values[req.Msg.GetKey()] = string(req.Msg.GetValue())
	return connect.NewResponse(&fencev1.PutResponse{}), nil
}

func TestConnectInterceptors(t *testing.T) {
	st := &rpcStorage{values: map[string]string{}}
	_, handler := fencev1connect.NewKVServiceHandler(st,
		connect.WithInterceptors(fencingconnect.ServerInterceptor(fencing.NewGuard(fencing.NewMemory()))))
	srv := httptest.NewUnstartedServer(handler)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	for _, proto := range []struct {
		name string
		opt  connect.ClientOption
	}{{"connect", connect.WithProtoJSON()}, {"grpc", connect.WithGRPC()}} {
		t.Run(proto.name, func(t *testing.T) {
			kv := fencev1connect.NewKVServiceClient(srv.Client(), srv.URL, proto.opt, connect.WithInterceptors(fencingconnect.ClientInterceptor()))
			ctx := context.Background()
			key := "orders/" + proto.name
			putWith := func(lock string, token uint64, value string) error {
				_, err := kv.Put(fencing.WithToken(ctx, lock, token), connect.NewRequest(&fencev1.PutRequest{Key: key, Value: []byte(value)}))
				return err
			}
			if err := putWith("orders-"+proto.name, 34, "b"); err != nil {
				t.Fatal(err)
			}
			err := putWith("orders-"+proto.name, 33, "a")
			var stale *fence.StaleTokenError
			if !errors.As(err, &stale) || stale.Token != 33 || stale.Highest != 34 {
				t.Fatalf("stale call: %v; want a StaleTokenError 33 < 34", err)
			}
			_, err = kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: key, Value: []byte("none")}))
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("call without a token: %v, want ErrInvalidArgument", err)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.values[key] != "b" {
				t.Fatalf("stored %q, want b", st.values[key])
			}
		})
	}
}
