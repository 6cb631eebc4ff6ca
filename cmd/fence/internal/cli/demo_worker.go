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

// demoEvent is one line a demo worker reports on its stdout, as JSON.
type demoEvent struct {
	// Event is "waiting" (session created, about to ask for the lock),
	// "acquired", "wrote", "rejected" (refused by the fix: a stale token,
	// a job already run, nothing left), "write-failed", "released" or
	// "error".
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
	use     string
	name    string
	lock    string
	ttl     time.Duration
	dir     string
	fix     string
	storage string // the article's storage
	key     string // and the key the workers write there
}

// demoWorkerCommand is `fence demo worker`, the client processes of `fence
// demo`. It is hidden: its protocol is the demo's, not a user's.
func demoWorkerCommand(g *globals) *cobra.Command {
	var f demoWorkerFlags
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "A worker process of fence demo",
		Hidden: true,
		Long: `Takes --lock in a new session (campaigns, for --use election) and reports,
as JSON lines on stdout, "waiting" and then "acquired" with its token. Then
it obeys lines on stdin: "act" does the story's step (the article's write
to --storage, the leader's write, the job, the sale) with --fix or without,
and reports "wrote", "rejected" or "write-failed"; "release" releases the
lock (resigns) and reports "released"; "exit" or the end of stdin closes
the session and exits.

Like any process that checked its lock and was then paused, it does its
step without looking at the lock again: only the fix can catch a stale
step.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemoWorker(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.use, "use", articleName, "the story: "+articleName+", "+useNames())
	fl.StringVar(&f.name, "name", "worker", "the worker's name")
	fl.StringVar(&f.lock, "lock", "", "the lock (or election) to take")
	fl.DurationVar(&f.ttl, "ttl", time.Second, "session TTL")
	fl.StringVar(&f.dir, "dir", "", "the run's directory, holding its database")
	fl.StringVar(&f.fix, "fix", "", "the fix to apply, empty for none: "+strings.Join(useFixes(), ", "))
	fl.StringVar(&f.storage, "storage", "", "the article's storage: its base URL")
	fl.StringVar(&f.key, "storage-key", "", "the article's storage key to write")
	return cmd
}

// demoActor is one `fence demo worker` process's state.
type demoActor struct {
	f       demoWorkerFlags
	c       *client.Client
	s       *client.Session
	grant   *client.Grant
	release func(context.Context) error
	db      *sql.DB // the run's SQLite database, for the stories that use one
	seen    int64   // what the worker read under the lock, for inventory
}

// actorScript is what a worker of one story does.
type actorScript struct {
	// acquire takes the lock; nil for a Mutex on --lock.
	acquire func(ctx context.Context, a *demoActor) error
	// afterGrant runs under the lock before the worker reports "acquired",
	// and returns a note for the report (what it read), if any.
	afterGrant func(ctx context.Context, a *demoActor) (string, error)
	// act does the step and says how the resource answered.
	act func(ctx context.Context, a *demoActor) demoEvent
}

// actorScripts are the workers' scripts by story.
var actorScripts = map[string]actorScript{
	articleName: articleActor,
	"election":  electionActor,
	"job-once":  jobOnceActor,
	"inventory": inventoryActor,
}

func runDemoWorker(ctx context.Context, g *globals, f demoWorkerFlags) error {
	script, ok := actorScripts[f.use]
	if !ok {
		return fmt.Errorf("no story %q; these exist: %s, %s", f.use, articleName, useNames())
	}
	out := json.NewEncoder(g.stdout)
	report := func(ev demoEvent) {
		_ = out.Encode(ev) // one write per line; a closed stdout ends the worker at the next read
	}
	fail := func(err error) error {
		report(demoEvent{Event: "error", Message: err.Error()})
		return err
	}
	a := &demoActor{f: f}
	if f.dir != "" {
		db, err := openUseDB(f.dir)
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
	a.s, err = c.NewSession(ctx, client.WithTTL(f.ttl), client.WithOwner(fmt.Sprintf("fence demo worker %s of story %s pid %d", f.name, f.use, os.Getpid())))
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
			// Not the grant's context, which ended if the lock was lost
			// during a pause: the step goes ahead all the same, as it would
			// from a process that checked its lock before it was paused.
			report(script.act(context.WithoutCancel(ctx), a))
		case "release":
			err := a.release(ctx)
			switch {
			case err != nil && a.s.Err() != nil:
				// The session ended (this process was starved past its
				// TTL): the server released the lock with it.
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
func lockMutex(ctx context.Context, a *demoActor) error {
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

// openUseDB opens the run's SQLite database in dir.
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
