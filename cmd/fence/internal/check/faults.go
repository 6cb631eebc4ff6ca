package check

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fence/internal/proc"
)

// faultStep injects one fault and heals it, if it heals, before it
// returns. It names its target in ev, and reports false when it found
// nothing to hit (no leader, say). The steps draw from the seeded random
// source in a fixed order, so that a seed replays its schedule.
type faultStep func(ctx context.Context, ev *FaultEvent) bool

// faultSteps maps each fault kind to its step.
func (r *runner) faultSteps() map[string]faultStep {
	return map[string]faultStep{
		FaultPause:           r.pauseWorker,
		FaultKillWorker:      r.killWorker,
		FaultKillServer:      r.killServer,
		FaultKillLeader:      r.killServer,
		FaultPartition:       r.partitionLeader,
		FaultPauseLeader:     r.pauseServer,
		FaultPauseFollower:   r.pauseServer,
		FaultCorruptFollower: r.corruptFollower,
		FaultDiskFull:        r.fillDisk,
		FaultWipe:            r.wipeNode,
		FaultForeignAdd:      r.addForeignNode,
	}
}

// injectFaults runs the seeded schedule until ctx ends: a fault of a kind
// drawn from kinds every FaultInterval or so.
func (r *runner) injectFaults(ctx context.Context, kinds []string) {
	if len(kinds) == 0 {
		<-ctx.Done()
		return
	}
	steps := r.faultSteps()
	for {
		wait := time.Duration((0.5 + r.rng.Float64()) * float64(r.cfg.FaultInterval))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		kind := kinds[r.rng.IntN(len(kinds))]
		ev := FaultEvent{Kind: kind, Start: time.Now()}
		if !steps[kind](ctx, &ev) {
			continue
		}
		ev.End = time.Now()
		note := ""
		for _, s := range []string{ev.Outcome, ev.Note} {
			if s != "" {
				note += ", " + s
			}
		}
		fmt.Fprintf(r.log, "check: %s %s (%v%s)\n", ev.Kind, ev.Target, ev.End.Sub(ev.Start).Round(time.Millisecond), note)
		r.faults = append(r.faults, ev)
	}
}

// pauseFor pauses p for hold, or until ctx ends.
func pauseFor(ctx context.Context, p *proc.Process, hold time.Duration) {
	_, _, _ = p.PauseWhile(ctx, func(ctx context.Context) error {
		sleep(ctx, hold)
		return nil
	})
}

// pauseWorker pauses the worker that holds the lock, if any (that is the
// pause the article is about), otherwise a random one, past its TTL.
func (r *runner) pauseWorker(ctx context.Context, ev *FaultEvent) bool {
	i, ok := r.hist.holder()
	if !ok || r.rng.IntN(4) == 0 {
		i = r.rng.IntN(len(r.workers))
	}
	hold := r.ttls[i] + time.Duration((0.5+r.rng.Float64())*float64(r.ttls[i]))
	ev.Target = r.workers[i].Name()
	pauseFor(ctx, r.workers[i], hold)
	return true
}

// killWorker kills a random worker and starts a new one in its place.
func (r *runner) killWorker(_ context.Context, ev *FaultEvent) bool {
	i := r.rng.IntN(len(r.workers))
	ev.Target = r.workers[i].Name()
	kill(r.workers[i])
	if err := r.startWorker(i); err != nil {
		fmt.Fprintf(r.log, "check: restarting worker %d: %v\n", i, err)
	}
	return true
}

// killServer kills a server, the leader for kill-leader and a random one
// for kill-server, and restarts it on its data.
func (r *runner) killServer(_ context.Context, ev *FaultEvent) bool {
	n := r.killTarget(ev.Kind)
	if n == nil {
		return false
	}
	ev.Target = n.name()
	r.restartNode(n, nil)
	return true
}

// killTarget picks the server a kill fault hits.
func (r *runner) killTarget(kind string) *node {
	if kind == FaultKillLeader {
		return r.leaderNode()
	}
	return r.nodes[r.rng.IntN(len(r.nodes))]
}

// partitionLeader cuts the leader off from the others for 1 to 2s.
func (r *runner) partitionLeader(ctx context.Context, ev *FaultEvent) bool {
	n := r.leaderNode()
	if n == nil {
		return false
	}
	ev.Target = n.name()
	r.partition(n, true)
	sleep(ctx, time.Duration((1+r.rng.Float64())*float64(time.Second)))
	r.partition(n, false)
	return true
}

// pauseServer pauses the leader or a follower, as ev's kind says, for as
// long as serverPauseHold draws.
func (r *runner) pauseServer(ctx context.Context, ev *FaultEvent) bool {
	n := r.pauseTarget(ev.Kind)
	if n == nil {
		return false
	}
	ev.Target = n.name()
	ev.Start = time.Now()
	r.mu.Lock()
	p := n.proc
	r.mu.Unlock()
	pauseFor(ctx, p, r.serverPauseHold(ev.Kind))
	return true
}
