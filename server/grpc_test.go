package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// gRPC tooling finds its way: the standard health service answers for the
// server and each fence service (and NotFound for others), and server
// reflection lists the services and serves their descriptors, as grpcurl
// and Kubernetes gRPC probes expect.
func TestGRPCHealthAndReflection(t *testing.T) {
	s := startTestServer(t, nil)
	base := "http://" + s.Addr()
	for service, want := range map[string]string{
		"":                        `{"status":"SERVING_STATUS_SERVING"}`,
		"fence.v1.LockService":    `{"status":"SERVING_STATUS_SERVING"}`,
		"fence.v1.SessionService": `{"status":"SERVING_STATUS_SERVING"}`,
		"no.such.Service":         `"code":"not_found"`,
	} {
		resp, err := http.Post(base+"/grpc.health.v1.Health/Check", "application/json", bytes.NewBufferString(`{"service":"`+service+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("health of %q: HTTP %d %s, want %s", service, resp.StatusCode, body, want)
		}
	}

	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream := grpcreflect.NewClient(h2c, base, connect.WithGRPC()).NewStream(ctx)
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []protoreflect.FullName{"fence.v1.SessionService", "fence.v1.LockService", "fence.v1.KVService", "fence.v1.ClusterService"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	files, err := stream.FileContainingSymbol("fence.v1.LockService")
	if err != nil || len(files) == 0 || files[0].GetPackage() != "fence.v1" {
		t.Fatalf("descriptor of fence.v1.LockService: %v, %v", files, err)
	}
}
