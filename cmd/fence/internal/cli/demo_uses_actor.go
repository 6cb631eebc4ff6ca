package cli

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing/sqlitefence"
)

type demoActorFlags struct {
	use  string
	name string
	lock string
	ttl  time.Duration
	dir  string
	fix  string
}

// demoActorCommand is `fence demo actor`, the worker processes of `fence
// demo --use`. It is hidden: its protocol is the demo's, not a user's.
func demoActorCommand(g *globals) *cobra.Command {
	var f demoActorFlags
	cmd := &cobra.Command{
		Use:    "actor",
		Short:  "A worker process of fence demo --use",
		Hidden: true,
		Long: `Takes --lock in a new session (campaigns, for --use election) and reports,
as JSON lines on stdout, "waiting" and then "acquired" with its token. Then
it obeys lines on stdin: "act" does the recipe's step (the leader's write,
the job, the sale) with --fix or without, and reports "wrote", "rejected"
or "write-failed"; "release" releases the lock (resigns) and reports
"released"; "exit" or the end of stdin closes the session and exits.

Like a worker of fence demo, it does its step without looking at the lock
again: only the fix can catch a stale step.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemoActor(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.use, "use", "", "the story: "+useNames())
	fl.StringVar(&f.name, "name", "worker", "the worker's name")
	fl.StringVar(&f.lock, "lock", "", "the lock (or election) to take")
	fl.DurationVar(&f.ttl, "ttl", time.Second, "session TTL")
	fl.StringVar(&f.dir, "dir", "", "the run's directory, holding its database")
	fl.StringVar(&f.fix, "fix", "", "the fix to apply, empty for none: "+strings.Join(useFixes(), ", "))
	return cmd
}

// useActor is one `fence demo actor` process's state.
type useActor struct {
	f       demoActorFlags
	c       *client.Client
	s       *client.Session
	grant   *client.Grant
	release func(context.Context) error
	db      *sql.DB // the run's SQLite database, for the stories that use one
	seen    int64   // what the actor read under the lock, for inventory
}

// useActorScript is what an actor of one story does.
type useActorScript struct {
	// acquire takes the lock; nil for a Mutex on --lock.
	acquire func(ctx context.Context, a *useActor) error
	// afterGrant runs under the lock before the actor reports "acquired",
	// and returns a note for the report (what it read), if any.
	afterGrant func(ctx context.Context, a *useActor) (string, error)
	// act does the step and says how the resource answered.
	act func(ctx context.Context, a *useActor) demoEvent
}

// useActorScripts are the actors' scripts by story.
var useActorScripts = map[string]useActorScript{
	"election":  electionActor,
	"job-once":  jobOnceActor,
	"inventory": inventoryActor,
}

func runDemoActor(ctx context.Context, g *globals, f demoActorFlags) error {
	script, ok := useActorScripts[f.use]
	if !ok {
		return fmt.Errorf("no story %q; these exist: %s", f.use, useNames())
	}
	out := json.NewEncoder(g.stdout)
	report := func(ev demoEvent) {
		_ = out.Encode(ev) // one write per line; a closed stdout ends the actor at the next read
	}
	fail := func(err error) error {
		report(demoEvent{Event: "error", Message: err.Error()})
		return err
	}
	a := &useActor{f: f}
	if f.dir != "" {
		db, err := sql.Open(sqlitefence.DriverName, sqlitefence.DSN(filepath.Join(f.dir, useDBName)))
		if err != nil {
			return fail(err)
		}
		defer db.Close()
		a.db = db
	}
	c, err := g.client()
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	a.c = c
	a.s, err = c.NewSession(ctx, client.WithTTL(f.ttl), client.WithOwner(fmt.Sprintf("fence demo --use %s worker %s pid %d", f.use, f.name, os.Getpid())))
	if err != nil {
		return fail(fmt.Errorf("creating a session: %w", err))
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.s.Close(closeCtx) // fails with NotFound when the session expired during a pause
	}()
	report(demoEvent{Event: "waiting", Session: a.s.ID()})
	if script.acquire == nil {
		script.acquire = lockMutex
	}
	if err := script.acquire(ctx, a); err != nil {
		return fail(fmt.Errorf("acquiring %q: %w", f.lock, err))
	}
	var note string
	if script.afterGrant != nil {
		if note, err = script.afterGrant(ctx, a); err != nil {
			return fail(err)
		}
	}
	report(demoEvent{Event: "acquired", Session: a.s.ID(), Token: a.grant.Token(), Message: note})

	lines := bufio.NewScanner(g.stdin)
	for lines.Scan() {
		switch cmd := strings.TrimSpace(lines.Text()); cmd {
		case "act":
			// As demoPut: not the grant's context, which ended if the lock
			// was lost during a pause; the step goes ahead all the same.
			report(script.act(context.WithoutCancel(ctx), a))
		case "release":
			err := a.release(ctx)
			switch {
			case err != nil && a.s.Err() != nil:
				report(demoEvent{Event: "released", Message: fmt.Sprintf("session ended before the release: %v", a.s.Err())})
			case err != nil:
				return fail(fmt.Errorf("releasing %q: %w", f.lock, err))
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

// lockMutex takes --lock as a Mutex.
func lockMutex(ctx context.Context, a *useActor) error {
	m := client.NewMutex(a.s, a.f.lock)
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	a.grant, a.release = g, m.Unlock
	return nil
}

// useDBName is the SQLite file in a run's directory.
const useDBName = "resource.db"

// openUseDB opens the run's SQLite database in dir, for the demo itself.
func openUseDB(dir string) (*sql.DB, error) {
	return sql.Open(sqlitefence.DriverName, sqlitefence.DSN(filepath.Join(dir, useDBName)))
}

// stepFailed reports a step that failed for another reason than the fix.
func stepFailed(err error) demoEvent {
	return demoEvent{Event: "write-failed", Message: "failed: " + err.Error()}
}

// execAll runs statements in order on db.
func execAll(ctx context.Context, db *sql.DB, stmts ...string) error {
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}
