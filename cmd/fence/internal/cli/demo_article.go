package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/cmd/fence/internal/storage"
	"github.com/fencelock/fence/cmd/fence/internal/timeline"
	"github.com/fencelock/fence/fencing"
)

// articleName is the article's story among the workers' scripts; `fence
// demo` without --use plays it.
const articleName = "article"

// articleStory is the article's story, on the lock and storage key of f: a
// lease lock's holder A is paused past its TTL; B gets the lock and writes
// "B"; A wakes and writes "A". A storage that does not check tokens takes
// A's late write and loses B's update; one that checks fencing tokens
// rejects it.
func articleStory(f demoFlags) *demoStory {
	return &demoStory{
		name:    articleName,
		lock:    f.lock,
		on:      fmt.Sprintf("lock %q", f.lock),
		heading: "fence demo: a lock holder paused past its lease, played twice with real processes",
		title:   "fence demo: a lock holder paused past its lease, without and with fencing tokens",
		summary: "Both runs went as expected: without fencing the paused holder's late write destroyed a newer one; with fencing the storage rejected it.",
		lane:    "storage",
		setup:   []string{fmt.Sprintf("storage       an HTTP server in this process holding key %q", f.key)},
		runs: []demoRunSpec{
			{title: "lease lock, resource does not check tokens"},
			{fix: "fenced", title: "with fencing, the resource rejects stale tokens"},
		},
		prepare: prepareArticle,
		workerArgs: func(p *demoPlay) []string {
			return []string{"--storage", p.storageURL, "--storage-key", f.key}
		},
		stepLabel: func(r *demoRun, ev demoEvent, who string, token uint64) string {
			return writeLabel(ev, who, token, r.fenced)
		},
		inspect: inspectArticle,
		notes: func(f demoFlags) []string {
			return []string{fmt.Sprintf("Workers A and B are separate processes, each with its own session (TTL %v) on lock %q; they write key %q of an HTTP storage. "+
				"A is paused with SIGSTOP right after it gets the lock and resumed with SIGCONT once B has written and released.", f.ttl, f.lock, f.key)}
		},
	}
}

// prepareArticle starts the run's storage, which checks fencing tokens in
// the run with the fix.
func prepareArticle(_ context.Context, p *demoPlay) error {
	p.store = storage.New()
	srv, err := storage.Serve(storageHandler(p.store, p.run.fenced))
	if err != nil {
		return err
	}
	p.cleanup = append(p.cleanup, srv.Close)
	p.storageURL = srv.URL
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

// inspectArticle reads what the storage holds in the end, and judges.
func inspectArticle(_ context.Context, p *demoPlay) error {
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
	r.judge(p.demo.f)
	return nil
}

// articleActor writes the worker's name to the article's storage.
var articleActor = actorScript{act: demoPut}

// demoPut writes the worker's name to the storage, with its token when
// fenced, and says how the storage answered.
func demoPut(ctx context.Context, a *demoActor) demoEvent {
	if a.f.fix != "" {
		ctx = fencing.WithToken(ctx, a.f.lock, a.grant.Token())
	}
	status, err := storage.Put(ctx, strings.TrimRight(a.f.storage, "/")+"/"+a.f.key, a.f.name)
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		return demoEvent{Event: "rejected", Status: status, Token: stale.Token, Highest: stale.Highest, Key: stale.Key, Message: stale.Error()}
	case err != nil:
		return demoEvent{Event: "write-failed", Status: status, Message: err.Error()}
	}
	return demoEvent{Event: "wrote", Status: status}
}
