package cli

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/storage"
	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/fencing"
)

// play runs the story once, as a script of steps: A takes the lock; A is
// paused (the pause fault of fence check) while B waits for the lock, gets
// it once A's lease expired, writes and releases; A resumes and writes with
// what it still believes is its lock.
func (d *demo) play(ctx context.Context, r *demoRun) error {
	store := storage.New()
	srv, err := storage.Serve(storageHandler(store, r.fenced))
	if err != nil {
		return err
	}
	defer srv.Close()
	p := &demoPlay{demo: d, run: r, store: store, storageURL: srv.URL}
	r.tl.Lanes = []string{"A", "B", "storage"}
	script := []func(context.Context) error{p.holderTakesLock, r.holderPausedWhile(&p.a, p.otherTakesOver), p.holderWrites}
	for _, step := range script {
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

	grantedA time.Time
}

// holderTakesLock: A takes the lock.
func (p *demoPlay) holderTakesLock(ctx context.Context) error {
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
	return nil
}

// holderPausedWhile: A (*holder, once the script's first step started it)
// is paused at once, as by a GC pause or a VM migration, while during
// runs, and then resumed. The article's story and the recipes' share it.
func (r *demoRun) holderPausedWhile(holder **demoWorker, during func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		paused, resumed, err := (*holder).p.PauseWhile(ctx, during)
		if err != nil {
			return err
		}
		r.span("A", paused, resumed, timeline.SpanPaused, "paused by SIGSTOP")
		r.mark("A", resumed, timeline.MarkInfo, "resumed by SIGCONT")
		return nil
	}
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

// holderWrites: A, awake and still believing it holds the lock, writes.
func (p *demoPlay) holderWrites(ctx context.Context) error {
	r := p.run
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

// storageHandler serves st as is, or guarded by the fenced write rule: a
// write must carry a token at least as high as any accepted before.
func storageHandler(st *storage.Store, fenced bool) http.Handler {
	if !fenced {
		return st
	}
	return fencing.Middleware(fencing.NewGuard(fencing.NewMemory()))(st)
}
