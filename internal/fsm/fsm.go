package fsm

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Observer learns of every change to the state, in log order, on raft's
// apply goroutine: while it runs, no later entry is applied. It must not
// call back into the FSM's Apply; it may call Read. It should return
// quickly, and block only for what must happen before anyone learns of the
// change (the server's observer waits there until the token reserve covers
// a grant's token, retrying a failed write).
type Observer interface {
	// Applied is called after the command at seq was applied, with its
	// effects (none for a failed command): once for each command of a
	// Batch, in order, and never for the batch itself.
	Applied(seq Seq, eff Effects)
	// Restored is called after the state was replaced by a snapshot.
	Restored()
	// Halted is called once, when the FSM met an entry it does not
	// understand (a *HaltError) and stopped applying the log.
	Halted(err error)
}

// FSM adapts State to hashicorp/raft. It implements raft.BatchingFSM, so a
// batch of commands committed together is applied under one lock. Reads take
// a shared lock and may run alongside snapshot persistence.
type FSM struct {
	mu       sync.RWMutex
	state    *State
	observer Observer
	// halted is set once an entry was not understood: no entry after it
	// is applied, and no snapshot is taken of a state that skipped it.
	halted *HaltError
	// protocol mirrors the state's protocol, for readers that must not
	// wait for an apply.
	protocol atomic.Uint32
}

// HaltError is an entry the FSM does not understand: written by a newer
// version of fence. Skipping it would make this node's state differ from
// its group's without a word, so the FSM stops applying the log there.
type HaltError struct {
	// Index is the entry's raft log index.
	Index uint64
	// What says what in it is not understood.
	What string
}

func (e *HaltError) Error() string {
	return fmt.Sprintf("log entry %d holds %s, which this version of fence (protocol %d) does not know: the group runs a newer version. "+
		"This node stopped applying its log rather than skip the entry; start it with the group's version", e.Index, e.What, Protocol)
}

// Unwrap makes a HaltError an fence.ErrUnavailable: the node cannot serve.
func (e *HaltError) Unwrap() error { return fence.ErrUnavailable }

var _ raft.BatchingFSM = (*FSM)(nil)

// New returns an FSM with an empty state. observer may be nil.
func New(observer Observer) *FSM {
	f := &FSM{state: NewState(), observer: observer}
	f.protocol.Store(f.state.Protocol())
	return f
}

// Protocol returns the group's protocol as of the last entry applied,
// without waiting for an apply in progress.
func (f *FSM) Protocol() uint32 { return f.protocol.Load() }

// Encode marshals a command for raft.Apply.
func Encode(cmd *fsmpb.Command) ([]byte, error) {
	return proto.Marshal(cmd)
}

// Apply applies one log entry and returns its Result.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed log entries in order. Entries that are not
// commands (configuration changes) get a nil result. An entry that does not
// decode fails alone with ErrInvalidArgument and changes nothing.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	results := make([]Result, len(logs))
	applied := len(logs) // entries from here on were not applied
	wasHalted := f.halted != nil
	f.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		var cmd fsmpb.Command
		switch err := proto.Unmarshal(l.Data, &cmd); {
		case f.halted != nil:
			results[i] = Result{Err: f.halted}
		case err != nil:
			results[i] = Result{Err: fmt.Errorf("%w: log entry %d does not decode: %v", fence.ErrInvalidArgument, l.Index, err)}
		default:
			if what := notUnderstood(&cmd); what != "" {
				f.halted = &HaltError{Index: l.Index, What: what}
				applied = min(applied, i)
				results[i] = Result{Err: f.halted}
				break
			}
			results[i] = f.state.Apply(&cmd)
		}
		out[i] = results[i]
	}
	halted := f.halted
	f.protocol.Store(f.state.Protocol())
	f.mu.Unlock()
	if wasHalted {
		return out
	}
	if f.observer != nil {
		for i, l := range logs[:applied] {
			if l.Type != raft.LogCommand {
				continue
			}
			batch := results[i].Batch()
			if batch == nil {
				f.observer.Applied(SeqOf(l.Index, 0), results[i].Effects)
				continue
			}
			for j, r := range batch {
				f.observer.Applied(SeqOf(l.Index, j), r.Effects)
			}
		}
		if halted != nil {
			f.observer.Halted(halted)
		}
	}
	return out
}

// Halted returns the entry that stopped the FSM, nil while it applies.
func (f *FSM) Halted() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted == nil {
		return nil
	}
	return f.halted
}

// Read calls fn with the state under a shared lock. fn must not keep the
// state or anything it points into after it returns.
func (f *FSM) Read(fn func(s *State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// Snapshot captures the state for raft; the copy is made here, under the
// lock, and written out later by Persist without it.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	if f.halted != nil {
		f.mu.RUnlock()
		return nil, fmt.Errorf("fsm: no snapshot of a state that stopped before an entry: %w", f.halted)
	}
	snap := f.state.Snapshot()
	f.mu.RUnlock()
	return &snapshot{snap: snap}, nil
}

// Restore replaces the state with one read from a snapshot.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("fsm: reading snapshot: %w", err)
	}
	var snap fsmpb.Snapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("fsm: decoding snapshot: %w", err)
	}
	if unknownFields(snap.ProtoReflect()) {
		return fmt.Errorf("fsm: the snapshot holds fields this version of fence (protocol %d) does not know: the group runs a newer version", Protocol)
	}
	state, err := Restore(&snap)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = state
	f.protocol.Store(state.Protocol())
	f.mu.Unlock()
	if f.observer != nil {
		f.observer.Restored()
	}
	return nil
}

type snapshot struct{ snap *fsmpb.Snapshot }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.snap)
	if err == nil {
		_, err = sink.Write(data)
	}
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("fsm: writing snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
