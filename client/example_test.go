package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/server"
)

// Take a lock, write with its fencing token, release it. The example runs
// its own single-node server in a temporary directory.
func ExampleMutex() {
	srv, stop := startExampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(client.WithEndpoints(srv.Addr()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx) // kept alive in the background
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	m := client.NewMutex(s, "orders")
	for range 2 {
		g, err := m.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		// Send g.Token() with every write; do the work under g.Context().
		fmt.Println("holding", g.Lock(), "with token", g.Token())
		if err := m.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// holding orders with token 1
	// holding orders with token 2
}

// Take a lease, as a cron job or a serverless function does: one call,
// no session to keep alive. A second caller is told at once that the lock
// is held, and by whom. The lease is renewed, then released.
func ExampleClient_Lease() {
	srv, stop := startExampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(client.WithEndpoints(srv.Addr()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	l, err := c.Lease(ctx, "nightly", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// Send l.Token() with every write; renew before l.SafeUntil() passes.
	fmt.Println("leased", l.Lock(), "with token", l.Token())

	_, err = c.Lease(ctx, "nightly", 30*time.Second)
	var held *fence.LockedError
	if errors.As(err, &held) {
		fmt.Println("a second lease: held by lease", held.HolderSession == l.ID())
	}

	// A later run that stored the id and secret resumes the lease.
	again, err := c.ResumeLease(l.ID(), l.Secret())
	if err != nil {
		log.Fatal(err)
	}
	if err := again.Renew(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("renewed", again.Lock(), "with token", again.Token())
	if err := again.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// leased nightly with token 1
	// a second lease: held by lease true
	// renewed nightly with token 1
}

// Write two keys in one commit, fenced by a lock's token, only if the
// first still holds what was read: a config rollout.
func ExampleKV_Txn() {
	srv, stop := startExampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(client.WithEndpoints(srv.Addr()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	g, err := client.NewMutex(s, "rollout").Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	kv := c.KV()
	for range 2 {
		resp, err := kv.Txn(ctx, client.WithGrant(g), client.Strict()).
			If(client.Absent("cfg/version")).
			Then(client.OpPut("cfg/version", []byte("2")), client.OpPut("cfg/payload", []byte("blue"))).
			Else(client.OpGet("cfg/version")).
			Commit()
		if err != nil {
			log.Fatal(err)
		}
		if resp.GetSucceeded() {
			fmt.Println("rolled out at revision", resp.GetRevision())
		} else {
			fmt.Println("already at version", string(resp.GetResults()[0].GetGet().GetKv().GetValue()))
		}
	}
	// Output:
	// rolled out at revision 1
	// already at version 2
}

// startExampleServer runs the single-node server an example talks to, on
// loopback ports and a temporary directory; stop closes it and removes
// the directory.
func startExampleServer() (srv *server.Server, stop func()) {
	dir, err := os.MkdirTemp("", "fence-example")
	if err != nil {
		log.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.RaftListen = dir, "127.0.0.1:0", "127.0.0.1:0"
	if srv, err = server.Start(cfg); err != nil {
		log.Fatal(err)
	}
	return srv, func() {
		srv.Close()
		os.RemoveAll(dir)
	}
}
