package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// maxList bounds the keys one List returns.
const maxList = 1000

func (s *Server) checkKey(key string) error {
	return checkText("key", key, s.cfg.MaxKeyBytes, true)
}

// kvFence validates a write's fence and converts it for the state machine.
func (s *Server) kvFence(f *fencev1.Fence) (*fsmpb.KVFence, error) {
	if f.GetLock() != "" {
		if err := s.checkLockName(f.GetLock()); err != nil {
			return nil, err
		}
	}
	switch {
	case f.GetStrict() && (f.GetLock() == "" || f.GetToken() == 0):
		return nil, invalid("a strict write needs fence.lock and fence.token")
	case f.GetToken() != 0 && f.GetLock() == "":
		return nil, invalid("a fenced write names the lock its token was granted for (fence.lock)")
	}
	out := &fsmpb.KVFence{Lock: f.GetLock(), Token: f.GetToken(), Strict: f.GetStrict()}
	if f != nil { // a JSON request may leave the fence out
		out.ExpectRevision = f.ExpectRevision
	}
	return out, nil
}

// Put implements fencev1connect.KVServiceHandler.
func (s *Server) Put(ctx context.Context, req *connect.Request[fencev1.PutRequest]) (*connect.Response[fencev1.PutResponse], error) {
	return respond(s.put(ctx, req.Msg, req.Header().Get(fencev1.IdempotencyKeyHeader)))
}

// put is Put with the call's idempotency key ("" for none).
func (s *Server) put(ctx context.Context, m *fencev1.PutRequest, idempotencyKey string) (*fencev1.PutResponse, error) {
	if err := s.checkKey(m.GetKey()); err != nil {
		return nil, err
	}
	if len(m.GetValue()) > s.cfg.MaxValueBytes {
		return nil, invalid("value is %d bytes, over the limit of %d", len(m.GetValue()), s.cfg.MaxValueBytes)
	}
	f, err := s.kvFence(m.GetFence())
	if err != nil {
		return nil, err
	}
	key, err := checkIdempotencyKey(idempotencyKey)
	if err != nil {
		return nil, err
	}
	if id := m.GetSessionId(); id != 0 {
		// Binding a key to a session acts as the session.
		if err := s.authorizeSession(id, m.GetSessionSecret()); err != nil {
			return nil, err
		}
	}
	res, err := s.apply(&fsmpb.Command{IdempotencyKey: key, Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{
		Key: m.GetKey(), Value: m.GetValue(), Fence: f, MaxKeys: uint64(s.cfg.MaxKeys), SessionId: m.GetSessionId(),
		User: s.callerUser(ctx), // charged the key's bytes (quotas)
	}}})
	if err != nil {
		return nil, err
	}
	rev := res.Revision
	if res.Repeat != nil {
		rev = res.Repeat.Revision
	}
	return &fencev1.PutResponse{Revision: rev}, nil
}

// Delete implements fencev1connect.KVServiceHandler.
func (s *Server) Delete(ctx context.Context, req *connect.Request[fencev1.DeleteRequest]) (*connect.Response[fencev1.DeleteResponse], error) {
	return respond(s.delete(ctx, req.Msg, req.Header().Get(fencev1.IdempotencyKeyHeader)))
}

// delete is Delete with the call's idempotency key ("" for none).
func (s *Server) delete(_ context.Context, m *fencev1.DeleteRequest, idempotencyKey string) (*fencev1.DeleteResponse, error) {
	if err := s.checkKey(m.GetKey()); err != nil {
		return nil, err
	}
	f, err := s.kvFence(m.GetFence())
	if err != nil {
		return nil, err
	}
	key, err := checkIdempotencyKey(idempotencyKey)
	if err != nil {
		return nil, err
	}
	res, err := s.apply(&fsmpb.Command{IdempotencyKey: key, Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: m.GetKey(), Fence: f}}})
	if err != nil {
		return nil, err
	}
	if r := res.Repeat; r != nil {
		return &fencev1.DeleteResponse{Deleted: r.Changed, Revision: r.Revision}, nil
	}
	return &fencev1.DeleteResponse{Deleted: len(res.Events) > 0, Revision: res.Revision}, nil
}

// Get implements fencev1connect.KVServiceHandler.
func (s *Server) Get(ctx context.Context, req *connect.Request[fencev1.GetRequest]) (*connect.Response[fencev1.GetResponse], error) {
	return respond(s.get(ctx, req.Msg))
}

func (s *Server) get(ctx context.Context, m *fencev1.GetRequest) (*fencev1.GetResponse, error) {
	if err := s.checkKey(m.GetKey()); err != nil {
		return nil, err
	}
	if err := s.read(ctx, m.GetStale()); err != nil {
		return nil, err
	}
	out := &fencev1.GetResponse{}
	s.fsm.Read(func(st *fsm.State) {
		out.Revision = st.KVRevision()
		if kv, ok := st.Get(m.GetKey()); ok {
			out.Found, out.Kv = true, apiKV(kv)
		}
	})
	return out, nil
}

// List implements fencev1connect.KVServiceHandler.
func (s *Server) List(ctx context.Context, req *connect.Request[fencev1.ListRequest]) (*connect.Response[fencev1.ListResponse], error) {
	m := req.Msg
	if err := checkText("prefix", m.GetPrefix(), s.cfg.MaxKeyBytes, false); err != nil {
		return nil, err
	}
	limit := int(m.GetLimit())
	if limit == 0 || limit > maxList {
		limit = maxList
	}
	if err := s.read(ctx, m.GetStale()); err != nil {
		return nil, err
	}
	out := &fencev1.ListResponse{}
	s.fsm.Read(func(st *fsm.State) {
		out.Revision = st.KVRevision()
		kvs, more := st.List(m.GetPrefix(), limit)
		out.More = more
		for _, kv := range kvs {
			out.Kvs = append(out.Kvs, apiKV(kv))
		}
	})
	return connect.NewResponse(out), nil
}

// Watch implements fencev1connect.KVServiceHandler. With start_revision it
// first replays the changes from that revision on, from the node's history
// of recent changes, so that a client can list at revision R and watch
// from R+1, or resume a broken watch, without a gap; a revision older than
// the history is refused with FailedPrecondition (REVISION_COMPACTED). A
// watcher that falls more than a buffer behind is ended with
// ResourceExhausted; it should re-read and watch again.
func (s *Server) Watch(ctx context.Context, req *connect.Request[fencev1.WatchRequest], stream *connect.ServerStream[fencev1.WatchResponse]) error {
	if err := checkText("prefix", req.Msg.GetPrefix(), s.cfg.MaxKeyBytes, false); err != nil {
		return err
	}
	interval, err := duration("progress_interval", req.Msg.GetProgressInterval(), 0)
	if err != nil {
		return err
	}
	if interval != 0 && interval < 100*time.Millisecond {
		return invalid("progress_interval %v is below 100ms", interval)
	}
	// A node that is still replaying its log would send old changes as new.
	if err := s.read(ctx, false); err != nil {
		return err
	}
	w, rev, err := s.watches.add(req.Msg.GetPrefix(), req.Msg.GetStartRevision(), s.cfg.MaxWatchers)
	if err != nil {
		return err
	}
	defer s.watches.remove(w)
	// Tell the client at once that the watch is in place, and as of when.
	if err := stream.Send(&fencev1.WatchResponse{Revision: rev}); err != nil {
		return err
	}
	var progress <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		progress = t.C
	}
	// A watch lasts only as long as its caller may read: it ends once a
	// check at an auth change or at its token's expiry fails (auth.Lost),
	// and its caller is checked again before each send, so that nothing
	// committed after a revocation is sent, whichever the select took
	// first, and however long the send before it waited for the client.
	auth := s.watchAuth(ctx)
	defer auth.Stop()
	for {
		select {
		case <-auth.Lost():
			return fmt.Errorf("the watch ended: %w", auth.Err())
		case <-progress:
			if err := auth.Check(); err != nil {
				return fmt.Errorf("the watch ended: %w", err)
			}
			if err := stream.Send(&fencev1.WatchResponse{Progress: true}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
		case <-w.ended:
			return w.endErr
		case events := <-w.ch:
			if err := auth.Check(); err != nil {
				return fmt.Errorf("the watch ended: %w", err)
			}
			// A replay from the history can be large: send it in messages
			// of about watchMessageBytes, below gRPC's usual 4 MiB limit.
			resp, size := &fencev1.WatchResponse{}, 0
			for i, ev := range events {
				typ := fencev1.EventType_EVENT_TYPE_PUT
				if ev.Deleted {
					typ = fencev1.EventType_EVENT_TYPE_DELETE
				}
				resp.Events = append(resp.Events, &fencev1.Event{Type: typ, Kv: apiKV(ev.KV)})
				size += eventSize(ev)
				// A txn's changes share a revision: they go in one
				// message, so that a client that resumes after the last
				// revision it saw misses none of them.
				if i < len(events)-1 && (size < watchMessageBytes || events[i+1].KV.ModRevision == ev.KV.ModRevision) {
					continue
				}
				if err := stream.Send(resp); err != nil {
					return err
				}
				resp, size = &fencev1.WatchResponse{}, 0
			}
		}
	}
}

func apiKV(kv fsm.KeyValue) *fencev1.KeyValue {
	return &fencev1.KeyValue{
		Key: kv.Key, Value: kv.Value, Token: kv.Token, Lock: kv.Lock, HighestToken: kv.HighestToken,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version,
		SessionId: kv.Session,
	}
}

// watchBuffer is how many batches of changes a watcher may fall behind.
const watchBuffer = 1024

// watchHistoryBytes bounds the memory of the watch history.
const watchHistoryBytes = 64 << 20

// watchMessageBytes is about the most a watch message carries.
const watchMessageBytes = 1 << 20

type watcher struct {
	prefix string
	start  uint64 // the first revision it wants; 0 for any
	ch     chan []fsm.KVEvent
	ended  chan struct{} // closed, with endErr set, when the hub drops the watcher
	endErr error
}

// watchHub fans committed KV changes out to watchers, in commit order,
// without ever blocking the apply loop, and keeps the most recent changes
// for watches that start at a past revision.
type watchHub struct {
	mu       sync.Mutex
	watchers map[*watcher]struct{}
	history  eventRing
	// lastRev is the revision of the last change published: the store's
	// revision, as far as watchers know.
	lastRev uint64
}

func newWatchHub(historyEvents, historyBytes int) *watchHub {
	return &watchHub{watchers: map[*watcher]struct{}{}, history: eventRing{maxEvents: historyEvents, maxBytes: historyBytes}}
}

// add registers a watcher of prefix. A non-zero start is the first
// revision it wants: the changes from start to the last published one are
// queued for it first, from the history, in the same step, so that none is
// missed or sent twice. It returns the revision of the last change
// published: the watcher gets every change after it.
func (h *watchHub) add(prefix string, start uint64, limit int) (*watcher, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if limit > 0 && len(h.watchers) >= limit {
		return nil, 0, fmt.Errorf("%w: the node already has %d watchers, its limit", fence.ErrLimit, len(h.watchers))
	}
	w := &watcher{prefix: prefix, start: start, ch: make(chan []fsm.KVEvent, watchBuffer), ended: make(chan struct{})}
	var past []fsm.KVEvent
	if start > 0 && start <= h.lastRev {
		if oldest := h.history.oldestRevision(h.lastRev); start < oldest {
			return nil, 0, fmt.Errorf("%w: revision %d is no longer kept; the oldest this node keeps is %d; list again and watch from the list's revision + 1", fence.ErrCompacted, start, oldest)
		}
		h.history.each(func(ev fsm.KVEvent) {
			if w.wants(ev) {
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

// reset forgets the history after the state was replaced by a snapshot at
// store revision rev.
func (h *watchHub) reset(rev uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history.clear()
	h.lastRev = rev
	// The watchers' streams would jump over the changes the snapshot
	// stands for: end them, so that clients resume (and learn that the
	// changes are compacted) rather than miss them unawares.
	for w := range h.watchers {
		w.end(fmt.Errorf("%w: the node's state was replaced by a snapshot; watch again from the last revision seen", fence.ErrUnavailable))
	}
}

// wants reports whether the change is one the watcher asked for.
func (w *watcher) wants(ev fsm.KVEvent) bool {
	return strings.HasPrefix(ev.KV.Key, w.prefix) && ev.KV.ModRevision >= w.start
}

// end drops the watcher with err; the hub's mutex must be held.
func (w *watcher) end(err error) {
	if w.endErr == nil {
		w.endErr = err
		close(w.ended)
	}
}

// count returns the number of watches open.
func (h *watchHub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers)
}

func (h *watchHub) remove(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers, w)
}

func (h *watchHub) publish(events []fsm.KVEvent) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range events {
		h.history.push(ev)
	}
	h.lastRev = events[len(events)-1].KV.ModRevision
	for w := range h.watchers {
		if w.endErr != nil {
			continue
		}
		var mine []fsm.KVEvent
		for _, ev := range events {
			if w.wants(ev) {
				mine = append(mine, ev)
			}
		}
		if len(mine) == 0 {
			continue
		}
		select {
		case w.ch <- mine:
		default:
			w.end(fmt.Errorf("%w: the watcher fell more than %d changes behind; read again and watch again", fence.ErrLimit, watchBuffer))
		}
	}
}

// eventRing keeps the most recent KV changes, at most maxEvents of them and
// about maxBytes of keys and values. Revisions go up by one from a change
// to the next but for a txn's changes, which share one; so the ring covers
// a contiguous range of revisions that ends at the store's, and may begin
// with part of a txn's changes, a revision it no longer keeps whole.
type eventRing struct {
	maxEvents, maxBytes int
	events              []fsm.KVEvent // a circular buffer, oldest at head
	head, n, bytes      int
	// droppedRev is the revision of the last change dropped, 0 for none.
	droppedRev uint64
}

func eventSize(ev fsm.KVEvent) int { return len(ev.KV.Key) + len(ev.KV.Value) + len(ev.KV.Lock) + 64 }

func (r *eventRing) push(ev fsm.KVEvent) {
	if r.maxEvents <= 0 {
		return
	}
	if r.events == nil {
		r.events = make([]fsm.KVEvent, r.maxEvents)
	}
	if r.n == r.maxEvents {
		r.dropOldest()
	}
	r.events[(r.head+r.n)%r.maxEvents] = ev
	r.n++
	r.bytes += eventSize(ev)
	for r.n > 1 && r.bytes > r.maxBytes {
		r.dropOldest()
	}
}

func (r *eventRing) dropOldest() {
	r.droppedRev = r.events[r.head].KV.ModRevision
	r.bytes -= eventSize(r.events[r.head])
	r.events[r.head] = fsm.KVEvent{}
	r.head = (r.head + 1) % r.maxEvents
	r.n--
}

func (r *eventRing) clear() {
	clear(r.events)
	r.head, r.n, r.bytes, r.droppedRev = 0, 0, 0, 0
}

// oldestRevision is the oldest revision a watch may start at, given the
// store's revision last: that of the oldest kept change, or the one after
// it if a change of that revision was dropped, or last+1 when none is kept.
func (r *eventRing) oldestRevision(last uint64) uint64 {
	if r.n == 0 {
		return last + 1
	}
	if rev := r.events[r.head].KV.ModRevision; rev != r.droppedRev {
		return rev
	}
	return min(r.events[r.head].KV.ModRevision+1, last+1)
}

// each calls fn on the kept changes, oldest first.
func (r *eventRing) each(fn func(fsm.KVEvent)) {
	for i := range r.n {
		fn(r.events[(r.head+i)%r.maxEvents])
	}
}
