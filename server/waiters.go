package server

import (
	"fmt"
	"sync"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fsm"
)

// waitKey names one session's wait for one lock. A session waits for a lock
// at most once in the state, but a client that retries may have several
// calls blocked on the same key; each gets its own waiter.
type waitKey struct {
	session uint64
	lock    string
}

// outcome ends a wait: a grant, or the reason there will be none.
type outcome struct {
	grant fsm.Grant
	err   error
}

type waiter struct {
	key waitKey
	ch  chan outcome // buffered: the hub never blocks on a slow handler
}

// waitHub wakes blocked Acquire calls by push: the FSM observer hands it
// every committed grant and every ended session, and it delivers them to the
// calls waiting on those keys.
type waitHub struct {
	mu    sync.Mutex
	waits map[waitKey][]*waiter
}

func newWaitHub() *waitHub { return &waitHub{waits: map[waitKey][]*waiter{}} }

// register must be called before the Acquire is proposed, so that a grant
// committed at once cannot be missed.
func (h *waitHub) register(session uint64, lock string) *waiter {
	w := &waiter{key: waitKey{session, lock}, ch: make(chan outcome, 1)}
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

func (h *waitHub) deliverLocked(key waitKey, o outcome) {
	for _, w := range h.waits[key] {
		select {
		case w.ch <- o:
		default: // already ended
		}
	}
}

// applied delivers the effects of one committed command.
func (h *waitHub) applied(res fsm.Result) {
	if len(res.Grants) == 0 && len(res.Ended) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, g := range res.Grants {
		h.deliverLocked(waitKey{g.Session, g.Lock}, outcome{grant: g})
	}
	if len(res.Ended) == 0 {
		return
	}
	ended := map[uint64]bool{}
	for _, id := range res.Ended {
		ended[id] = true
	}
	for key := range h.waits {
		if ended[key.session] {
			h.deliverLocked(key, outcome{err: fmt.Errorf("%w: session %d ended while waiting for lock %q", fence.ErrSessionNotFound, key.session, key.lock)})
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
		h.deliverLocked(key, outcome{err: err})
	}
}

// restored re-checks every wait against a state loaded from a snapshot.
func (h *waitHub) restored(read func(fn func(*fsm.State))) {
	h.mu.Lock()
	defer h.mu.Unlock()
	read(func(s *fsm.State) {
		for key := range h.waits {
			if _, ok := s.Session(key.session); !ok {
				h.deliverLocked(key, outcome{err: fmt.Errorf("%w: session %d no longer exists", fence.ErrSessionNotFound, key.session)})
				continue
			}
			info, _ := s.Lock(key.lock)
			for _, hd := range info.Holders {
				if hd.Session == key.session {
					h.deliverLocked(key, outcome{grant: fsm.Grant{Session: key.session, Lock: key.lock, Token: hd.Token, Mode: hd.Mode}})
				}
			}
		}
	})
}
