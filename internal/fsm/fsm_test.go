// Tests of the raft adapter FSM with real raft.Log values and real raft
// snapshot stores. They prove that ApplyBatch applies command entries in
// order, answers nil for other entry types, fails an entry that does not
// decode alone (ErrInvalidArgument, nothing changed) while its neighbours
// apply; that the Observer hears of every command entry, in log order,
// after it was applied, and may Read from inside Applied; that a snapshot
// persisted through raft's FileSnapshotStore and InmemSnapshotStore and
// restored into a new FSM gives the same state and the same future; that a
// bad snapshot is refused and leaves the state alone; and, under -race, that
// reads and snapshots may run alongside applies.
package fsm_test

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// recorder is an Observer that records what it is told. It reads the state
// from inside Applied, as the Observer contract allows.
type recorder struct {
	fsm *fsm.FSM

	mu        sync.Mutex
	indexes   []uint64
	seqs      []fsm.Seq
	effects   []fsm.Effects
	lastToken []uint64
	restored  int
	halted    []error
}

func (r *recorder) Applied(seq fsm.Seq, eff fsm.Effects) {
	var token uint64
	r.fsm.Read(func(s *fsm.State) { token = s.LastToken() })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.indexes = append(r.indexes, seq.Index())
	r.seqs = append(r.seqs, seq)
	r.effects = append(r.effects, eff)
	r.lastToken = append(r.lastToken, token)
}

func (r *recorder) Restored() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored++
}

func (r *recorder) Halted(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.halted = append(r.halted, err)
}

func newRecordedFSM() (*fsm.FSM, *recorder) {
	rec := &recorder{}
	f := fsm.New(rec)
	rec.fsm = f
	return f, rec
}

func mustEncode(t testing.TB, cmd *fsmpb.Command) []byte {
	t.Helper()
	data, err := fsm.Encode(cmd)
	if err != nil {
		t.Fatalf("Encode(%v): %v", cmd, err)
	}
	return data
}

func commandLog(t testing.TB, index uint64, cmd *fsmpb.Command) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: mustEncode(t, cmd), AppendedAt: time.Unix(0, 0)}
}

func fsmSnapshot(t testing.TB, f *fsm.FSM) *fsmpb.Snapshot {
	var snap *fsmpb.Snapshot
	f.Read(func(s *fsm.State) {
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("FSM state: %v", err)
		}
		snap = s.Snapshot()
	})
	return snap
}

// TestFSMApplyBatch applies a batch mixing commands, a configuration entry,
// a no-op, a barrier and an entry that does not decode, and checks every
// answer and what the observer heard.
func TestFSMApplyBatch(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff}
	if err := proto.Unmarshal(garbage, &fsmpb.Command{}); err == nil {
		t.Fatal("the garbage entry decodes; the test needs one that does not")
	}
	f, rec := newRecordedFSM()
	logs := []*raft.Log{
		commandLog(t, 1, newSession()),
		{Index: 2, Term: 1, Type: raft.LogConfiguration, Data: []byte("a configuration, not a command")},
		{Index: 3, Term: 1, Type: raft.LogCommand, Data: garbage},
		commandLog(t, 4, acquire(1, "a", excl)),
		{Index: 5, Term: 2, Type: raft.LogNoop},
		commandLog(t, 6, newSession()),
		commandLog(t, 7, acquire(2, "a", excl)),
		{Index: 8, Term: 2, Type: raft.LogBarrier},
		commandLog(t, 9, release(1, "a", 1)),
	}
	out := f.ApplyBatch(logs)
	if len(out) != len(logs) {
		t.Fatalf("ApplyBatch returned %d results for %d entries", len(out), len(logs))
	}
	want := map[int]fsm.Result{
		0: sessionMade(1),
		2: fails(fence.ErrInvalidArgument),
		3: granted(1, "a", 1, excl),
		5: sessionMade(2),
		6: queued(),
		8: handedTo(grant(2, "a", 2, excl)),
	}
	for i, o := range out {
		w, isCommand := want[i]
		if !isCommand {
			if o != nil {
				t.Fatalf("entry %d (%s) answered %v, want nil", i, logs[i].Type, o)
			}
			continue
		}
		res, ok := o.(fsm.Result)
		if !ok {
			t.Fatalf("entry %d answered %T, want fsm.Result", i, o)
		}
		if !sameResult(res, w) {
			t.Fatalf("entry %d answered %s, want %s", i, describe(res), describe(w))
		}
	}

	if want := []uint64{1, 3, 4, 6, 7, 9}; !reflect.DeepEqual(rec.indexes, want) {
		t.Fatalf("observer heard indexes %v, want %v", rec.indexes, want)
	}
	var made uint64
	for i, idx := range rec.indexes {
		if !reflect.DeepEqual(rec.effects[i], out[idx-1].(fsm.Result).Effects) {
			t.Fatalf("observer heard %+v for index %d, ApplyBatch answered %v", rec.effects[i], idx, out[idx-1])
		}
		// Applied comes after the entry was applied: a Read from inside it
		// sees the entry's grants.
		for _, g := range rec.effects[i].Grants {
			made = max(made, g.Token)
		}
		if rec.lastToken[i] < made {
			t.Fatalf("observer read LastToken %d at index %d, before the entry's grant of token %d", rec.lastToken[i], idx, made)
		}
	}

	res, ok := f.Apply(commandLog(t, 10, acquire(1, "b", shared))).(fsm.Result)
	if !ok || !sameResult(res, granted(1, "b", 3, shared)) {
		t.Fatalf("Apply answered %v", res)
	}
	if got := rec.indexes[len(rec.indexes)-1]; got != 10 {
		t.Fatalf("observer last heard index %d, want 10", got)
	}
	f.Read(func(s *fsm.State) {
		want := []fsm.LockInfo{
			{Name: "a", Holders: []fsm.HolderInfo{holding(2, 2, excl)}},
			{Name: "b", Holders: []fsm.HolderInfo{holding(1, 3, shared)}},
		}
		if got := s.Locks(""); !reflect.DeepEqual(got, want) {
			t.Fatalf("Locks: %+v, want %+v", got, want)
		}
	})
}

// TestFSMUndecodableEntryChangesNothing shows the failing entry is
// isolated: the state after [good, garbage, good] equals the state after
// [good, good].
func TestFSMUndecodableEntryChangesNothing(t *testing.T) {
	with, without := fsm.New(nil), fsm.New(nil)
	a, b := commandLog(t, 1, newSession()), commandLog(t, 3, acquire(1, "a", excl))
	with.ApplyBatch([]*raft.Log{a, {Index: 2, Type: raft.LogCommand, Data: []byte{0x0a, 0x05, 0x08}}, b})
	without.ApplyBatch([]*raft.Log{a, b})
	if !proto.Equal(fsmSnapshot(t, with), fsmSnapshot(t, without)) {
		t.Fatal("an entry that does not decode changed the state")
	}
}

// TestFSMObserverOrderAcrossBatches proves the observer hears every command
// once, in log order, across batches of different sizes.
func TestFSMObserverOrderAcrossBatches(t *testing.T) {
	f, rec := newRecordedFSM()
	var index uint64
	var want []fsm.Seq
	for batch := range 5 {
		var logs []*raft.Log
		for range batch + 1 {
			index++
			logs = append(logs, commandLog(t, index, newSession()))
			want = append(want, fsm.SeqOf(index, 0))
		}
		f.ApplyBatch(logs)
	}
	if !reflect.DeepEqual(rec.seqs, want) {
		t.Fatalf("observer heard %v, want %v", rec.seqs, want)
	}
	for i, eff := range rec.effects {
		if eff.Created != uint64(i+1) {
			t.Fatalf("observer heard session %d at position %d", eff.Created, i)
		}
	}
}

// TestFSMWithoutObserver proves a nil observer is allowed.
func TestFSMWithoutObserver(t *testing.T) {
	f := fsm.New(nil)
	if res := f.Apply(commandLog(t, 1, newSession())).(fsm.Result); res.CreateSession().SessionID != 1 {
		t.Fatalf("Apply answered %s", describe(res))
	}
	if err := f.Restore(io.NopCloser(bytes.NewReader(nil))); err != nil {
		t.Fatalf("Restore of an empty snapshot: %v", err)
	}
}

// TestFSMSnapshotRestore persists a snapshot through real raft snapshot
// stores, restores it into another FSM, and proves both states and their
// answers to the same later entries are equal.
func TestFSMSnapshotRestore(t *testing.T) {
	stores := map[string]func(t *testing.T) raft.SnapshotStore{
		"file": func(t *testing.T) raft.SnapshotStore {
			store, err := raft.NewFileSnapshotStore(t.TempDir(), 2, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			return store
		},
		"inmem": func(t *testing.T) raft.SnapshotStore { return raft.NewInmemSnapshotStore() },
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			var prefix, suffix []*raft.Log
			for i, cmd := range richScript() {
				prefix = append(prefix, commandLog(t, uint64(i+1), cmd))
			}
			for i, cmd := range followUp() {
				suffix = append(suffix, commandLog(t, uint64(len(prefix)+i+1), cmd))
			}

			src := fsm.New(nil)
			src.ApplyBatch(prefix)
			want := fsmSnapshot(t, src)
			snap, err := src.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			// raft persists while applying goes on: what is persisted must be
			// the state at Snapshot time.
			srcOut := src.ApplyBatch(suffix)

			addr, trans := raft.NewInmemTransport("")
			defer trans.Close()
			config := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: addr}}}
			sink, err := store.Create(raft.SnapshotVersionMax, uint64(len(prefix)), 1, config, 1, trans)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Persist(sink); err != nil {
				t.Fatalf("Persist: %v", err)
			}
			snap.Release()

			metas, err := store.List()
			if err != nil || len(metas) != 1 {
				t.Fatalf("List: %v, %v", metas, err)
			}
			meta, rc, err := store.Open(metas[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Index != uint64(len(prefix)) || meta.Size == 0 {
				t.Fatalf("snapshot meta %+v", meta)
			}
			dst, rec := newRecordedFSM()
			dst.ApplyBatch([]*raft.Log{commandLog(t, 1, newSession())}) // replaced by Restore
			if err := dst.Restore(rc); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if rec.restored != 1 {
				t.Fatalf("observer heard Restored %d times", rec.restored)
			}
			if got := fsmSnapshot(t, dst); !proto.Equal(got, want) {
				t.Fatalf("restored state:\n got %v\nwant %v", got, want)
			}

			dstOut := dst.ApplyBatch(suffix)
			for i := range suffix {
				if !reflect.DeepEqual(cmpForm(dstOut[i].(fsm.Result)), cmpForm(srcOut[i].(fsm.Result))) {
					t.Fatalf("entry %d: restored FSM answered %v, original %v", i, dstOut[i], srcOut[i])
				}
			}
			if !proto.Equal(fsmSnapshot(t, dst), fsmSnapshot(t, src)) {
				t.Fatal("restored FSM diverged from the original")
			}
		})
	}
}

// closeRecorder is a snapshot reader that records whether it was closed.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestFSMRestoreRefusesBadSnapshots proves a snapshot that does not decode
// or is inconsistent is refused, leaves the state alone, is closed, and is
// not reported to the observer.
func TestFSMRestoreRefusesBadSnapshots(t *testing.T) {
	inconsistent, err := proto.Marshal(&fsmpb.Snapshot{
		LastToken: 1, LastSessionId: 1,
		Locks: []*fsmpb.Lock{{Name: "a", Holders: []*fsmpb.Holder{{SessionId: 1, Token: 1, Mode: uint32(excl)}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	inconsistentKV, err := proto.Marshal(&fsmpb.Snapshot{
		KvRevision: 1,
		Kvs:        []*fsmpb.KV{{Key: "k", Token: 2, HighestToken: 1, CreateRevision: 1, ModRevision: 1, Version: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"garbage":         {0xff, 0xff, 0xff},
		"inconsistent":    inconsistent,
		"inconsistent KV": inconsistentKV,
	} {
		t.Run(name, func(t *testing.T) {
			f, rec := newRecordedFSM()
			f.ApplyBatch([]*raft.Log{commandLog(t, 1, newSession()), commandLog(t, 2, acquire(1, "x", excl))})
			before := fsmSnapshot(t, f)
			rc := &closeRecorder{Reader: bytes.NewReader(data)}
			if err := f.Restore(rc); err == nil {
				t.Fatal("Restore accepted a bad snapshot")
			}
			if !rc.closed {
				t.Fatal("Restore did not close the snapshot reader")
			}
			if rec.restored != 0 {
				t.Fatal("observer heard Restored after a failed restore")
			}
			if !proto.Equal(fsmSnapshot(t, f), before) {
				t.Fatal("a failed restore changed the state")
			}
		})
	}
}

// failingReader fails partway through a snapshot.
type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// TestFSMRestoreReadError proves a read error fails Restore.
func TestFSMRestoreReadError(t *testing.T) {
	f := fsm.New(nil)
	if err := f.Restore(&closeRecorder{Reader: failingReader{}}); err == nil {
		t.Fatal("Restore ignored a read error")
	}
}

// TestFSMConcurrentUse runs applies, reads and snapshot persistence at once;
// it proves nothing without -race, and that they do not race with it.
func TestFSMConcurrentUse(t *testing.T) {
	f, _ := newRecordedFSM()
	store := raft.NewInmemSnapshotStore()
	addr, trans := raft.NewInmemTransport("")
	defer trans.Close()
	config := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: addr}}}
	const rounds = 50
	batches := make([][]*raft.Log, rounds)
	for i := range uint64(rounds) {
		sid := i + 1
		batches[i] = []*raft.Log{
			commandLog(t, 3*i+1, newSession()),
			commandLog(t, 3*i+2, acquire(sid, "a", excl)),
			commandLog(t, 3*i+3, closeSession(sid)),
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for _, b := range batches {
			f.ApplyBatch(b)
		}
	}()
	go func() {
		defer wg.Done()
		for range rounds {
			f.Read(func(s *fsm.State) {
				_ = s.Locks("")
				_ = s.Sessions()
			})
		}
	}()
	go func() {
		defer wg.Done()
		for i := range uint64(rounds) {
			snap, err := f.Snapshot()
			if err != nil {
				t.Error(err)
				return
			}
			sink, err := store.Create(raft.SnapshotVersionMax, i+1, 1, config, 1, trans)
			if err != nil {
				t.Error(err)
				return
			}
			if err := snap.Persist(sink); err != nil {
				t.Error(err)
				return
			}
			snap.Release()
		}
	}()
	wg.Wait()
	f.Read(func(s *fsm.State) {
		if s.LastToken() != rounds || s.NumSessions() != 0 || s.NumLocks() != 0 {
			t.Fatalf("after %d rounds: LastToken %d, %d sessions, %d locks", rounds, s.LastToken(), s.NumSessions(), s.NumLocks())
		}
	})
}

// TestFSMStopsAtAnEntryItDoesNotUnderstand proves that an entry written by
// a newer version (a kind of command, or a field, this one does not know,
// or a protocol past its own) is neither applied nor skipped: the FSM stops
// there, applies nothing after it, tells its observer once, and takes no
// snapshot of the state it stopped with.
func TestFSMStopsAtAnEntryItDoesNotUnderstand(t *testing.T) {
	withField := func(cmd *fsmpb.Command, num protowire.Number) []byte {
		data := mustEncode(t, cmd)
		data = protowire.AppendTag(data, num, protowire.BytesType)
		return protowire.AppendBytes(data, []byte("new"))
	}
	nested := acquire(1, "a", excl)
	nested.GetAcquire().ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 40, protowire.VarintType), 1))
	batch := &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{newSession(), nested}}}}
	cases := []struct {
		name string
		data []byte
		what string
	}{
		{"a kind of command", protowire.AppendBytes(protowire.AppendTag(nil, 29, protowire.BytesType), nil), "a kind of command"},
		{"a field of a command", withField(newSession(), 50), "a command with a field"},
		{"a field of a nested message", mustEncode(t, nested), "a command with a field"},
		{"a field in a batch", mustEncode(t, batch), "a command with a field"},
		{"a newer protocol", mustEncode(t, &fsmpb.Command{Op: &fsmpb.Command_SetProtocol{SetProtocol: &fsmpb.SetProtocol{Version: fsm.Protocol + 1}}}), "a move to protocol"},
		{"a newer session end", mustEncode(t, closeSessionAs(1, fsmpb.SessionEnd(3))), "a session end (3)"},
		{"a newer session end in a batch", mustEncode(t, &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{newSession(), closeSessionAs(1, fsmpb.SessionEnd(3))}}}}), "a session end (3)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, rec := newRecordedFSM()
			ref := fsm.New(nil)
			first := commandLog(t, 1, newSession())
			ref.ApplyBatch([]*raft.Log{first})
			bad := &raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: tc.data}
			out := f.ApplyBatch([]*raft.Log{first, bad, commandLog(t, 3, newSession())})
			for i, want := range []uint64{0, 2, 2} {
				var halt *fsm.HaltError
				err := out[i].(fsm.Result).Err
				if want == 0 {
					if err != nil {
						t.Fatalf("entry %d: %v", i+1, err)
					}
					continue
				}
				if !errors.As(err, &halt) || halt.Index != want || !strings.Contains(halt.What, tc.what) || !errors.Is(err, fence.ErrUnavailable) {
					t.Fatalf("entry %d answered %v, want the halt at entry %d (%s)", i+1, err, want, tc.what)
				}
			}
			f.ApplyBatch([]*raft.Log{commandLog(t, 4, newSession())})
			if !proto.Equal(fsmSnapshot(t, f), fsmSnapshot(t, ref)) {
				t.Fatal("the state changed past the entry not understood")
			}
			if len(rec.seqs) != 1 || len(rec.halted) != 1 || f.Halted() == nil {
				t.Fatalf("observer heard %d applies and %d halts (Halted: %v), want 1 and 1", len(rec.seqs), len(rec.halted), f.Halted())
			}
			if _, err := f.Snapshot(); err == nil {
				t.Fatal("a halted FSM took a snapshot")
			}
		})
	}
}

// TestFSMProtocolOnlyRises proves SetProtocol moves the group's protocol
// up only, and that a snapshot carries it.
func TestFSMProtocolOnlyRises(t *testing.T) {
	f := fsm.New(nil)
	protocol := func() (v uint32) { f.Read(func(s *fsm.State) { v = s.Protocol() }); return v }
	if p := protocol(); p != fsm.Protocol1 {
		t.Fatalf("a new state's protocol is %d, want %d", p, fsm.Protocol1)
	}
	set := func(i uint64, v uint32) {
		f.Apply(commandLog(t, i, &fsmpb.Command{Op: &fsmpb.Command_SetProtocol{SetProtocol: &fsmpb.SetProtocol{Version: v}}}))
	}
	set(1, fsm.Protocol2)
	set(2, fsm.Protocol1)
	if p := protocol(); p != fsm.Protocol2 {
		t.Fatalf("protocol %d after a move to 2 then 1, want 2", p)
	}
	restored, err := fsm.Restore(fsmSnapshot(t, f))
	if err != nil || restored.Protocol() != fsm.Protocol2 {
		t.Fatalf("restored protocol %d (%v), want 2", restored.Protocol(), err)
	}
}
