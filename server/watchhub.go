package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
)

// The watch machinery, one for every kind of event a client can watch (KV
// changes, lock events): an eventHub fans the events the node applies out
// to its watchers, in log order, without ever blocking the apply loop, and
// keeps the most recent ones for watches that start at a past revision;
// serveWatch runs one watch's stream.

// watchBuffer is how many batches of events a watcher may fall behind.
const watchBuffer = 1024

// watchHistoryBytes bounds the memory of each kind's watch history.
const watchHistoryBytes = 64 << 20

// watchMessageBytes is about the most a watch message carries.
const watchMessageBytes = 1 << 20

// errReplaced ends the watches open when a snapshot replaces the state.
var errReplaced = fmt.Errorf("%w: the node's state was replaced by a snapshot; watch again from the last revision seen", fence.ErrUnavailable)

// eventKind describes one kind of watched event to its hub.
type eventKind[E any] struct {
	// what names the events in messages ("changes", "lock events").
	what string
	// revision is an event's place in the log: events are published in
	// increasing revision order, and no two have the same one.
	revision func(E) uint64
	// name is what a watch's prefix is matched against.
	name func(E) string
	// size is about the bytes an event keeps in the history.
	size func(E) int
	// relist says how to start over once the events a watch asks for
	// are no longer kept.
	relist string
}

// watchSlots bounds the watches open on a node, of every kind together.
type watchSlots struct {
	limit int // 0: no limit
	mu    sync.Mutex
	n     int
}

func (s *watchSlots) take() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 && s.n >= s.limit {
		return fmt.Errorf("%w: the node already has %d watchers, its limit", fence.ErrLimit, s.n)
	}
	s.n++
	return nil
}

func (s *watchSlots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
}

type watcher[E any] struct {
	prefix string
	start  uint64 // the first revision it wants; 0 for any
	ch     chan []E
	ended  chan struct{} // closed, with endErr set, when the hub drops the watcher
	endErr error
}

// eventHub fans one kind of event out to watchers. Its methods are safe
// for concurrent use; publish and reset run on raft's apply goroutine and
// never block.
type eventHub[E any] struct {
	kind  eventKind[E]
	slots *watchSlots

	mu       sync.Mutex
	watchers map[*watcher[E]]struct{}
	history  eventRing[E]
	// lastRev is the revision up to which every event is published.
	lastRev uint64
}

func newEventHub[E any](kind eventKind[E], slots *watchSlots, historyEvents, historyBytes int) *eventHub[E] {
	return &eventHub[E]{kind: kind, slots: slots, watchers: map[*watcher[E]]struct{}{},
		history: eventRing[E]{kind: &kind, maxEvents: historyEvents, maxBytes: historyBytes}}
}

// add registers a watcher of prefix. A non-zero start is the first
// revision it wants: the events from start to the last published one are
// queued for it first, from the history, in the same step, so that none is
// missed or sent twice; a start older than the history is refused with
// ErrCompacted. It returns the revision up to which every event was
// published: the watcher gets every event after it.
func (h *eventHub[E]) add(prefix string, start uint64) (*watcher[E], uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if oldest := h.history.floor; start > 0 && start < oldest {
		return nil, 0, fmt.Errorf("%w: revision %d is no longer kept; the oldest this node keeps is %d; %s", fence.ErrCompacted, start, oldest, h.kind.relist)
	}
	if err := h.slots.take(); err != nil {
		return nil, 0, err
	}
	w := &watcher[E]{prefix: prefix, start: start, ch: make(chan []E, watchBuffer), ended: make(chan struct{})}
	var past []E
	if start > 0 && start <= h.lastRev {
		h.history.each(func(ev E) {
			if h.wants(w, ev) {
				past = append(past, ev)
			}
		})
	}
	if len(past) > 0 {
		w.ch <- past
	}
	h.watchers[w] = struct{}{}
	return w, h.lastRev, nil
}

// position returns the revision up to which every event was published.
func (h *eventHub[E]) position() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastRev
}

// reset forgets the history: the events up to rev are no longer known
// (the state was replaced by a snapshot that stands for them), and the
// next one will be after it. It ends every watcher with err.
func (h *eventHub[E]) reset(rev uint64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history.clear(rev + 1)
	h.lastRev = rev
	for w := range h.watchers {
		w.end(err)
	}
}

// wants reports whether ev is one the watcher asked for.
func (h *eventHub[E]) wants(w *watcher[E], ev E) bool {
	return strings.HasPrefix(h.kind.name(ev), w.prefix) && h.kind.revision(ev) >= w.start
}

// end drops the watcher with err; the hub's mutex must be held.
func (w *watcher[E]) end(err error) {
	if w.endErr == nil {
		w.endErr = err
		close(w.ended)
	}
}

// count returns the number of watches open.
func (h *eventHub[E]) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers)
}

func (h *eventHub[E]) remove(w *watcher[E]) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
		h.slots.give()
	}
}

// publish hands events, in revision order, to the watchers that want
// them, and notes that every event up to through is published.
func (h *eventHub[E]) publish(events []E, through uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastRev = max(h.lastRev, through)
	if len(events) == 0 {
		return
	}
	for _, ev := range events {
		h.history.push(ev)
	}
	for w := range h.watchers {
		if w.endErr != nil {
			continue
		}
		var mine []E
		for _, ev := range events {
			if h.wants(w, ev) {
				mine = append(mine, ev)
			}
		}
		if len(mine) == 0 {
			continue
		}
		select {
		case w.ch <- mine:
		default:
			w.end(fmt.Errorf("%w: the watcher fell more than %d %s behind; read again and watch again", fence.ErrLimit, watchBuffer, h.kind.what))
		}
	}
}

// eventRing keeps the most recent events, at most maxEvents of them and
// about maxBytes, in revision order.
type eventRing[E any] struct {
	kind                *eventKind[E]
	maxEvents, maxBytes int
	events              []E // a circular buffer, oldest at head
	head, n, bytes      int
	// floor is the oldest revision from which on every event pushed is
	// still kept.
	floor uint64
}

func (r *eventRing[E]) push(ev E) {
	if r.maxEvents <= 0 {
		r.floor = r.kind.revision(ev) + 1
		return
	}
	if r.events == nil {
		r.events = make([]E, r.maxEvents)
	}
	if r.n == r.maxEvents {
		r.dropOldest()
	}
	r.events[(r.head+r.n)%r.maxEvents] = ev
	r.n++
	r.bytes += r.kind.size(ev)
	for r.n > 1 && r.bytes > r.maxBytes {
		r.dropOldest()
	}
}

func (r *eventRing[E]) dropOldest() {
	old := r.events[r.head]
	r.floor = r.kind.revision(old) + 1
	r.bytes -= r.kind.size(old)
	var zero E
	r.events[r.head] = zero
	r.head = (r.head + 1) % r.maxEvents
	r.n--
}

// clear forgets every event; the next kept one is from floor on.
func (r *eventRing[E]) clear(floor uint64) {
	clear(r.events)
	r.head, r.n, r.bytes = 0, 0, 0
	r.floor = floor
}

// each calls fn on the kept events, oldest first.
func (r *eventRing[E]) each(fn func(E)) {
	for i := range r.n {
		fn(r.events[(r.head+i)%r.maxEvents])
	}
}

// progressInterval checks a watch's progress_interval: unset for none, at
// least 100ms.
func progressInterval(d *durationpb.Duration) (time.Duration, error) {
	interval, err := duration("progress_interval", d, 0)
	if err != nil {
		return 0, err
	}
	if interval != 0 && interval < 100*time.Millisecond {
		return 0, invalid("progress_interval %v is below 100ms", interval)
	}
	return interval, nil
}

// watchRequest is what a watch asks for, of the KV store or of locks.
type watchRequest struct {
	prefix    string
	maxPrefix int    // the longest prefix allowed, in bytes
	start     uint64 // the revision to replay from; 0 for now
	progress  *durationpb.Duration
}

// runWatch serves one watch: it checks the request, waits until this node
// has caught up (a node still replaying its log would send old events as
// new), opens the watch on h, tells the client at once that it is in place
// and as of when (out.start), and sends its events until it ends.
func runWatch[E any](ctx context.Context, s *Server, h *eventHub[E], req watchRequest, out watchSender[E]) error {
	if err := checkText("prefix", req.prefix, req.maxPrefix, false); err != nil {
		return err
	}
	interval, err := progressInterval(req.progress)
	if err != nil {
		return err
	}
	if err := s.read(ctx, false); err != nil {
		return err
	}
	w, rev, err := h.add(req.prefix, req.start)
	if err != nil {
		return err
	}
	defer h.remove(w)
	if err := out.start(rev); err != nil {
		return err
	}
	return serveWatch(ctx, s, h, w, interval, out)
}

// watchSender is what one kind of watch sends on its stream.
type watchSender[E any] struct {
	// start sends the first message: the watch is in place as of rev.
	start func(rev uint64) error
	// events sends events, as many messages as it takes.
	events func([]E) error
	// progress sends a message that says nothing was sent for the
	// progress interval, and that every event up to rev was.
	progress func(rev uint64) error
}

// serveWatch sends w's events on its stream until the watch ends: its
// caller goes away or may no longer read, the node shuts down, or the
// hub drops it (ending it with why). interval (0: none) is how long the
// stream may stay silent before a progress message. The caller has sent
// the first message, and removes w from h when it returns.
//
// A watch lasts only as long as its caller may read: it ends once a check
// at an auth change or at its token's expiry fails (auth.Lost), and its
// caller is checked again before each send, so that nothing committed
// after a revocation is sent, whichever the select took first, and
// however long the send before it waited for the client.
func serveWatch[E any](ctx context.Context, s *Server, h *eventHub[E], w *watcher[E], interval time.Duration, out watchSender[E]) error {
	var progress <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		progress = t.C
	}
	auth := s.watchAuth(ctx)
	defer auth.Stop()
	send := func(events []E) error {
		if err := auth.Check(); err != nil {
			return fmt.Errorf("the watch ended: %w", err)
		}
		return out.events(events)
	}
	for {
		select {
		case <-auth.Lost():
			return fmt.Errorf("the watch ended: %w", auth.Err())
		case <-progress:
			// Every event up to rev is in w.ch by now: send them first,
			// so that the progress message does not run ahead of them.
			rev := h.position()
			for queued := true; queued; {
				select {
				case events := <-w.ch:
					if err := send(events); err != nil {
						return err
					}
				default:
					queued = false
				}
			}
			if err := auth.Check(); err != nil {
				return fmt.Errorf("the watch ended: %w", err)
			}
			if err := out.progress(rev); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
		case <-w.ended:
			return w.endErr
		case events := <-w.ch:
			if err := send(events); err != nil {
				return err
			}
		}
	}
}

// inMessages sends events in chunks of about watchMessageBytes, below
// gRPC's usual 4 MiB limit: a replay from the history can be large. The
// events of one revision (a txn's changes) go in one message, so that a
// client that resumes after the last revision it saw misses none of them.
func inMessages[E any](events []E, kind *eventKind[E], send func([]E) error) error {
	from, bytes := 0, 0
	for i, ev := range events {
		bytes += kind.size(ev)
		if i < len(events)-1 && (bytes < watchMessageBytes || kind.revision(events[i+1]) == kind.revision(ev)) {
			continue
		}
		if err := send(events[from : i+1]); err != nil {
			return err
		}
		from, bytes = i+1, 0
	}
	return nil
}
