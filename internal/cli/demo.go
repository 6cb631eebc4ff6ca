package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/internal/storage"
	"github.com/fencelock/fence/internal/timeline"
	"github.com/fencelock/fence/server"
)

// stepTimeout bounds each step of the demo that waits for a worker (its
// start, a write, a release); a lock wait gets the session TTL on top.
const stepTimeout = 15 * time.Second

type demoFlags struct {
	out  string
	ttl  time.Duration
	lock string
	key  string
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
the stale write, as they should; 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "fence-demo.html", "write the picture here: .svg for SVG, anything else for HTML")
	fl.DurationVar(&f.ttl, "ttl", time.Second, "the workers' session TTL; A stays paused until its lease expired")
	fl.StringVar(&f.lock, "lock", "orders", "the lock the workers take")
	fl.StringVar(&f.key, "key", "orders/17", "the storage key the workers write")
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

// demoRun is one play of the story and what came of it.
type demoRun struct {
	number int
	fenced bool
	tl     *timeline.Timeline

	tokenA, tokenB uint64
	writeA, writeB demoEvent
	final          string
	present        bool

	ok      bool   // the run ended as it should
	verdict string // one line
}

func runDemo(ctx context.Context, g *globals, f demoFlags) error {
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
	d.printSetup()

	runs := []*demoRun{
		{number: 1, fenced: false, tl: &timeline.Timeline{Title: "Run 1: lease lock, resource does not check tokens"}},
		{number: 2, fenced: true, tl: &timeline.Timeline{Title: "Run 2: with fencing, the resource rejects stale tokens"}},
	}
	for _, r := range runs {
		fmt.Fprintf(g.stdout, "\n%s\n", r.tl.Title)
		if err := d.play(ctx, r); err != nil {
			if ctx.Err() != nil {
				return &ExitError{Code: exitFailure, Err: errors.New("demo interrupted; its workers and server were stopped")}
			}
			return fmt.Errorf("run %d: %w", r.number, err)
		}
		r.judge(f)
		r.tl.Notes = append(r.tl.Notes, r.verdict)
		if err := d.printRun(r); err != nil {
			return err
		}
	}
	return d.conclude(runs, began)
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

// conclude writes the picture of both runs, prints the summary, and fails
// unless both runs went as the story says.
func (d *demo) conclude(runs []*demoRun, began time.Time) error {
	var failed []string
	for _, r := range runs {
		if !r.ok {
			failed = append(failed, fmt.Sprintf("run %d: %s", r.number, r.verdict))
		}
	}
	summary := "Both runs went as expected: without fencing the paused holder's late write destroyed a newer one; with fencing the storage rejected it."
	if len(failed) > 0 {
		summary = "The demo did NOT go as expected; see the verdicts above."
	}
	page := &timeline.Page{
		Title:     "fence demo: a lock holder paused past its lease, without and with fencing tokens",
		Timelines: []*timeline.Timeline{runs[0].tl, runs[1].tl},
		Notes: []string{
			fmt.Sprintf("Workers A and B are separate processes, each with its own session (TTL %v) on lock %q; they write key %q of an HTTP storage. "+
				"A is paused with SIGSTOP right after it gets the lock and resumed with SIGCONT once B has written and released.", d.f.ttl, d.f.lock, d.f.key),
			summary,
		},
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
	cfg.Version = Version
	srv, err := server.Start(cfg)
	if err != nil {
		return fmt.Errorf("starting the embedded server: %w", err)
	}
	d.srv = srv
	d.endpoints = srv.Addr()
	return srv.WaitLeader(10 * time.Second)
}

func (d *demo) printSetup() {
	w := d.g.stdout
	fmt.Fprintln(w, "fence demo: a lock holder paused past its lease, played twice with real processes")
	if d.srv != nil {
		fmt.Fprintf(w, "  lock service  embedded single node on %s (data in %s)\n", d.endpoints, d.dataDir)
	} else {
		fmt.Fprintf(w, "  lock service  %s\n", d.endpoints)
	}
	fmt.Fprintf(w, "  workers       A and B, each a process with its own session (TTL %v) on lock %q\n", d.f.ttl, d.f.lock)
	fmt.Fprintf(w, "  storage       an HTTP server in this process holding key %q\n", d.f.key)
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

// play runs the story once: A takes the lock and is paused; B waits for the
// lock, gets it once A's lease expired, writes and releases; A resumes and
// writes with what it still believes is its lock.
func (d *demo) play(ctx context.Context, r *demoRun) error {
	store := storage.New()
	srv, err := storage.Serve(storageHandler(store, r.fenced))
	if err != nil {
		return err
	}
	defer srv.Close()
	p := &demoPlay{demo: d, run: r, store: store, storageURL: srv.URL}
	r.tl.Lanes = []string{"A", "B", "storage"}
	for _, step := range []func(context.Context) error{p.holderPauses, p.otherTakesOver, p.holderWakes} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	p.inspect()
	return p.stopWorkers(ctx)
}

// demoPlay is one play of the story in progress.
type demoPlay struct {
	demo       *demo
	run        *demoRun
	store      *storage.Store
	storageURL string
	a, b       *demoWorker

	grantedA, pausedA time.Time
}

// holderPauses: A takes the lock, and is paused at once, as by a GC pause
// or a VM migration.
func (p *demoPlay) holderPauses(ctx context.Context) error {
	r := p.run
	a, err := p.demo.startWorker("A", p.storageURL, r.fenced)
	if err != nil {
		return err
	}
	p.a = a
	if _, err := a.expect(ctx, stepTimeout, "waiting"); err != nil {
		return err
	}
	granted, err := a.expect(ctx, stepTimeout, "acquired")
	if err != nil {
		return err
	}
	r.tokenA, p.grantedA = granted.Token, granted.at
	r.mark("A", p.grantedA, timeline.MarkGrant, fmt.Sprintf("got lock %s, token %d", p.demo.f.lock, r.tokenA))
	if err := a.p.Pause(); err != nil {
		return err
	}
	p.pausedA = time.Now()
	return nil
}

// otherTakesOver: B asks for the lock, which the server grants once A's
// session expired; B writes and releases.
func (p *demoPlay) otherTakesOver(ctx context.Context) error {
	r, lock := p.run, p.demo.f.lock
	b, err := p.demo.startWorker("B", p.storageURL, r.fenced)
	if err != nil {
		return err
	}
	p.b = b
	waiting, err := b.expect(ctx, stepTimeout, "waiting")
	if err != nil {
		return err
	}
	granted, err := b.expect(ctx, p.demo.f.ttl+stepTimeout, "acquired")
	if err != nil {
		return fmt.Errorf("%w (is lock %q held by someone else? see fence locks)", err, lock)
	}
	r.tokenB = granted.Token
	r.span("A", p.grantedA, granted.at, timeline.SpanLease, "")
	r.span("B", waiting.at, granted.at, timeline.SpanWaiting, "waiting for the lock")
	r.mark("B", granted.at, timeline.MarkGrant, fmt.Sprintf("got lock %s, token %d", lock, r.tokenB))
	r.mark("A", granted.at, timeline.MarkInfo, "lease expired; the lock went to B")

	if r.writeB, err = b.write(ctx); err != nil {
		return err
	}
	r.mark("B", r.writeB.at, writeKind(r.writeB), writeLabel(r.writeB, "B", r.tokenB, r.fenced))
	released, err := b.command(ctx, "release", "released")
	if err != nil {
		return err
	}
	r.span("B", granted.at, released.at, timeline.SpanLease, "")
	r.mark("B", released.at, timeline.MarkInfo, "released the lock")
	return nil
}

// holderWakes: A resumes, still believing it holds the lock, and writes.
func (p *demoPlay) holderWakes(ctx context.Context) error {
	r := p.run
	if err := p.a.p.Resume(); err != nil {
		return err
	}
	resumed := time.Now()
	r.span("A", p.pausedA, resumed, timeline.SpanPaused, "paused by SIGSTOP")
	r.mark("A", resumed, timeline.MarkInfo, "resumed by SIGCONT")
	var err error
	if r.writeA, err = p.a.write(ctx); err != nil {
		return err
	}
	r.mark("A", r.writeA.at, writeKind(r.writeA), writeLabel(r.writeA, "A", r.tokenA, r.fenced))
	return nil
}

// inspect reads what the storage holds in the end.
func (p *demoPlay) inspect() {
	r := p.run
	r.final, r.present = p.store.Value(p.demo.f.key)
	now := time.Now()
	switch {
	case r.present && r.final == "A" && r.writeB.Event == "wrote":
		r.mark("storage", now, timeline.MarkLostUpdate, `lost update: value is "A", B's write is gone`)
	case r.present && r.final == "B":
		r.mark("storage", now, timeline.MarkInfo, `value is "B": B's write survived`)
	case r.present:
		r.mark("storage", now, timeline.MarkInfo, fmt.Sprintf("value is %q", r.final))
	default:
		r.mark("storage", now, timeline.MarkInfo, "no value")
	}
}

// stopWorkers tells both workers to exit, both at once (a race-enabled
// build waits a second at exit), and waits for them.
func (p *demoPlay) stopWorkers(ctx context.Context) error {
	workers := []*demoWorker{p.a, p.b}
	for _, w := range workers {
		if err := w.p.WriteLine("exit"); err != nil {
			return fmt.Errorf("telling worker %s to exit: %w", w.name, err)
		}
	}
	for _, w := range workers {
		if err := w.waitExit(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (r *demoRun) mark(lane string, at time.Time, kind, label string) {
	r.tl.Marks = append(r.tl.Marks, timeline.Mark{Lane: lane, At: at, Kind: kind, Label: label})
}

func (r *demoRun) span(lane string, from, to time.Time, kind, label string) {
	r.tl.Spans = append(r.tl.Spans, timeline.Span{Lane: lane, Start: from, End: to, Kind: kind, Label: label})
}

func writeKind(ev demoEvent) string {
	switch ev.Event {
	case "wrote":
		return timeline.MarkWriteOK
	case "rejected":
		return timeline.MarkWriteRejected
	}
	return timeline.MarkFault
}

func writeLabel(ev demoEvent, value string, token uint64, fenced bool) string {
	switch {
	case ev.Event == "wrote" && fenced:
		return fmt.Sprintf("wrote %q with token %d: accepted", value, token)
	case ev.Event == "wrote":
		return fmt.Sprintf("wrote %q, no token: accepted", value)
	case ev.Event == "rejected":
		return "write rejected: " + strings.TrimSuffix(ev.Message, " for key "+ev.Key)
	}
	return "write failed: " + ev.Message
}

// judge decides whether the run ended as the story says it must.
func (r *demoRun) judge(f demoFlags) {
	story := fmt.Sprintf("A (token %d) was paused past its lease; B got lock %s (token %d) and wrote \"B\"; A woke and wrote \"A\"", r.tokenA, f.lock, r.tokenB)
	final := "no value"
	if r.present {
		final = strconv.Quote(r.final)
	}
	switch {
	case r.tokenB <= r.tokenA:
		r.verdict = fmt.Sprintf("UNEXPECTED: B's token %d is not above A's %d", r.tokenB, r.tokenA)
	case r.writeB.Event != "wrote":
		r.verdict = fmt.Sprintf("UNEXPECTED: B's write, under the lock, failed: %s", r.writeB.Message)
	case !r.fenced && r.writeA.Event == "wrote" && r.present && r.final == "A":
		r.ok = true
		r.verdict = fmt.Sprintf("LOST UPDATE: %s, and the storage took it. It holds \"A\" now: B's update is lost, and the lock could not prevent it.", story)
	case !r.fenced:
		r.verdict = fmt.Sprintf("UNEXPECTED: the storage does not check tokens, so A's late write should have overwritten B's; A's write: %s; the value is %s", describe(r.writeA), final)
	case r.writeA.Event == "rejected" && r.writeA.Token == r.tokenA && r.writeA.Highest == r.tokenB && r.present && r.final == "B":
		r.ok = true
		r.verdict = fmt.Sprintf("SAFE: %s, but the storage rejected it with 409: stale fencing token %d < %d. It still holds \"B\".", story, r.tokenA, r.tokenB)
	default:
		r.verdict = fmt.Sprintf("UNEXPECTED: the storage checks tokens, so A's late write with token %d should have been rejected because B wrote with %d; A's write: %s; the value is %s", r.tokenA, r.tokenB, describe(r.writeA), final)
	}
}

func describe(ev demoEvent) string {
	if ev.Message != "" {
		return ev.Event + " (" + ev.Message + ")"
	}
	return ev.Event
}

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

// storageHandler serves st as is, or guarded by the fenced write rule: a
// write must carry a token at least as high as any accepted before.
func storageHandler(st *storage.Store, fenced bool) http.Handler {
	if !fenced {
		return st
	}
	return fencing.Middleware(fencing.NewGuard(fencing.NewMemory()))(st)
}

// demoWorker is a running `fence demo worker` process.
type demoWorker struct {
	name string // A or B
	p    *proc.Process
}

// startWorker starts a worker process and registers it for cleanup. It
// runs in its own process group, so that a Ctrl-C at the terminal reaches
// only the demo, which then stops its workers in order; and dies with the
// demo where the system can.
func (d *demo) startWorker(name, storageURL string, fenced bool) (*demoWorker, error) {
	p, err := proc.Start(proc.Spec{
		Name: "worker " + name,
		Path: d.exe,
		Args: []string{"demo", "worker",
			"--endpoints", d.endpoints,
			"--name", name,
			"--storage", storageURL,
			"--lock", d.f.lock,
			"--key", d.f.key,
			"--ttl", d.f.ttl.String(),
			"--value", name,
			"--fenced=" + strconv.FormatBool(fenced),
		},
		Stdin:         true,
		Lines:         true,
		Stderr:        proc.NewPrefixWriter(d.g.stderr, "fence demo: worker "+name+": "),
		StderrBytes:   8 << 10,
		DieWithParent: true,
	})
	if err != nil {
		return nil, err
	}
	w := &demoWorker{name: name, p: p}
	d.mu.Lock()
	d.workers = append(d.workers, w)
	d.mu.Unlock()
	return w, nil
}

// parseEvent reads a worker's report line.
func parseEvent(l proc.Line) demoEvent {
	ev := demoEvent{at: l.At}
	if err := json.Unmarshal([]byte(l.Text), &ev); err != nil {
		return demoEvent{Event: "error", Message: fmt.Sprintf("unreadable report %q", l.Text), at: l.At}
	}
	return ev
}

// expect waits for the worker's next event, which must be one of want.
func (w *demoWorker) expect(ctx context.Context, timeout time.Duration, want ...string) (demoEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-w.p.Lines():
		if !ok {
			return demoEvent{}, fmt.Errorf("worker %s exited (%v) before reporting %s%s", w.name, w.p.State(), strings.Join(want, " or "), w.stderrTail())
		}
		ev := parseEvent(l)
		if slices.Contains(want, ev.Event) {
			return ev, nil
		}
		return ev, fmt.Errorf("worker %s reported %s, want %s%s", w.name, describe(ev), strings.Join(want, " or "), w.stderrTail())
	case <-t.C:
		return demoEvent{}, fmt.Errorf("worker %s did not report %s within %v%s", w.name, strings.Join(want, " or "), timeout, w.stderrTail())
	case <-ctx.Done():
		return demoEvent{}, ctx.Err()
	}
}

// command sends a command line to the worker and waits for its answer.
func (w *demoWorker) command(ctx context.Context, command string, want ...string) (demoEvent, error) {
	if err := w.p.WriteLine(command); err != nil {
		return demoEvent{}, fmt.Errorf("telling worker %s to %s: %w%s", w.name, command, err, w.stderrTail())
	}
	return w.expect(ctx, stepTimeout, want...)
}

// write tells the worker to write now, and returns how the storage answered.
func (w *demoWorker) write(ctx context.Context) (demoEvent, error) {
	return w.command(ctx, "write", "wrote", "rejected", "write-failed")
}

// waitExit waits for a worker told to exit, and fails unless it exits 0.
func (w *demoWorker) waitExit(ctx context.Context) error {
	t := time.NewTimer(stepTimeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-w.p.Lines():
			if !ok {
				if code := w.p.ExitCode(); code != 0 {
					return fmt.Errorf("worker %s exited with status %d%s", w.name, code, w.stderrTail())
				}
				return nil
			}
			if ev := parseEvent(l); ev.Event == "error" {
				return fmt.Errorf("worker %s: %s%s", w.name, ev.Message, w.stderrTail())
			}
		case <-t.C:
			return fmt.Errorf("worker %s did not exit within %v of being told to", w.name, stepTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// kill resumes the worker if it is paused, kills it and reaps it.
func (w *demoWorker) kill() {
	_ = w.p.Kill()
	for range w.p.Lines() {
	}
}

func (w *demoWorker) stderrTail() string {
	if s := strings.TrimSpace(w.p.Stderr()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}
