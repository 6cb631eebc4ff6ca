package server_test

import (
	"context"
	"fmt"
	"os"
	"time"

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
