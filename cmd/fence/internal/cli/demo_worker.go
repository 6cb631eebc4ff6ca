package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/cmd/fence/internal/storage"
	"github.com/fencelock/fence/fencing"
)

// demoEvent is one line a demo worker reports on its stdout, as JSON.
type demoEvent struct {
	// Event is "waiting" (session created, about to ask for the lock),
	// "acquired", "wrote", "rejected" (stale token), "write-failed",
	// "released" or "error".
	Event   string `json:"event"`
	Session uint64 `json:"session,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Highest uint64 `json:"highest,omitempty"`
	Key     string `json:"key,omitempty"`
	Status  int    `json:"status,omitempty"`
	Message string `json:"message,omitempty"`

	at time.Time // when the demo read it
}

type demoWorkerFlags struct {
	name    string
	storage string
	lock    string
	key     string
	ttl     time.Duration
	value   string
	fenced  bool
}

// demoWorkerCommand is `fence demo worker`, the client processes of `fence
// demo`. It is hidden: its protocol is the demo's, not a user's.
func demoWorkerCommand(g *globals) *cobra.Command {
	var f demoWorkerFlags
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "A worker process of fence demo",
		Hidden: true,
		Long: `Takes the lock in a new session and reports, as JSON lines on stdout,
"waiting" and then "acquired" with its token. Then it obeys lines on stdin:
"write" PUTs --value to --storage/--key (with the grant's token when
--fenced) and reports "wrote", "rejected" or "write-failed"; "release"
releases the lock and reports "released"; "exit" or the end of stdin closes
the session and exits.

Like any process that checked its lock and was then paused, it writes
without looking at the lock again: the storage must catch a stale write.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemoWorker(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "worker", "the worker's name")
	fl.StringVar(&f.storage, "storage", "", "the storage's base URL")
	fl.StringVar(&f.lock, "lock", "orders", "the lock to take")
	fl.StringVar(&f.key, "storage-key", "orders/17", "the storage key to write")
	fl.DurationVar(&f.ttl, "ttl", time.Second, "session TTL")
	fl.StringVar(&f.value, "value", "", "the value to write (default: the name)")
	fl.BoolVar(&f.fenced, "fenced", false, "send the grant's fencing token with the write")
	return cmd
}

func runDemoWorker(ctx context.Context, g *globals, f demoWorkerFlags) error {
	if f.storage == "" {
		return errors.New("--storage is required")
	}
	if f.value == "" {
		f.value = f.name
	}
	out := json.NewEncoder(g.stdout)
	report := func(ev demoEvent) {
		_ = out.Encode(ev) // one write per line; a closed stdout ends the worker at the next read
	}
	fail := func(err error) error {
		report(demoEvent{Event: "error", Message: err.Error()})
		return err
	}

	c, err := g.client()
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(f.ttl), client.WithOwner(fmt.Sprintf("fence demo worker %s pid %d", f.name, os.Getpid())))
	if err != nil {
		return fail(fmt.Errorf("creating a session: %w", err))
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(closeCtx) // fails with NotFound when the session expired during a pause
	}()
	report(demoEvent{Event: "waiting", Session: s.ID()})
	m := client.NewMutex(s, f.lock)
	grant, err := m.Lock(ctx)
	if err != nil {
		return fail(fmt.Errorf("acquiring lock %q: %w", f.lock, err))
	}
	report(demoEvent{Event: "acquired", Session: s.ID(), Token: grant.Token()})

	lines := bufio.NewScanner(g.stdin)
	for lines.Scan() {
		switch cmd := strings.TrimSpace(lines.Text()); cmd {
		case "write":
			report(demoPut(ctx, f, grant.Token()))
		case "release":
			err := m.Unlock(ctx)
			switch {
			case err != nil && s.Err() != nil:
				// The session ended (this process was starved past its
				// TTL): the server released the lock with it.
				report(demoEvent{Event: "released", Message: fmt.Sprintf("session ended before the release: %v", s.Err())})
			case err != nil:
				return fail(fmt.Errorf("releasing lock %q: %w", f.lock, err))
			default:
				report(demoEvent{Event: "released"})
			}
		case "exit":
			return nil
		default:
			return fail(fmt.Errorf("unknown command %q", cmd))
		}
	}
	return lines.Err()
}

// demoPut writes the worker's value to the storage, with its token when
// fenced, and says how the storage answered. It deliberately does not use
// the grant's context, which ended if the lock was lost during a pause: the
// write goes out all the same, as it would from a process that checked its
// lock before it was paused.
func demoPut(ctx context.Context, f demoWorkerFlags, token uint64) demoEvent {
	ctx = context.WithoutCancel(ctx)
	if f.fenced {
		ctx = fencing.WithToken(ctx, f.lock, token)
	}
	status, err := storage.Put(ctx, strings.TrimRight(f.storage, "/")+"/"+f.key, f.value)
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		return demoEvent{Event: "rejected", Status: status, Token: stale.Token, Highest: stale.Highest, Key: stale.Key, Message: stale.Error()}
	case err != nil:
		return demoEvent{Event: "write-failed", Status: status, Message: err.Error()}
	}
	return demoEvent{Event: "wrote", Status: status}
}
