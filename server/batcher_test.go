package server

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func createSessionCmd(owner string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{TtlNs: int64(time.Minute), Owner: owner}}}
}

// entryAt decodes the raft log entry at index on s.
func entryAt(t *testing.T, s *Server, index uint64) *fsmpb.Command {
	t.Helper()
	var l raft.Log
	if err := s.node.log.GetLog(index, &l); err != nil {
		t.Fatalf("reading entry %d: %v", index, err)
	}
	var cmd fsmpb.Command
	if err := proto.Unmarshal(l.Data, &cmd); err != nil {
		t.Fatalf("entry %d does not decode: %v", index, err)
	}
	return &cmd
}

// TestBatcherGivesEachCallerItsResult proposes many commands at once, half
// of which fail: they are committed in fewer entries than commands, and
// each caller gets its own command's result, at its own Seq.
func TestBatcherGivesEachCallerItsResult(t *testing.T) {
	s := startTestServer(t, nil)
	first := s.node.raft.LastIndex()
	const callers = 64
	type answer struct {
		res fsm.Result
		seq uint64
		err error
	}
	answers := make([]answer, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			cmd := createSessionCmd(fmt.Sprint("caller-", i))
			if i%2 == 1 { // a release by a session that does not exist fails
				cmd = &fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{SessionId: uint64(1000 + i), Lock: "x", Token: 1}}}
			}
			res, seq, err := s.node.propose(cmd)
			answers[i] = answer{res, seq, err}
		})
	}
	close(start)
	wg.Wait()
	seqs := map[uint64]bool{}
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("caller %d: %v", i, a.err)
		}
		if seqs[a.seq] {
			t.Fatalf("caller %d was answered seq %d, as another caller", i, a.seq)
		}
		seqs[a.seq] = true
		if i%2 == 1 {
			if !errors.Is(a.res.Err, fence.ErrNotHolder) && !errors.Is(a.res.Err, fence.ErrSessionNotFound) || a.res.CreateSession().SessionID != 0 {
				t.Fatalf("caller %d's release answered %+v", i, a.res)
			}
			continue
		}
		if a.res.Err != nil || a.res.CreateSession().SessionID == 0 {
			t.Fatalf("caller %d's create answered %+v", i, a.res)
		}
		var owner string
		s.fsm.Read(func(st *fsm.State) {
			info, _ := st.Session(a.res.CreateSession().SessionID)
			owner = info.Owner
		})
		if want := fmt.Sprint("caller-", i); owner != want {
			t.Fatalf("caller %d was answered session %d, created for %q", i, a.res.CreateSession().SessionID, owner)
		}
		// The Seq names the command's place in its entry.
		cmd := entryAt(t, s, fsm.Seq(a.seq).Index())
		if b := cmd.GetBatch(); b != nil {
			if got := b.GetCommands()[a.seq&(fsm.MaxBatchCommands-1)].GetCreateSession().GetOwner(); got != owner {
				t.Fatalf("caller %d's seq %d points at a command of %q", i, a.seq, got)
			}
		}
	}
	if entries := s.node.raft.LastIndex() - first; entries >= callers {
		t.Fatalf("%d concurrent commands took %d entries; none were batched", callers, entries)
	}
}

// TestBatcherLoneProposalGoesAlone proves that a proposal on an idle node
// is committed as itself, not wrapped in a batch.
func TestBatcherLoneProposalGoesAlone(t *testing.T) {
	s := startTestServer(t, nil)
	res, seq, err := s.node.propose(createSessionCmd("alone"))
	if err != nil || res.CreateSession().SessionID == 0 {
		t.Fatalf("propose: %+v, %v", res, err)
	}
	cmd := entryAt(t, s, fsm.Seq(seq).Index())
	if cmd.GetCreateSession().GetOwner() != "alone" {
		t.Fatalf("entry %d holds %v, want the lone command", fsm.Seq(seq).Index(), cmd)
	}
}

// TestBatcherBounds proves a batch never exceeds its bounds: with many
// commands queued at once, each entry holds at most maxBatchCommands
// commands and, unless a command alone is larger, maxBatchBytes.
func TestBatcherBounds(t *testing.T) {
	s := startTestServer(t, nil)
	first := s.node.raft.LastIndex()
	big := string(make([]byte, maxBatchBytes/3))
	var wg sync.WaitGroup
	for i := range 3 * maxBatchCommands {
		wg.Go(func() {
			owner := fmt.Sprint(i)
			if i%100 == 0 {
				owner = big
			}
			if _, _, err := s.node.propose(createSessionCmd(owner)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	batched := false
	for index := first + 1; index <= s.node.raft.LastIndex(); index++ {
		var l raft.Log
		if err := s.node.log.GetLog(index, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		cmd := entryAt(t, s, index)
		n := len(cmd.GetBatch().GetCommands())
		batched = batched || n > 1
		if n > maxBatchCommands {
			t.Fatalf("entry %d holds %d commands", index, n)
		}
		if n > 1 && len(l.Data) > maxBatchBytes+64 {
			t.Fatalf("entry %d of %d commands has %d bytes", index, n, len(l.Data))
		}
	}
	if !batched {
		t.Fatal("no entry held more than one command")
	}
}

// TestEncodeBatch proves the batch encoding is that of fsmpb.Batch.
func TestEncodeBatch(t *testing.T) {
	cmds := []*fsmpb.Command{createSessionCmd("a"), {}, {IdempotencyKey: "k", Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: make([]byte, 300)}}}}
	var batch []*proposal
	for _, c := range cmds {
		data, err := fsm.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, &proposal{data: data})
	}
	var got fsmpb.Command
	if err := proto.Unmarshal(encodeBatch(batch), &got); err != nil {
		t.Fatal(err)
	}
	want := &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: cmds}}}
	if !proto.Equal(&got, want) {
		t.Fatalf("decoded %v, want %v", &got, want)
	}
}
