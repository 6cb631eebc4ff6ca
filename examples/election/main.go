// Command election is the leader-election recipe of docs/uses/election.md:
// nodes campaign for one election, the leader does its work in steps and
// records each step in a resource with its leadership token, and observers
// print every change of leader.
//
//	election node --name A --endpoints 127.0.0.1:7420 --ttl 2s
//	election observe --endpoints 127.0.0.1:7420
//
// --endpoints defaults to $FENCE_ENDPOINTS, as fence's own does, then to
// 127.0.0.1:7420.
//
// The resource here is fence's own fenced KV store (key scheduler/last-run),
// written in strict mode: the token must be the election's current grant.
// With --unfenced the leader writes without its token, to show what breaks.
// Exit status of a node: 0 after --steps steps, 2 when its write was refused
// (it was deposed), 3 when it learned it lost leadership before writing.
package main

import (
	"cmp"
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

const election = "scheduler"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: election node|observe [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	endpoints := fs.String("endpoints", cmp.Or(os.Getenv("FENCE_ENDPOINTS"), client.DefaultEndpoint), "fence nodes (default $FENCE_ENDPOINTS, as fence's)")
	name := fs.String("name", "node", "this node's name, the leader's value")
	ttl := fs.Duration("ttl", 2*time.Second, "session TTL: how long a silent leader keeps leading")
	work := fs.Duration("work", 300*time.Millisecond, "time each step takes")
	steps := fs.Int("steps", 10, "steps to do as leader")
	unfenced := fs.Bool("unfenced", false, "write without the leadership token (what breaks)")
	fs.Parse(os.Args[2:])
	c, err := client.New(client.WithEndpoints(strings.Split(*endpoints, ",")...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "election:", err)
		os.Exit(1)
	}
	defer c.Close()
	switch os.Args[1] {
	case "node":
		err = runNode(ctx, c, *name, *ttl, *work, *steps, *unfenced)
	case "observe":
		err = observe(ctx, c)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	switch {
	case errors.Is(err, fence.ErrNotHolder), errors.Is(err, fence.ErrStaleToken):
		os.Exit(2)
	case errors.Is(err, errLostLeadership):
		os.Exit(3)
	case err != nil && ctx.Err() == nil:
		fmt.Fprintln(os.Stderr, "election:", err)
		os.Exit(1)
	}
}

var errLostLeadership = errors.New("lost leadership")

func runNode(ctx context.Context, c *client.Client, name string, ttl, work time.Duration, steps int, unfenced bool) error {
	s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(name))
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	e := client.NewElection(s, election)
	fmt.Printf("%s: campaigning\n", name)
	l, err := e.Campaign(ctx, name)
	if err != nil {
		return err
	}
	fmt.Printf("%s: leading with token %d\n", name, l.Token())
	for step := 1; step <= steps; step++ {
		// Stop as soon as the client knows leadership may be lost...
		if l.Err() != nil {
			fmt.Printf("%s: lost leadership: %v\n", name, l.Err())
			return errLostLeadership
		}
		fmt.Printf("%s: step %d working\n", name, step)
		time.Sleep(work) // ...but a leader paused here wakes up believing it leads.
		value := []byte(fmt.Sprintf("%s step %d", name, step))
		opts := []client.WriteOption{client.WithGrant(l.Grant), client.Strict()}
		if unfenced {
			opts = nil
		}
		rev, err := c.KV().Put(context.Background(), "scheduler/last-run", value, opts...)
		if err != nil {
			fmt.Printf("%s: step %d REFUSED: %v\n", name, step, err)
			return err
		}
		fmt.Printf("%s: step %d written at revision %d\n", name, step, rev)
	}
	return e.Resign(context.Background())
}

func observe(ctx context.Context, c *client.Client) error {
	changes, err := c.ObserveLeader(ctx, election)
	if err != nil {
		return err
	}
	fmt.Println("observing")
	for st := range changes {
		if st.Elected {
			fmt.Printf("leader %s token %d\n", st.Value, st.Token)
		} else {
			fmt.Println("no leader")
		}
	}
	return ctx.Err()
}
