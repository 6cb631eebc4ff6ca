// Native fuzz tests. FuzzStateMachine proves, for any command stream the
// fuzzer makes, what runStream checks: design.md invariants 1, 2, 4, 5 and 7
// after every step. FuzzApplyBytes proves that no log entry, however
// malformed, panics FSM.ApplyBatch, breaks the state's invariants or
// half-applies: bytes that do not decode fail alone with ErrInvalidArgument
// and change nothing, and bytes that do decode are checked by the same model
// as any command. Both run their seed corpus as ordinary tests.
package fsm_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// FuzzStateMachine decodes the input into a command stream (see
// commandSource) and runs runStream on it.
func FuzzStateMachine(f *testing.F) {
	// Sessions 1..4 exist after runStream's prologue. An acquire is
	// {4, session, lock+mode, options}: session byte 8*i picks live session
	// i+1, lock+mode byte 3*k picks lock "a" in mode k (0 exclusive, 1 shared).
	f.Add([]byte{})
	f.Add([]byte{
		4, 0, 0, 0, // session 1 acquires a
		4, 8, 0, 0, // session 2 queues for a
		4, 16, 3, 0, // session 3 queues for a, shared
		11, 0, 0, // the holder of a releases it
		8, 16, 0, // session 3 cancels its wait
	})
	f.Add([]byte{
		4, 0, 0, 4, // session 1 acquires a with a 2 s lock-delay
		4, 8, 0, 0, // session 2 queues for a
		14, 0, 0, // the holder of a expires: a is delayed
		4, 16, 0, 1, // session 3 tries a: locked
		13, 0, // the delayed lock is lifted
	})
	f.Add([]byte{
		4, 0, 3, 0, 4, 8, 3, 0, // sessions 1 and 2 share a
		4, 16, 0, 0, // session 3 queues exclusive
		4, 24, 3, 0, // session 4 queues shared behind it
		15, 0, 0, // everyone on a expires in one command, holders first
	})
	f.Add([]byte{
		4, 0, 0, 0, 4, 8, 0, 0, 4, 16, 0, 0, // 1 holds a, 2 and 3 wait
		3, 1, 0, 8, // sessions 1 and 2 expire together
		10, 0, 0, // a release with a wrong token
		0, 0x33, 0xff, // a session with a limit, an empty command
	})
	r := rand.New(rand.NewPCG(1, 2))
	for range 3 {
		data := make([]byte, 200)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runStream(t, data)
	})
}

// FuzzApplyBytes feeds the input, whole and halved, as raft command entries
// to an FSM holding locks, waiters and a delay, one entry at a time and
// again as one batch.
func FuzzApplyBytes(f *testing.F) {
	for _, cmd := range []*fsmpb.Command{
		newSession(),
		acquire(1, "a", excl, withDelay(time.Second)),
		acquire(3, "b", shared, try, maxWaiters(1)),
		acquire(2, "c", fsm.Mode(7)),
		release(1, "a", 1),
		release(2, "b", 99),
		cancelWait(3, "a"),
		closeSession(2),
		expireSessions(1, 2, 3, 1, 0),
		liftDelay("c"),
		{},
	} {
		data, err := fsm.Encode(cmd)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0x22, 0x05, 0x12, 0x03, 0xc3, 0x28})       // acquire whose lock name is invalid UTF-8
	f.Add([]byte{0x0a, 0x00, 0x0a, 0x00, 0xf8, 0x01, 0x01}) // repeated field and an unknown one
	f.Fuzz(func(t *testing.T, data []byte) {
		one, batch := fsm.New(nil), fsm.New(nil)
		check := newModelChecker()
		var index uint64
		entry := func(data []byte) *raft.Log {
			index++
			return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
		}
		var logs []*raft.Log
		var want []fsm.Result
		// applyOne applies one entry to the checked FSM and queues the same
		// entry for the batched one.
		applyOne := func(data []byte) {
			t.Helper()
			l := entry(data)
			logs = append(logs, l)
			var before []byte
			one.Read(func(s *fsm.State) { before = snapshotBytes(t, s) })
			out := one.ApplyBatch([]*raft.Log{l})
			res, ok := out[0].(fsm.Result)
			if !ok {
				t.Fatalf("ApplyBatch returned %T, not a Result", out[0])
			}
			want = append(want, res)
			var cmd fsmpb.Command
			one.Read(func(s *fsm.State) {
				if err := proto.Unmarshal(data, &cmd); err != nil {
					if !errors.Is(res.Err, fence.ErrInvalidArgument) {
						t.Fatalf("entry that does not decode (%v) answered %s", err, describe(res))
					}
					if err := s.CheckInvariants(); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(before, snapshotBytes(t, s)) {
						t.Fatal("entry that does not decode changed the state")
					}
					return
				}
				if err := check.observe(t, &cmd, res, s, before); err != nil {
					t.Fatalf("%v: %v", &cmd, err)
				}
			})
		}
		// A state with holders, waiters and a delayed lock for the fuzzed
		// entry to act on.
		for _, cmd := range []*fsmpb.Command{
			newSession(), newSession(), newSession(), newSession(),
			acquire(1, "a", excl, withDelay(time.Second)), acquire(2, "a", excl),
			acquire(3, "b", shared), acquire(2, "b", shared), acquire(4, "b", excl),
			acquire(4, "c", excl, withDelay(time.Second)), expireSessions(4),
		} {
			applyOne(mustEncode(t, cmd))
		}
		applyOne(data)
		half := len(data) / 2
		applyOne(data[:half])
		applyOne(data[half:])
		applyOne(data)

		// The same entries in one batch, with a configuration entry in the
		// middle, give the same results and the same state.
		mid := len(logs) / 2
		batchLogs := append(append(append([]*raft.Log{}, logs[:mid]...), &raft.Log{Index: 0, Type: raft.LogConfiguration, Data: data}), logs[mid:]...)
		out := batch.ApplyBatch(batchLogs)
		if out[mid] != nil {
			t.Fatalf("configuration entry answered %v", out[mid])
		}
		out = append(out[:mid], out[mid+1:]...)
		for i, o := range out {
			if res, ok := o.(fsm.Result); !ok || !reflect.DeepEqual(cmpForm(res), cmpForm(want[i])) {
				t.Fatalf("entry %d in a batch answered %v, alone %s", i, o, describe(want[i]))
			}
		}
		one.Read(func(a *fsm.State) {
			batch.Read(func(b *fsm.State) {
				if !bytes.Equal(snapshotBytes(t, a), snapshotBytes(t, b)) {
					t.Fatal("batched and one-by-one application left different states")
				}
			})
		})
	})
}
