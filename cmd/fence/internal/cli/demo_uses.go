package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/internal/proc"
)

// useStory is the failure-and-fix story of one recipe of docs/uses, played
// by `fence demo --use NAME` like the article's story: worker A gets the
// lock, A is paused past its TTL while B gets it and does the step, A
// resumes and does the step too. Without the fix both steps take effect;
// with it, A's is refused.
type useStory struct {
	name  string // as given to --use
	about string // one line, for --use list
	page  string // the recipe's page
	lock  string // the lock or election the actors take
	// lane is the resource's lane on the timeline.
	lane string
	// setup says what stands in for what, one line each, after the lock
	// service's line.
	setup []string
	// runs are played in order; the first is without the fix.
	runs []useRunSpec
	// prepare makes a fresh resource for a run before its actors start.
	prepare func(ctx context.Context, p *usePlay) error
	// inspect reads the resource after a run, marks its lane, and judges:
	// it sets the run's ok and verdict.
	inspect func(ctx context.Context, p *usePlay) error
	// note describes the story under the picture.
	note string
	// elected says the lock is an election: the timeline speaks of
	// campaigns, leaders and resignations.
	elected bool
}

// useRunSpec is one run of a story.
type useRunSpec struct {
	fix   string // "" for the run without a fix; else the actors' --fix
	title string
}

// useStories are the stories, in the order --use list shows them.
var useStories = []*useStory{electionStory, jobOnceStory, inventoryStory}

func findUseStory(name string) *useStory {
	for _, s := range useStories {
		if s.name == name {
			return s
		}
	}
	return nil
}

// listUseStories writes the stories --use knows.
func listUseStories(w *tabwriter.Writer) error {
	fmt.Fprintln(w, "USE\tSTORY\tPAGE")
	for _, s := range useStories {
		fmt.Fprintf(w, "%s\t%s\t%s\n", s.name, s.about, s.page)
	}
	return w.Flush()
}

func useNames() string {
	var names []string
	for _, s := range useStories {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// runDemoUse is `fence demo --use NAME`.
func runDemoUse(ctx context.Context, g *globals, f demoFlags, outSet bool) error {
	if f.use == "list" {
		return listUseStories(tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0))
	}
	story := findUseStory(f.use)
	if story == nil {
		var list strings.Builder
		tw := tabwriter.NewWriter(&list, 0, 0, 2, ' ', 0)
		_ = listUseStories(tw)
		return fmt.Errorf("no story for --use %q; these exist (%s):\n%s", f.use, useNames(), strings.TrimSuffix(list.String(), "\n"))
	}
	if !outSet {
		f.out = "fence-demo-" + story.name + ".html"
	}
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
	d.printUseSetup(story, tmp)

	var runs []*demoRun
	for i, spec := range story.runs {
		r := &demoRun{number: i + 1, fenced: spec.fix != "", tl: &timeline.Timeline{Title: fmt.Sprintf("Run %d: %s", i+1, spec.title)}}
		runs = append(runs, r)
		fmt.Fprintf(g.stdout, "\n%s\n", r.tl.Title)
		p := &usePlay{demo: d, story: story, spec: spec, run: r, dir: filepath.Join(tmp, fmt.Sprintf("run%d", r.number))}
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
	return d.concludeUse(story, runs, began)
}

// printUseSetup says what the story runs, and what stands in for what.
func (d *demo) printUseSetup(s *useStory, tmp string) {
	w := d.g.stdout
	fmt.Fprintf(w, "fence demo --use %s: %s (%s), played with real processes\n", s.name, s.about, s.page)
	if d.srv != nil {
		fmt.Fprintf(w, "  lock service  embedded single node on %s (data in %s)\n", d.endpoints, d.dataDir)
	} else {
		fmt.Fprintf(w, "  lock service  %s\n", d.endpoints)
	}
	fmt.Fprintf(w, "  workers       A and B, each a process with its own session (TTL %v) on %q\n", d.f.ttl, s.lock)
	for _, line := range s.setup {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(line, "$TMP", tmp))
	}
}

// concludeUse writes the picture of the story's runs, prints the summary,
// and fails unless every run went as the story says.
func (d *demo) concludeUse(s *useStory, runs []*demoRun, began time.Time) error {
	var failed []string
	var tls []*timeline.Timeline
	for _, r := range runs {
		tls = append(tls, r.tl)
		if !r.ok {
			failed = append(failed, fmt.Sprintf("run %d: %s", r.number, r.verdict))
		}
	}
	summary := "Every run went as expected: without the fix the paused worker's late step took effect too; with the fix it was refused."
	if len(failed) > 0 {
		summary = "The demo did NOT go as expected; see the verdicts above."
	}
	page := &timeline.Page{
		Title:     fmt.Sprintf("fence demo --use %s: %s", s.name, s.about),
		Timelines: tls,
		Notes:     []string{s.note, fmt.Sprintf("Workers A and B are separate processes with sessions of TTL %v. The recipe: %s.", d.f.ttl, s.page), summary},
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

// usePlay is one run of a story in progress.
type usePlay struct {
	demo  *demo
	story *useStory
	spec  useRunSpec
	run   *demoRun
	dir   string // the run's own directory, for its resource
	a, b  *demoWorker

	grantedA time.Time
}

// play runs the script of a story once, as demoPlay does the article's.
func (p *usePlay) play(ctx context.Context) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	if err := p.story.prepare(ctx, p); err != nil {
		return fmt.Errorf("preparing the resource: %w", err)
	}
	p.run.tl.Lanes = []string{"A", "B", p.story.lane}
	script := []func(context.Context) error{p.holderTakesLock, p.run.holderPausedWhile(&p.a, p.otherTakesOver), p.holderActs}
	for _, step := range script {
		if err := step(ctx); err != nil {
			return err
		}
	}
	if err := p.story.inspect(ctx, p); err != nil {
		return fmt.Errorf("inspecting the resource: %w", err)
	}
	return p.stopWorkers(ctx)
}

// startActor starts a `fence demo actor` process for this run and
// registers it for cleanup, as startWorker does a worker.
func (p *usePlay) startActor(name string) (*demoWorker, error) {
	d := p.demo
	pr, err := proc.Start(proc.Spec{
		Name: "worker " + name,
		Path: d.exe,
		Args: []string{"demo", "actor",
			"--endpoints", d.endpoints,
			"--use", p.story.name,
			"--name", name,
			"--lock", p.story.lock,
			"--ttl", d.f.ttl.String(),
			"--dir", p.dir,
			"--fix", p.spec.fix,
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
	w := &demoWorker{name: name, p: pr}
	d.mu.Lock()
	d.workers = append(d.workers, w)
	d.mu.Unlock()
	return w, nil
}

// holderTakesLock: A gets the lock (or is elected).
func (p *usePlay) holderTakesLock(ctx context.Context) error {
	r := p.run
	a, err := p.startActor("A")
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
	r.mark("A", p.grantedA, timeline.MarkGrant, grantLabel(p.story, granted))
	return nil
}

// grantLabel says on the timeline what an actor got.
func grantLabel(s *useStory, ev demoEvent) string {
	label := fmt.Sprintf("got lock %s, token %d", s.lock, ev.Token)
	if s.elected {
		label = fmt.Sprintf("elected leader of %s, token %d", s.lock, ev.Token)
	}
	if ev.Message != "" {
		label += "; " + ev.Message
	}
	return label
}

// otherTakesOver: B asks for the lock, which the server grants once A's
// session expired; B does the step and releases.
func (p *usePlay) otherTakesOver(ctx context.Context) error {
	r := p.run
	b, err := p.startActor("B")
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
		return fmt.Errorf("%w (is %q held by someone else? see fence locks)", err, p.story.lock)
	}
	r.tokenB = granted.Token
	r.span("A", p.grantedA, granted.at, timeline.SpanLease, "")
	waitingLabel, expiredLabel, releasedLabel := "waiting for the lock", "lease expired; the lock went to B", "released the lock"
	if p.story.elected {
		waitingLabel, expiredLabel, releasedLabel = "campaigning", "session expired; B leads now", "resigned"
	}
	r.span("B", waiting.at, granted.at, timeline.SpanWaiting, waitingLabel)
	r.mark("B", granted.at, timeline.MarkGrant, grantLabel(p.story, granted))
	r.mark("A", granted.at, timeline.MarkInfo, expiredLabel)

	if r.writeB, err = b.command(ctx, "act", "wrote", "rejected", "write-failed"); err != nil {
		return err
	}
	r.mark("B", r.writeB.at, writeKind(r.writeB), r.writeB.Message)
	released, err := b.command(ctx, "release", "released")
	if err != nil {
		return err
	}
	r.span("B", granted.at, released.at, timeline.SpanLease, "")
	r.mark("B", released.at, timeline.MarkInfo, releasedLabel)
	return nil
}

// holderActs: A, awake and still believing it holds the lock, does the
// step.
func (p *usePlay) holderActs(ctx context.Context) error {
	r := p.run
	var err error
	if r.writeA, err = p.a.command(ctx, "act", "wrote", "rejected", "write-failed"); err != nil {
		return err
	}
	r.mark("A", r.writeA.at, writeKind(r.writeA), r.writeA.Message)
	return nil
}

// stopWorkers tells both actors to exit and waits for them.
func (p *usePlay) stopWorkers(ctx context.Context) error {
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

// judgeUse sets the run's verdict: happened says whether the run ended as
// its story says, what, and found what the demo found instead. A run where
// B's step, under the lock, did not take effect is unexpected whatever else
// happened.
func (p *usePlay) judgeUse(happened bool, what, found string) {
	r := p.run
	switch {
	case r.tokenB <= r.tokenA:
		r.verdict = fmt.Sprintf("UNEXPECTED: B's token %d is not above A's %d", r.tokenB, r.tokenA)
	case r.writeB.Event != "wrote":
		r.verdict = fmt.Sprintf("UNEXPECTED: B's step, under the lock, did not take effect: %s", describe(r.writeB))
	case happened:
		r.ok = true
		r.verdict = what
	default:
		wanted, _, _ := strings.Cut(what, ":")
		r.verdict = fmt.Sprintf("UNEXPECTED: the story ends %s, but A's step: %s; %s", wanted, describe(r.writeA), found)
	}
}

// useFixes are the --fix values the actors know, for their flag's help.
func useFixes() []string {
	var fixes []string
	for _, s := range useStories {
		for _, r := range s.runs {
			if r.fix != "" && !slices.Contains(fixes, r.fix) {
				fixes = append(fixes, r.fix)
			}
		}
	}
	return fixes
}
