package server

import (
	"testing"

	"github.com/fencelock/fence/internal/fsm"
)

// A wait takes only the effects of commands after its own Acquire: a node
// that replays its log after a restart must not hand a new waiter an old
// grant of the same session and lock (found by fence check, kill-server).
func TestWaitIgnoresOutcomesBeforeItsAcquire(t *testing.T) {
	h := newWaitHub()
	w := h.register(1, "l")
	h.applied(5, fsm.Effects{Grants: []fsm.Grant{{Session: 1, Lock: "l", Token: 3}}}) // replayed
	const acquireIndex = 9
	if o, ok := w.take(acquireIndex); ok {
		t.Fatalf("wait at index %d took %+v from index 5", acquireIndex, o)
	}
	h.applied(12, fsm.Effects{Grants: []fsm.Grant{{Session: 1, Lock: "l", Token: 30}}})
	h.applied(7, fsm.Effects{Grants: []fsm.Grant{{Session: 1, Lock: "l", Token: 2}}}) // out of order: ignored
	o, ok := w.take(acquireIndex)
	if !ok || o.grant.Token != 30 {
		t.Fatalf("take = %+v, %v; want the grant of index 12 (token 30)", o, ok)
	}
	select {
	case <-w.notify:
	default:
		t.Fatal("no notification of the grant")
	}
	h.failAll(errFake)
	if o, ok := w.take(acquireIndex); !ok || o.err != errFake {
		t.Fatalf("after failAll take = %+v, %v", o, ok)
	}
}

var errFake = fsmErr("leadership lost")

type fsmErr string

func (e fsmErr) Error() string { return string(e) }
