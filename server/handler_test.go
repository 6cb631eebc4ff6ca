package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
)

// A program serves the node's API on an HTTP server of its own, beside its
// own routes: the Go client's calls and session stream, gRPC over
// cleartext HTTP/2, and JSON over HTTP all work through it. Before Start
// and after Close the handler answers Unavailable, and the program's own
// routes go on.
func TestHandlerServesTheAPIOnAProgramsOwnServer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.RaftListen = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/app/hello", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })
	mux.Handle("/", s.Handler())
	app := httptest.NewUnstartedServer(mux)
	app.Config.Protocols = new(http.Protocols)
	app.Config.Protocols.SetHTTP1(true)
	app.Config.Protocols.SetUnencryptedHTTP2(true) // gRPC without TLS
	app.Start()
	defer app.Close()
	addr := strings.TrimPrefix(app.URL, "http://")

	status := func() (int, string) {
		resp, err := http.Post(app.URL+"/"+fencev1connect.ClusterServiceName+"/Status", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := status(); code != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Fatalf("before Start, Status through the program's server: %d %s; want 503 saying the node is not running", code, body)
	}

	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready leader", s.leaderReady.Load)
	if code, body := status(); code != http.StatusOK || !strings.Contains(body, `"state":"Leader"`) {
		t.Fatalf("Status as JSON through the program's server: %d %s", code, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(client.WithEndpoints(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sess, m, g := mustHoldLock(t, cl, 10*time.Second, "through-the-app")
	if _, err := cl.KV().Put(ctx, "k", []byte("v"), client.WithGrant(g)); err != nil {
		t.Fatalf("a fenced put through the program's server: %v", err)
	}
	mustUnlock(t, m)
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err)
	}

	var cleartextHTTP2 http.Protocols
	cleartextHTTP2.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &cleartextHTTP2}}
	grpcKV := fencev1connect.NewKVServiceClient(h2c, app.URL, connect.WithGRPC())
	got, err := grpcKV.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Key: "k"}))
	if err != nil || string(got.Msg.GetKv().GetValue()) != "v" {
		t.Fatalf("a gRPC Get through the program's server: %v, %v", got, err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if code, body := status(); code != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Fatalf("after Close, Status through the program's server: %d %s; want 503", code, body)
	}
	resp, err := http.Get(app.URL + "/app/hello")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); string(body) != "hello" {
		t.Fatalf("the program's own route answered %q", body)
	}
}
