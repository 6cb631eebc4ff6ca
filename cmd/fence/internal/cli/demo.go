package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/server"
	"github.com/spf13/cobra"
)

// stepTimeout bounds each step of the demo that waits for a worker (its
// start, a write, a release); a lock wait gets the session TTL on top.
const stepTimeout = 15 * time.Second

type demoFlags struct {
	out  string
	ttl  time.Duration
	lock string
	key  string
	use  string
}

func demoCommand(g *globals) *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show a paused lock holder overwriting newer data, then fencing tokens stopping it",
		Long: `Plays the story of a lease lock that expires while its holder is paused,
with real processes, twice:

 1. lease lock, resource does not check tokens: worker A takes the lock and
    is paused (SIGSTOP) past its session TTL; the server gives the lock to
    worker B, which writes; A resumes (SIGCONT) and writes too, overwriting
    B's newer value. The update is lost.
 2. with fencing: the same, against a storage that checks fencing tokens.
    A's late write carries its old token and is rejected (409 Conflict,
    "stale fencing token 3 < 4"); B's value survives.

Workers are separate processes (this executable, run as a hidden
"fence demo worker"). The storage is an HTTP server in this process; the
lock service is an embedded single-node server on a temporary directory,
unless --endpoints (or FENCE_ENDPOINTS) names one to use.

Prints each run's timeline and a verdict, and writes both runs as a picture
to --out: SVG if the name ends in .svg, otherwise a self-contained HTML page.
Takes a few seconds. Exits 0 when run 1 lost the update and run 2 rejected
the stale write, as they should; 1 otherwise.

With --use NAME it plays the story of a recipe of docs/uses the same way,
without its fix and with it: election (two leaders' writes), job-once (a
job run twice), inventory (an item sold twice). --use list lists them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), g, f, cmd.Flags().Changed("out"))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "fence-demo.html", "write the picture here: .svg for SVG, anything else for HTML")
	fl.DurationVar(&f.ttl, "ttl", time.Second, "the workers' session TTL; A stays paused until its lease expired")
	fl.StringVar(&f.lock, "lock", "orders", "the lock the workers take")
	fl.StringVar(&f.key, "storage-key", "orders/17", "the storage key the workers write")
	fl.StringVar(&f.use, "use", "", "play a recipe's story of docs/uses instead (fence demo --use list); the picture goes to fence-demo-NAME.html unless --out")
	cmd.AddCommand(demoWorkerCommand(g))
	return cmd
}

// demo is one `fence demo`: its lock service, its workers, and what it
// must stop on the way out.
type demo struct {
	g         *globals
	f         demoFlags
	exe       string
	endpoints string
	srv       *server.Server // nil when --endpoints names a service
	dataDir   string

	mu      sync.Mutex
	workers []*demoWorker
}

// runDemo is `fence demo`: the article's story, or with --use a recipe's.
func runDemo(ctx context.Context, g *globals, f demoFlags, outSet bool) error {
	story := articleStory(f)
	if f.use != "" {
		if f.use == "list" {
			return listUseStories(tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0))
		}
		if story = findUseStory(f.use); story == nil {
			var list strings.Builder
			_ = listUseStories(tabwriter.NewWriter(&list, 0, 0, 2, ' ', 0))
			return fmt.Errorf("no story for --use %q; these exist (%s):\n%s", f.use, useNames(), strings.TrimSuffix(list.String(), "\n"))
		}
		if !outSet {
			f.out = "fence-demo-" + story.name + ".html"
		}
	}
	return playStory(ctx, g, f, story)
}

// playStory starts the lock service, plays each run of the story with real
// processes, and concludes.
func playStory(ctx context.Context, g *globals, f demoFlags, story *demoStory) error {
	began := time.Now()
	if f.ttl <= 0 {
		return fmt.Errorf("--ttl must be positive")
	}
	if err := proc.CanPause(); err != nil {
		return fmt.Errorf("fence demo pauses a worker: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable to run the workers: %w", err)
	}
	d := &demo{g: g, f: f, exe: exe}
	defer d.close()
	if err := d.startService(ctx); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "fence-demo-"+story.name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	d.printSetup(story, tmp)

	var runs []*demoRun
	for i, spec := range story.runs {
		r := &demoRun{number: i + 1, fenced: spec.fix != "", tl: &timeline.Timeline{Title: fmt.Sprintf("Run %d: %s", i+1, spec.title)}}
		runs = append(runs, r)
		fmt.Fprintf(g.stdout, "\n%s\n", r.tl.Title)
		p := &demoPlay{demo: d, story: story, spec: spec, run: r, dir: filepath.Join(tmp, fmt.Sprintf("run%d", r.number))}
		if err := p.play(ctx); err != nil {
			if ctx.Err() != nil {
				return &ExitError{Code: exitFailure, Err: errors.New("demo interrupted; its workers and server were stopped")}
			}
			return fmt.Errorf("run %d: %w", r.number, err)
		}
		r.tl.Notes = append(r.tl.Notes, r.verdict)
		if err := d.printRun(r); err != nil {
			return err
		}
	}
	return d.conclude(story, runs, began)
}

// printRun prints a run's timeline and verdict.
func (d *demo) printRun(r *demoRun) error {
	var text bytes.Buffer
	if err := r.tl.Text(&text); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(strings.TrimSuffix(text.String(), "\n"), "\n") {
		fmt.Fprintf(d.g.stdout, "  %s", line)
	}
	fmt.Fprintf(d.g.stdout, "\n  => %s\n", r.verdict)
	return nil
}

// conclude writes the picture of the story's runs, prints the summary, and
// fails unless every run went as the story says.
func (d *demo) conclude(s *demoStory, runs []*demoRun, began time.Time) error {
	var failed []string
	var tls []*timeline.Timeline
	for _, r := range runs {
		tls = append(tls, r.tl)
		if !r.ok {
			failed = append(failed, fmt.Sprintf("run %d: %s", r.number, r.verdict))
		}
	}
	summary := s.summary
	if len(failed) > 0 {
		summary = "The demo did NOT go as expected; see the verdicts above."
	}
	page := &timeline.Page{
		Title:     s.title,
		Timelines: tls,
		Notes:     append(s.notes(d.f), summary),
	}
	if err := writeDemoPicture(d.f.out, page); err != nil {
		return err
	}
	fmt.Fprintf(d.g.stdout, "\n%s\nPicture: %s\nTook %v.\n", summary, d.f.out, time.Since(began).Round(10*time.Millisecond))
	if len(failed) > 0 {
		return &ExitError{Code: exitFailure, Err: fmt.Errorf("the demo did not go as expected: %s", strings.Join(failed, "; "))}
	}
	return nil
}

// startService starts the embedded server, or checks the one named by
// --endpoints.
func (d *demo) startService(ctx context.Context) error {
	if eps := splitEndpoints(d.g.endpoints); len(eps) > 0 {
		d.endpoints = strings.Join(eps, ",")
		c, err := d.g.client()
		if err != nil {
			return err
		}
		defer c.Close()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := c.Status(sctx); err != nil {
			return fmt.Errorf("the fence service at %s does not answer: %w", d.endpoints, err)
		}
		return nil
	}
	dir, err := os.MkdirTemp("", "fence-demo-")
	if err != nil {
		return err
	}
	d.dataDir = dir
	cfg := server.DefaultConfig()
	cfg.DataDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	srv, err := server.Start(cfg)
	if err != nil {
		return fmt.Errorf("starting the embedded server: %w", err)
	}
	d.srv = srv
	d.endpoints = srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.WaitLeader(ctx)
}

// printSetup says what the story runs, and what stands in for what.
func (d *demo) printSetup(s *demoStory, tmp string) {
	w := d.g.stdout
	fmt.Fprintln(w, s.heading)
	if d.srv != nil {
		fmt.Fprintf(w, "  lock service  embedded single node on %s (data in %s)\n", d.endpoints, d.dataDir)
	} else {
		fmt.Fprintf(w, "  lock service  %s\n", d.endpoints)
	}
	fmt.Fprintf(w, "  workers       A and B, each a process with its own session (TTL %v) on %s\n", d.f.ttl, s.on)
	for _, line := range s.setup {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(line, "$TMP", tmp))
	}
}

// close stops the workers (resuming any that are paused), then the
// embedded server, and removes its data.
func (d *demo) close() {
	d.mu.Lock()
	workers := d.workers
	d.workers = nil
	d.mu.Unlock()
	for _, w := range workers {
		w.kill()
	}
	if d.srv != nil {
		if err := d.srv.Close(); err != nil {
			fmt.Fprintf(d.g.stderr, "fence demo: stopping the embedded server: %v\n", err)
		}
	}
	if d.dataDir != "" {
		_ = os.RemoveAll(d.dataDir)
	}
}

// writeDemoPicture writes page to path: SVG for a .svg name, HTML otherwise.
func writeDemoPicture(path string, page *timeline.Page) error {
	var buf bytes.Buffer
	var err error
	if strings.EqualFold(filepath.Ext(path), ".svg") {
		err = page.SVG(&buf)
	} else {
		err = page.HTML(&buf)
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing the picture: %w", err)
	}
	return nil
}
