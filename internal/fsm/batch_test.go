package fsm_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func batchOf(cmds ...*fsmpb.Command) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: cmds}}}
}

// TestBatchAnswersEachCommand proves that a Batch entry applies its
// commands in order, each as an entry of its own would be applied (a
// hand-off, a failure that changes nothing, an idempotency key repeated
// within the batch, a batch inside it refused alone), and that the
// observer hears each command's result at its own Seq.
func TestBatchAnswersEachCommand(t *testing.T) {
	setup := []*fsmpb.Command{newSession(), newSession(), acquire(1, "a", excl), acquire(2, "a", excl)}
	cmds := []*fsmpb.Command{
		keyedCmd("k", kvPut("x", "1")),
		release(1, "a", 1), // hands a to session 2
		acquire(1, "a", excl),
		keyedCmd("k", kvPut("x", "2")), // repeats the first
		batchOf(newSession()),
		release(1, "a", 99), // not the holder: fails alone
		newSession(),
	}
	batched, rec := newRecordedFSM()
	alone := fsm.New(nil)
	var index uint64
	for _, cmd := range setup {
		index++
		batched.Apply(commandLog(t, index, cmd))
		alone.Apply(commandLog(t, index, cmd))
	}
	var want []fsm.Result
	for i, cmd := range cmds {
		if i == 4 {
			want = append(want, fsm.Result{Err: fence.ErrInvalidArgument})
			continue
		}
		want = append(want, alone.Apply(commandLog(t, index+1+uint64(i), cmd)).(fsm.Result))
	}
	index++
	rec.seqs, rec.effects = nil, nil
	res := batched.Apply(commandLog(t, index, batchOf(cmds...))).(fsm.Result)
	if res.Err != nil || len(res.Batch()) != len(cmds) {
		t.Fatalf("batch answered %s", describe(res))
	}
	for i := range cmds {
		ok := sameAnswer(res.Batch()[i], want[i])
		if i == 4 {
			ok = sameResult(res.Batch()[i], want[i])
		}
		if !ok {
			t.Errorf("command %d answered %s in a batch, %s alone", i, describe(res.Batch()[i]), describe(want[i]))
		}
	}
	if g := res.Batch()[1].Effects.Grants; len(g) != 1 || g[0].Session != 2 {
		t.Errorf("the release in the batch handed a on as %+v, want to session 2", g)
	}
	if _, repeat := res.Batch()[3].Repeat(); !repeat {
		t.Errorf("the key repeated within the batch was applied again: %s", describe(res.Batch()[3]))
	}
	var wantSeqs []fsm.Seq
	for i := range cmds {
		wantSeqs = append(wantSeqs, fsm.SeqOf(index, i))
	}
	if !reflect.DeepEqual(rec.seqs, wantSeqs) {
		t.Fatalf("observer heard seqs %v, want %v", rec.seqs, wantSeqs)
	}
	for i, eff := range rec.effects {
		if !reflect.DeepEqual(eff, res.Batch()[i].Effects) {
			t.Errorf("observer heard %+v for command %d, the batch answered %s", eff, i, describe(res.Batch()[i]))
		}
	}
	for i := 1; i < len(wantSeqs); i++ {
		if wantSeqs[i] <= wantSeqs[i-1] || wantSeqs[i].Index() != index {
			t.Fatalf("seqs %v do not order the batch within entry %d", wantSeqs, index)
		}
	}
	if !bytes.Equal(fsmSnapshotBytes(t, batched), fsmSnapshotBytes(t, alone)) {
		t.Fatal("the batch left another state than its commands applied one by one")
	}
}

// TestBatchRefusedWhole proves that a batch with an idempotency key of its
// own, or with more than MaxBatchCommands commands, applies none of them.
func TestBatchRefusedWhole(t *testing.T) {
	many := make([]*fsmpb.Command, fsm.MaxBatchCommands+1)
	for i := range many {
		many[i] = newSession()
	}
	for name, cmd := range map[string]*fsmpb.Command{
		"keyed":    keyedCmd("k", batchOf(newSession())),
		"too many": batchOf(many...),
	} {
		t.Run(name, func(t *testing.T) {
			f := fsm.New(nil)
			f.Apply(commandLog(t, 1, newSession()))
			before := fsmSnapshotBytes(t, f)
			res := f.ApplyBatch([]*raft.Log{commandLog(t, 2, cmd)})[0].(fsm.Result)
			if !errors.Is(res.Err, fence.ErrInvalidArgument) || res.Batch() != nil {
				t.Fatalf("answered %s, want ErrInvalidArgument and no results", describe(res))
			}
			if !bytes.Equal(before, fsmSnapshotBytes(t, f)) {
				t.Fatal("a refused batch changed the state")
			}
		})
	}
}

func fsmSnapshotBytes(t *testing.T, f *fsm.FSM) []byte {
	var b []byte
	f.Read(func(s *fsm.State) { b = snapshotBytes(t, s) })
	return b
}
