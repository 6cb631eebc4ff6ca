package server

import (
	"fmt"
	"math"
	"sync"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
)

// outcome ends a wait: a grant, or the reason there will be none.
type outcome struct {
	grant fsm.Grant
	err   error
	// index is the fsm.Seq of the command that had this effect (commands
	// batched in one log entry have Seqs of their own). A wait
	// takes only outcomes of commands after its own Acquire: a node that
	// replays its log must not wake a new waiter with an old grant.
	index uint64
}

// always is the index of outcomes that concern every wait, whenever it began.
const always = math.MaxUint64

type waiter struct {
	// key is the wait this call blocks on. A session waits for a lock at
	// most once in the state, but a client that retries may have several
	// calls blocked on the same wait; each gets its own waiter.
	key    fsm.WaitRef
	req    request       // set by the handler once its Acquire is applied
	notify chan struct{} // capacity 1: the hub never blocks on a slow handler

	mu     sync.Mutex
	latest outcome
	has    bool
}

func (w *waiter) deliver(o outcome) {
	w.mu.Lock()
	if !w.has || o.index >= w.latest.index {
		w.latest, w.has = o, true
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// take returns the latest outcome of a command after index, if any.
func (w *waiter) take(index uint64) (outcome, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.has && w.latest.index > index {
		return w.latest, true
	}
	return outcome{}, false
}

// waitHub wakes blocked Acquire calls by push: the FSM observer hands it
// every committed grant and every ended session, and it delivers them to the
// calls waiting on those keys.
type waitHub struct {
	mu    sync.Mutex
	waits map[fsm.WaitRef][]*waiter
}

func newWaitHub() *waitHub { return &waitHub{waits: map[fsm.WaitRef][]*waiter{}} }

// register must be called before the Acquire is proposed, so that a grant
// committed at once cannot be missed.
func (h *waitHub) register(session uint64, lock string) *waiter {
	w := &waiter{key: fsm.WaitRef{Session: session, Lock: lock}, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	h.waits[w.key] = append(h.waits[w.key], w)
	h.mu.Unlock()
	return w
}

// unregister removes w and reports whether other calls still wait on its key.
func (h *waitHub) unregister(w *waiter) (others bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.waits[w.key]
	for i, x := range list {
		if x == w {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(h.waits, w.key)
		return false
	}
	h.waits[w.key] = list
	return true
}

func (h *waitHub) deliverLocked(key fsm.WaitRef, o outcome) {
	for _, w := range h.waits[key] {
		w.deliver(o)
	}
}

// applied delivers the effects of the command at index.
func (h *waitHub) applied(index uint64, eff fsm.Effects) {
	if len(eff.Grants) == 0 && len(eff.Ended) == 0 && eff.Dropped == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := eff.Dropped; d != nil {
		// A CancelAcquire from another call (a client giving up, curl with
		// the request id) or the wait's own CancelWait: a call still
		// blocked on it would otherwise wait for a grant that cannot come.
		h.deliverLocked(*d, outcome{err: fmt.Errorf("%w: the wait of session %d for lock %q was cancelled", fence.ErrCancelled, d.Session, d.Lock), index: index})
	}
	for _, g := range eff.Grants {
		h.deliverLocked(fsm.WaitRef{Session: g.Session, Lock: g.Lock}, outcome{grant: g, index: index})
	}
	if len(eff.Ended) == 0 {
		return
	}
	ended := map[uint64]bool{}
	for _, id := range eff.Ended {
		ended[id] = true
	}
	for key := range h.waits {
		if ended[key.Session] {
			h.deliverLocked(key, outcome{err: fmt.Errorf("%w: session %d ended (%s) while waiting for lock %q", fence.ErrSessionNotFound, key.Session, eff.EndedBy, key.Lock), index: index})
		}
	}
}

// failAll ends every wait with err: on leadership loss the waits stay queued
// in the state, and clients retry against the new leader, where Acquire is
// idempotent.
func (h *waitHub) failAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key := range h.waits {
		h.deliverLocked(key, outcome{err: err, index: always})
	}
}

// restored re-checks every wait against a state loaded from a snapshot.
func (h *waitHub) restored(read func(fn func(*fsm.State))) {
	h.mu.Lock()
	defer h.mu.Unlock()
	read(func(s *fsm.State) {
		for key := range h.waits {
			if _, ok := s.Session(key.Session); !ok {
				h.deliverLocked(key, outcome{err: fmt.Errorf("%w: session %d no longer exists", fence.ErrSessionNotFound, key.Session), index: always})
				continue
			}
			info, _ := s.Lock(key.Lock)
			for _, hd := range info.Holders {
				if hd.Session == key.Session {
					h.deliverLocked(key, outcome{grant: fsm.Grant{Session: key.Session, Lock: key.Lock, Token: hd.Token, Mode: hd.Mode}, index: always})
				}
			}
		}
	})
}
