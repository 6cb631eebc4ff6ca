package server

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
)

// Watching locks (docs/design.md, "Watching locks"). The state machine
// lists the lock events each command causes (fsm.Effects.LockEvents); the
// lock feed numbers them by their place in the log, so that every node,
// applying the same log, gives each event the same revision, and fans
// them out through an eventHub, as the KV watch does its changes.

// lockEventBits is how many low bits of a lock event's revision number
// the event among its entry's events; raft indexes below 2^44 fit in the
// rest.
const lockEventBits = 20

// maxEntryLockEvents is the most lock events one entry's revisions can
// number.
const maxEntryLockEvents = 1 << lockEventBits

// lockRevision is the revision of the n-th lock event of the entry at
// index.
func lockRevision(index, n uint64) uint64 { return index<<lockEventBits | n }

// lockEvent is a lock event as the node publishes it.
type lockEvent struct {
	Revision uint64
	fsm.LockEvent
	// At is when this node applied it, on its own clock: for the console
	// only, never sent to a watcher (whose events are every node's).
	At time.Time
}

var lockEvents = eventKind[lockEvent]{
	what:     "lock events",
	revision: func(ev lockEvent) uint64 { return ev.Revision },
	name:     func(ev lockEvent) string { return ev.Lock },
	size:     func(ev lockEvent) int { return len(ev.Lock) + len(ev.Owner) + 96 },
	relist:   "list the locks (fence locks) and watch again from now",
}

// lockFeed numbers the lock events of the commands the node applies and
// publishes them to its hub. applied and restored run on raft's apply
// goroutine, one at a time.
type lockFeed struct {
	*eventHub[lockEvent]
	clock clock.Clock
	// entry is the index of the entry whose events are being numbered,
	// and n how many of them were numbered so far.
	entry, n uint64
}

func newLockFeed(slots *watchSlots, c clock.Clock, historyEvents int) *lockFeed {
	return &lockFeed{eventHub: newEventHub(lockEvents, slots, historyEvents, watchHistoryBytes), clock: c}
}

// applied publishes the lock events of the command at seq, and returns
// them as published.
func (f *lockFeed) applied(seq fsm.Seq, events []fsm.LockEvent) []lockEvent {
	if seq.Index() != f.entry {
		f.entry, f.n = seq.Index(), 0
	}
	if f.n+uint64(len(events)) > maxEntryLockEvents {
		// Revisions would run into the next entry's. Never seen: it takes
		// a command that ends a million grants and waits at once.
		f.n = maxEntryLockEvents
		f.reset(lockRevision(f.entry+1, 0)-1, fmt.Errorf("%w: log entry %d made more than %d lock events, which a watch cannot number; %s",
			fence.ErrLimit, f.entry, maxEntryLockEvents, lockEvents.relist))
		return nil
	}
	var out []lockEvent
	if len(events) > 0 {
		now := f.clock.Now()
		out = make([]lockEvent, len(events))
		for i, ev := range events {
			out[i] = lockEvent{Revision: lockRevision(f.entry, f.n), LockEvent: ev, At: now}
			f.n++
		}
	}
	f.publish(out, lockRevision(f.entry, f.n)-1)
	return out
}

// restored notes that the state was replaced by a snapshot of the state
// at raft index index: the events up to it are not known here.
func (f *lockFeed) restored(index uint64) {
	f.entry, f.n = 0, 0
	f.reset(lockRevision(index+1, 0)-1, errReplaced)
}

// lockService is the LockService the server registers: the Server's
// handlers, and Watch, which is not the KV service's.
type lockService struct{ handlers }

// Watch implements fencev1connect.LockServiceHandler: the lock events of
// the locks under a prefix, from start_revision on (from the node's
// history of recent events) or from now. A revision older than the
// history is refused with FailedPrecondition (REASON_COMPACTED); a watcher
// that falls more than a buffer behind is ended with ResourceExhausted.
func (l lockService) Watch(ctx context.Context, req *connect.Request[fencev1.LockWatchRequest], stream *connect.ServerStream[fencev1.LockWatchResponse]) error {
	s, m := l.Server, req.Msg
	return runWatch(ctx, s, s.lockWatches.eventHub, watchRequest{m.GetPrefix(), s.cfg.MaxNameBytes, m.GetStartRevision(), m.GetProgressInterval()}, watchSender[lockEvent]{
		start: func(rev uint64) error { return stream.Send(&fencev1.LockWatchResponse{Revision: rev}) },
		events: func(events []lockEvent) error {
			return inMessages(events, &lockEvents, func(events []lockEvent) error {
				resp := &fencev1.LockWatchResponse{Events: make([]*fencev1.LockEvent, len(events))}
				for i, ev := range events {
					resp.Events[i] = apiLockEvent(ev)
				}
				return stream.Send(resp)
			})
		},
		progress: func(rev uint64) error {
			return stream.Send(&fencev1.LockWatchResponse{Progress: true, Revision: rev})
		},
	})
}

func apiLockEvent(ev lockEvent) *fencev1.LockEvent {
	out := &fencev1.LockEvent{
		Revision:   ev.Revision,
		Type:       apiLockEventType(ev.Kind),
		Lock:       ev.Lock,
		SessionId:  ev.Session,
		Owner:      ev.Owner,
		Token:      ev.Token,
		Permits:    ev.Permits,
		Reason:     fencev1.GiveUpReason(ev.GaveUp), // numbered alike
		SessionEnd: fencev1.SessionEnd(ev.End),      // numbered alike
		DelayId:    ev.DelayID,
	}
	if ev.Mode != 0 {
		out.Mode = apiMode(ev.Mode)
	}
	if ev.Kind == fsm.LockDelayStarted {
		out.LockDelay = durationpb.New(ev.Delay)
	}
	return out
}

func apiLockEventType(k fsm.LockEventKind) fencev1.LockEventType {
	switch k {
	case fsm.LockGranted:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_GRANTED
	case fsm.LockReleased:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_RELEASED
	case fsm.LockExpired:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_EXPIRED
	case fsm.LockRevoked:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_REVOKED
	case fsm.LockAbandoned:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_ABANDONED
	case fsm.LockQueued:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_QUEUED
	case fsm.LockGaveUp:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_GAVE_UP
	case fsm.LockDelayStarted:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_DELAY_STARTED
	case fsm.LockDelayEnded:
		return fencev1.LockEventType_LOCK_EVENT_TYPE_DELAY_ENDED
	}
	return fencev1.LockEventType_LOCK_EVENT_TYPE_UNSPECIFIED
}
