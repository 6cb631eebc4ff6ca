package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/cmd/fence/internal/timeline"
)

// electionKey is where the leader records its decisions, as in
// examples/election: fence's own fenced KV store.
const electionKey = "scheduler/last-run"

// electionStory: leader A is paused past its TTL, B is elected and writes;
// A wakes, still sure it leads, and writes too. Without its token the KV
// store takes both writes; in strict mode it refuses A's.
var electionStory = &demoStory{
	name:    "election",
	about:   "a leader paused past its TTL, and a second leader",
	page:    "docs/uses/election.md",
	lock:    "scheduler",
	lane:    "kv",
	elected: true,
	setup: []string{
		"leaders       A and B campaign in election \"scheduler\" (client.Election); the leader records its decision",
		"resource      fence's fenced KV store, key \"" + electionKey + "\", stands in for what the leader controls",
	},
	runs: []demoRunSpec{
		{title: "without the fix, the leader writes without its token"},
		{fix: "strict", title: "with the fix, the leader writes with its leadership token (strict mode)"},
	},
	prepare: prepareElection,
	inspect: inspectElection,
	note: "A campaigns and is elected, then is paused with SIGSTOP; its session expires and B is elected, writes its decision to the KV store and resigns; " +
		"A is resumed with SIGCONT and, still believing it leads, writes its own decision.",
}

var electionActor = actorScript{
	acquire: func(ctx context.Context, a *demoActor) error {
		e := client.NewElection(a.s, a.f.lock)
		l, err := e.Campaign(ctx, a.f.name)
		if err != nil {
			return err
		}
		a.grant, a.release = l.Grant, e.Resign
		return nil
	},
	act: electionWrite,
}

// electionDecision is the value leader name writes.
func electionDecision(name string) string { return "jobs assigned by " + name }

// electionWrite records the leader's decision, with its leadership token
// in strict mode when the fix is on.
func electionWrite(ctx context.Context, a *demoActor) demoEvent {
	value := electionDecision(a.f.name)
	var opts []client.WriteOption
	if a.f.fix == "strict" {
		opts = []client.WriteOption{client.WithGrant(a.grant), client.Strict()}
	}
	_, err := a.c.KV().Put(ctx, electionKey, []byte(value), opts...)
	switch {
	case errors.Is(err, fence.ErrNotHolder), errors.Is(err, fence.ErrStaleToken):
		return demoEvent{Event: "rejected", Token: a.grant.Token(), Message: "write refused: " + err.Error()}
	case err != nil:
		return stepFailed(err)
	case len(opts) > 0:
		return demoEvent{Event: "wrote", Message: fmt.Sprintf("wrote %q with token %d (strict): accepted", value, a.grant.Token())}
	}
	return demoEvent{Event: "wrote", Message: fmt.Sprintf("wrote %q, no token: accepted", value)}
}

// withServiceKV calls fn with the KV store of the demo's lock service,
// within stepTimeout.
func (d *demo) withServiceKV(ctx context.Context, fn func(ctx context.Context, kv *client.KV) error) error {
	g := *d.g
	g.endpoints = d.endpoints
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	return fn(ctx, c.KV())
}

// prepareElection deletes the decision of an earlier run.
func prepareElection(ctx context.Context, p *demoPlay) error {
	return p.demo.withServiceKV(ctx, func(ctx context.Context, kv *client.KV) error {
		_, err := kv.Delete(ctx, electionKey)
		return err
	})
}

// inspectElection reads the decision the KV store holds in the end.
func inspectElection(ctx context.Context, p *demoPlay) error {
	var kv *client.KeyValue
	err := p.demo.withServiceKV(ctx, func(ctx context.Context, store *client.KV) (err error) {
		kv, err = store.Get(ctx, electionKey)
		return err
	})
	if err != nil {
		return err
	}
	final := "no value"
	if kv != nil {
		final = fmt.Sprintf("%q", kv.Value)
	}
	r, now := p.run, time.Now()
	a, b := electionDecision("A"), electionDecision("B")
	story := fmt.Sprintf("A (token %d) was elected and paused past its TTL; B was elected (token %d) and wrote %q; A woke, still sure it led, and wrote %q", r.tokenA, r.tokenB, b, a)
	switch {
	case p.spec.fix == "":
		happened := r.writeA.Event == "wrote" && final == fmt.Sprintf("%q", a)
		if happened {
			r.mark(p.story.lane, now, timeline.MarkLostUpdate, fmt.Sprintf("two leaders wrote; value is %s, B's decision is gone", final))
		}
		p.judgeUse(happened, fmt.Sprintf("TWO LEADERS: %s. The KV store took both writes and holds A's stale decision: the election alone could not stop the old leader.", story), "the value is "+final)
	default:
		happened := r.writeA.Event == "rejected" && final == fmt.Sprintf("%q", b)
		if happened {
			r.mark(p.story.lane, now, timeline.MarkInfo, fmt.Sprintf("value is %s: B's decision survived", final))
		}
		p.judgeUse(happened, fmt.Sprintf("REFUSED: %s with its token %d, and the KV store refused it in strict mode: B's token %d is the election's current grant. It still holds B's decision.", story, r.tokenA, r.tokenB), "the value is "+final)
	}
	return nil
}
