package server

import (
	"context"

	"connectrpc.com/connect"

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
	if r, ok := res.Repeat(); ok {
		return &fencev1.PutResponse{Revision: r.Revision}, nil
	}
	return &fencev1.PutResponse{Revision: res.KV().Revision}, nil
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
	if r, ok := res.Repeat(); ok {
		return &fencev1.DeleteResponse{Deleted: r.Changed, Revision: r.Revision}, nil
	}
	a := res.KV()
	return &fencev1.DeleteResponse{Deleted: a.Changed, Revision: a.Revision}, nil
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
func (s handlers) List(ctx context.Context, req *connect.Request[fencev1.ListRequest]) (*connect.Response[fencev1.ListResponse], error) {
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
func (s handlers) Watch(ctx context.Context, req *connect.Request[fencev1.WatchRequest], stream *connect.ServerStream[fencev1.WatchResponse]) error {
	m := req.Msg
	return runWatch(ctx, s.Server, s.watches, watchRequest{m.GetPrefix(), s.cfg.MaxKeyBytes, m.GetStartRevision(), m.GetProgressInterval()}, watchSender[fsm.KVEvent]{
		start: func(rev uint64) error { return stream.Send(&fencev1.WatchResponse{Revision: rev}) },
		events: func(events []fsm.KVEvent) error {
			return inMessages(events, &kvEvents, func(events []fsm.KVEvent) error {
				resp := &fencev1.WatchResponse{}
				for _, ev := range events {
					typ := fencev1.EventType_EVENT_TYPE_PUT
					if ev.Deleted {
						typ = fencev1.EventType_EVENT_TYPE_DELETE
					}
					resp.Events = append(resp.Events, &fencev1.Event{Type: typ, Kv: apiKV(ev.KV)})
				}
				return stream.Send(resp)
			})
		},
		progress: func(uint64) error { return stream.Send(&fencev1.WatchResponse{Progress: true}) },
	})
}

func apiKV(kv fsm.KeyValue) *fencev1.KeyValue {
	return &fencev1.KeyValue{
		Key: kv.Key, Value: kv.Value, Token: kv.Token, Lock: kv.Lock, HighestToken: kv.HighestToken,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version,
		SessionId: kv.Session,
	}
}

// kvEvents are the KV store's changes, as its watches follow them: every
// change has a revision of its own, one above the one before, but for a
// txn's changes, which share one.
var kvEvents = eventKind[fsm.KVEvent]{
	what:     "changes",
	revision: func(ev fsm.KVEvent) uint64 { return ev.KV.ModRevision },
	name:     func(ev fsm.KVEvent) string { return ev.KV.Key },
	size:     func(ev fsm.KVEvent) int { return len(ev.KV.Key) + len(ev.KV.Value) + len(ev.KV.Lock) + 64 },
	relist:   "list again and watch from the list's revision + 1",
}
