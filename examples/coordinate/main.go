// Command coordinate is the coordinating-services recipe of
// docs/uses/coordinate.md: a rollout in ordered steps across services
// (migrate the schema, then deploy readers, then writers), driven under one
// lock whose token each service records with the version it was given,
// and services that wait at a barrier until the rollout is done.
//
//	coordinate rollout --endpoints HOST:PORT --name A --version v2
//	coordinate service --endpoints HOST:PORT --name readers
//
// The services' configuration lives in fence's fenced KV store (key
// services/NAME); a real service would keep it itself and check the token
// the same way (fencing.Middleware, pgfence). Exit status of rollout: 0
// done, 2 a step was refused as stale, 1 other errors.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
)

// steps are the rollout's steps, in the order they must happen.
var steps = []string{"schema", "readers", "writers"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: coordinate rollout|service [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	endpoints := fs.String("endpoints", "127.0.0.1:7420", "fence nodes")
	name := fs.String("name", "A", "the coordinator's or the service's name")
	version := fs.String("version", "v2", "rollout: the version to roll out")
	ttl := fs.Duration("ttl", time.Second, "rollout: session TTL")
	stepTime := fs.Duration("step-time", 300*time.Millisecond, "rollout: how long each step takes")
	fs.Parse(os.Args[2:])
	c, err := client.New(client.WithEndpoints(strings.Split(*endpoints, ",")...))
	if err == nil {
		defer c.Close()
		switch os.Args[1] {
		case "rollout":
			err = rollout(ctx, c, *name, *version, *ttl, *stepTime)
		case "service":
			err = service(ctx, c, *name)
		default:
			err = fmt.Errorf("unknown mode %q", os.Args[1])
		}
	}
	if errors.Is(err, fence.ErrStaleToken) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordinate:", err)
		os.Exit(1)
	}
}

func rollout(ctx context.Context, c *client.Client, name, version string, ttl, stepTime time.Duration) error {
	s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(name))
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	m := client.NewMutex(s, "rollout")
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%s: rolling out %s with token %d\n", name, version, g.Token())
	gate := client.NewBarrier(c, "rollout")
	if err := gate.Hold(ctx); err != nil {
		return err
	}
	for _, step := range steps {
		fmt.Printf("%s: step %s\n", name, step)
		time.Sleep(stepTime) // a coordinator paused here wakes up believing it holds the lock
		// Each service keeps the highest token it was given and refuses a lower one.
		_, err := c.KV().Put(context.Background(), "services/"+step, []byte(version), client.WithGrant(g))
		if err != nil {
			fmt.Printf("%s: step %s REFUSED: %v\n", name, step, err)
			return err
		}
	}
	if err := gate.Release(ctx); err != nil {
		return err
	}
	fmt.Printf("%s: done\n", name)
	return m.Unlock(context.Background())
}

// service waits until no rollout is under way, then reports its version.
func service(ctx context.Context, c *client.Client, name string) error {
	fmt.Printf("%s: waiting for the rollout\n", name)
	if err := client.NewBarrier(c, "rollout").Wait(ctx); err != nil {
		return err
	}
	kv, err := c.KV().Get(ctx, "services/"+name)
	if err != nil || kv == nil {
		return fmt.Errorf("no configuration for %s (%v)", name, err)
	}
	fmt.Printf("%s: running %s (token %d)\n", name, kv.GetValue(), kv.GetToken())
	return nil
}
