package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/storage"
	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/internal/proc"
)

// demoPlay is one run of a story in progress.
type demoPlay struct {
	demo  *demo
	story *demoStory
	spec  demoRunSpec
	run   *demoRun
	dir   string // the run's own directory, for its resource
	a, b  *demoWorker

	grantedA time.Time
	cleanup  []func() // what prepare started for the run, undone after it

	store      *storage.Store // the article's storage, and its URL
	storageURL string
}

// play runs the story once, as a script of steps: A takes the lock; A is
// paused (the pause fault of fence check) while B waits for the lock, gets
// it once A's lease expired, does the step and releases; A resumes and does
// the step with what it still believes is its lock.
func (p *demoPlay) play(ctx context.Context) error {
	defer func() {
		for _, undo := range p.cleanup {
			undo()
		}
	}()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	if err := p.story.prepare(ctx, p); err != nil {
		return fmt.Errorf("preparing the resource: %w", err)
	}
	p.run.tl.Lanes = []string{"A", "B", p.story.lane}
	script := []func(context.Context) error{p.holderTakesLock, p.holderPausedWhile(p.otherTakesOver), p.holderActs}
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

// startWorker starts a `fence demo worker` process for this run and
// registers it for cleanup. It runs in its own process group, so that a
// Ctrl-C at the terminal reaches only the demo, which then stops its
// workers in order; and dies with the demo where the system can.
func (p *demoPlay) startWorker(name string) (*demoWorker, error) {
	d := p.demo
	args := []string{"demo", "worker",
		"--endpoints", d.endpoints,
		"--use", p.story.name,
		"--name", name,
		"--lock", p.story.lock,
		"--ttl", d.f.ttl.String(),
		"--dir", p.dir,
		"--fix", p.spec.fix,
	}
	if p.story.workerArgs != nil {
		args = append(args, p.story.workerArgs(p)...)
	}
	pr, err := proc.Start(proc.Spec{
		Name:          "worker " + name,
		Path:          d.exe,
		Args:          args,
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

// startWaiting starts a worker and waits for its report that it has its
// session and asks for the lock.
func (p *demoPlay) startWaiting(ctx context.Context, name string) (*demoWorker, demoEvent, error) {
	w, err := p.startWorker(name)
	if err != nil {
		return nil, demoEvent{}, err
	}
	waiting, err := w.expect(ctx, stepTimeout, "waiting")
	return w, waiting, err
}

// holderTakesLock: A gets the lock (or is elected).
func (p *demoPlay) holderTakesLock(ctx context.Context) error {
	r := p.run
	a, _, err := p.startWaiting(ctx, "A")
	if err != nil {
		return err
	}
	p.a = a
	granted, err := a.expect(ctx, stepTimeout, "acquired")
	if err != nil {
		return err
	}
	r.tokenA, p.grantedA = granted.Token, granted.at
	r.mark("A", p.grantedA, timeline.MarkGrant, grantLabel(p.story, granted))
	return nil
}

// holderPausedWhile: A, once the script's first step started it, is paused
// at once, as by a GC pause or a VM migration, while during runs, and then
// resumed.
func (p *demoPlay) holderPausedWhile(during func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		r := p.run
		paused, resumed, err := p.a.p.PauseWhile(ctx, during)
		if err != nil {
			return err
		}
		r.span("A", paused, resumed, timeline.SpanPaused, "paused by SIGSTOP")
		r.mark("A", resumed, timeline.MarkInfo, "resumed by SIGCONT")
		return nil
	}
}

// grantLabel says on the timeline what a worker got.
func grantLabel(s *demoStory, ev demoEvent) string {
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
func (p *demoPlay) otherTakesOver(ctx context.Context) error {
	r := p.run
	b, waiting, err := p.startWaiting(ctx, "B")
	if err != nil {
		return err
	}
	p.b = b
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

	if r.writeB, err = b.act(ctx); err != nil {
		return err
	}
	r.mark("B", r.writeB.at, writeKind(r.writeB), p.story.stepLabelOf(r, r.writeB, "B", r.tokenB))
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
func (p *demoPlay) holderActs(ctx context.Context) error {
	r := p.run
	var err error
	if r.writeA, err = p.a.act(ctx); err != nil {
		return err
	}
	r.mark("A", r.writeA.at, writeKind(r.writeA), p.story.stepLabelOf(r, r.writeA, "A", r.tokenA))
	return nil
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

// judgeUse sets the run's verdict: happened says whether the run ended as
// its story says, what, and found what the demo found instead. A run where
// B's step, under the lock, did not take effect is unexpected whatever else
// happened.
func (p *demoPlay) judgeUse(happened bool, what, found string) {
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
