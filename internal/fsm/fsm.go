package fsm

import (
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsmpb"
)

// Observer learns of every change to the state, in log order, on raft's
// apply goroutine. It must not block and must not call back into the FSM's
// Apply; it may call Read.
type Observer interface {
	// Applied is called after the command at seq was applied: once for
	// each command of a Batch, in order, and never for the batch itself.
	Applied(seq Seq, res Result)
	// Restored is called after the state was replaced by a snapshot.
	Restored()
}

// FSM adapts State to hashicorp/raft. It implements raft.BatchingFSM, so a
// batch of commands committed together is applied under one lock. Reads take
// a shared lock and may run alongside snapshot persistence.
type FSM struct {
	mu       sync.RWMutex
	state    *State
	observer Observer
}

var _ raft.BatchingFSM = (*FSM)(nil)

// New returns an FSM with an empty state. observer may be nil.
func New(observer Observer) *FSM {
	return &FSM{state: NewState(), observer: observer}
}

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
	f.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		var cmd fsmpb.Command
		if err := proto.Unmarshal(l.Data, &cmd); err != nil {
			results[i] = Result{Err: fmt.Errorf("%w: log entry %d does not decode: %v", fence.ErrInvalidArgument, l.Index, err)}
		} else {
			results[i] = f.state.Apply(&cmd)
		}
		out[i] = results[i]
	}
	f.mu.Unlock()
	if f.observer != nil {
		for i, l := range logs {
			if l.Type != raft.LogCommand {
				continue
			}
			if results[i].Batch == nil {
				f.observer.Applied(SeqOf(l.Index, 0), results[i])
				continue
			}
			for j, r := range results[i].Batch {
				f.observer.Applied(SeqOf(l.Index, j), r)
			}
		}
	}
	return out
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
	state, err := Restore(&snap)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = state
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
