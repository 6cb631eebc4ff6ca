// Command allocation is the resource-allocation recipe of
// docs/uses/allocation.md: workers share a pool of devices, each used by
// one worker at a time. A worker takes the first free device's lock with
// TryLock, in turn, waits and tries again when all are taken, and sends
// the lock's token with every write to the device.
//
//	allocation use --endpoints HOST:PORT --name A --devices dev0,dev1
//
// The devices' state lives in fence's fenced KV store (key devices/NAME),
// which refuses a token lower than the highest it has seen; a real device
// server checks the token the same way (fencing.Middleware). Exit status:
// 0 done, 2 a write was refused as stale, 1 other errors.
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("use", flag.ExitOnError)
	endpoints := fs.String("endpoints", "127.0.0.1:7420", "fence nodes")
	name := fs.String("name", "A", "this worker's name")
	devices := fs.String("devices", "dev0,dev1", "the pool, in the order to try it")
	ttl := fs.Duration("ttl", time.Second, "session TTL")
	work := fs.Duration("work", 300*time.Millisecond, "how long the worker uses the device")
	if len(os.Args) < 2 || os.Args[1] != "use" {
		fmt.Fprintln(os.Stderr, "usage: allocation use [flags]")
		os.Exit(1)
	}
	fs.Parse(os.Args[2:])
	c, err := client.New(client.WithEndpoints(strings.Split(*endpoints, ",")...))
	if err == nil {
		defer c.Close()
		err = use(ctx, c, *name, strings.Split(*devices, ","), *ttl, *work)
	}
	if errors.Is(err, fence.ErrStaleToken) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "allocation:", err)
		os.Exit(1)
	}
}

func use(ctx context.Context, c *client.Client, name string, devices []string, ttl, work time.Duration) error {
	s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(name))
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	device, m, g, err := allocate(ctx, s, devices)
	if err != nil {
		return err
	}
	fmt.Printf("%s: using %s with token %d\n", name, device, g.Token())
	time.Sleep(work) // a worker paused here wakes up believing the device is still its own
	_, err = c.KV().Put(context.Background(), "devices/"+device, []byte(name), client.WithGrant(g))
	if err != nil {
		fmt.Printf("%s: write to %s REFUSED: %v\n", name, device, err)
		return err
	}
	fmt.Printf("%s: wrote to %s\n", name, device)
	return m.Unlock(context.Background())
}

// allocate takes the first free device of the pool, trying each in turn,
// and tries the pool again after a short wait while all are taken.
func allocate(ctx context.Context, s *client.Session, devices []string) (string, *client.Mutex, *client.Grant, error) {
	for {
		for _, d := range devices {
			m := client.NewMutex(s, "device/"+d)
			g, err := m.TryLock(ctx)
			if err == nil {
				return d, m, g, nil
			}
			if !errors.Is(err, fence.ErrLocked) {
				return "", nil, nil, err
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return "", nil, nil, ctx.Err()
		}
	}
}
