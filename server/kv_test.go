package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
)

func ringRevisions(r *eventRing[fsm.KVEvent]) []uint64 {
	var revs []uint64
	r.each(func(ev fsm.KVEvent) { revs = append(revs, ev.KV.ModRevision) })
	return revs
}

// The watch history keeps the newest changes within its count and byte
// bounds, oldest first, and always the newest one; its floor is the
// oldest revision from which on it holds every change.
func TestEventRing(t *testing.T) {
	r := eventRing[fsm.KVEvent]{kind: &kvEvents, maxEvents: 3, maxBytes: 1000}
	for rev := uint64(1); rev <= 5; rev++ {
		r.push(fsm.KVEvent{KV: fsm.KeyValue{Key: "k", ModRevision: rev}})
	}
	if got := ringRevisions(&r); len(got) != 3 || got[0] != 3 || got[2] != 5 {
		t.Fatalf("kept %v, want [3 4 5]", got)
	}
	if r.floor != 3 {
		t.Fatalf("floor = %d, want 3", r.floor)
	}
	big := strings.Repeat("v", 850) // 915 bytes with its overhead
	r.push(fsm.KVEvent{KV: fsm.KeyValue{Key: "k", Value: []byte(big), ModRevision: 6}})
	if got := ringRevisions(&r); len(got) != 2 || got[0] != 5 || got[1] != 6 {
		t.Fatalf("after an 850-byte change, kept %v, want [5 6]", got)
	}
	r.push(fsm.KVEvent{KV: fsm.KeyValue{Key: "k", Value: []byte(big + big), ModRevision: 7}})
	if got := ringRevisions(&r); len(got) != 1 || got[0] != 7 || r.floor != 7 {
		t.Fatalf("a change over the byte bound alone: kept %v from %d, want [7] from 7", got, r.floor)
	}
	r.clear(8)
	if r.floor != 8 || len(ringRevisions(&r)) != 0 {
		t.Fatalf("after clear: floor %d, kept %v", r.floor, ringRevisions(&r))
	}
	off := eventRing[fsm.KVEvent]{kind: &kvEvents}
	off.push(fsm.KVEvent{KV: fsm.KeyValue{Key: "k", ModRevision: 4}})
	if off.floor != 5 || len(ringRevisions(&off)) != 0 {
		t.Fatalf("a history of none: floor %d, kept %v", off.floor, ringRevisions(&off))
	}
}

// A snapshot restore ends the open watches with Unavailable, so that their
// clients resume (or re-list) instead of jumping over the changes the
// snapshot stands for.
func TestWatchHubResetEndsWatchers(t *testing.T) {
	h := newEventHub(kvEvents, &watchSlots{}, 10, 1<<20)
	w, rev, err := h.add("", 0)
	if err != nil || rev != 0 {
		t.Fatalf("add: %v, revision %d", err, rev)
	}
	h.publish([]fsm.KVEvent{{KV: fsm.KeyValue{Key: "a", ModRevision: 1}}}, 1)
	h.reset(9, errReplaced)
	select {
	case <-w.ended:
		if !errors.Is(w.endErr, fence.ErrUnavailable) {
			t.Fatalf("ended with %v, want ErrUnavailable", w.endErr)
		}
	default:
		t.Fatal("the watcher is still open after a reset")
	}
	if _, _, err := h.add("", 5); !errors.Is(err, fence.ErrCompacted) {
		t.Fatalf("watch from before the snapshot: %v, want ErrCompacted", err)
	}
	if _, rev, err := h.add("", 10); err != nil || rev != 9 {
		t.Fatalf("watch from after the snapshot: %v, revision %d; want revision 9", err, rev)
	}
}
