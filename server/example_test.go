package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/server"
)

// A single node on a data dir of its own, in this process: what `fence
// serve` runs. Clients reach it at srv.Addr().
func ExampleStart() {
	dir, _ := os.MkdirTemp("", "fence-server-example")
	defer os.RemoveAll(dir)
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.RaftListen = dir, "127.0.0.1:0", "127.0.0.1:0"
	srv, err := server.Start(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitLeader(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("serving")
	// Output: serving
}

// A program serves the node's API on an HTTP server of its own, beside
// its own routes; fence's clients reach the node through it.
func ExampleServer_Handler() {
	dir, _ := os.MkdirTemp("", "fence-handler-example")
	defer os.RemoveAll(dir)
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.RaftListen = dir, "127.0.0.1:0", "127.0.0.1:0"
	node, err := server.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := node.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("/app/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "the program's own") })
	mux.Handle("/", node.Handler()) // fence's services, at their own paths
	app := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	app.Protocols.SetHTTP1(true)
	app.Protocols.SetUnencryptedHTTP2(true) // gRPC without TLS
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go app.Serve(ln)
	defer app.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(client.WithEndpoints(ln.Addr().String()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	sess, err := c.NewSession(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sess.Close(ctx)
	g, err := client.NewMutex(sess, "jobs/nightly").Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("granted", g.Lock())
	// Output: granted jobs/nightly
}
