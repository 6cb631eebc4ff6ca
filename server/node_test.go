package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// mustOpenWAL opens the wal log store in dir as a node does.
func mustOpenWAL(t *testing.T, dir string) (raft.LogStore, func()) {
	t.Helper()
	var closers []func() error
	w, err := openWAL(dir, 0, hclog.NewNullLogger(), &closers)
	if err != nil {
		t.Fatalf("opening the wal: %v", err)
	}
	return w, func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil {
				t.Error(err)
			}
		}
	}
}

func walEntries(from, to, term uint64) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d term %d", i, term)})
	}
	return logs
}

// A follower whose uncommitted tail a new leader overwrites truncates the
// log's tail and appends the leader's entries; after a restart its log
// must open and read back exactly that. raft-wal v0.4.0 sealed the
// truncated segment without an index and could not reopen it
// (hashicorp/raft-wal#31); fence check --nodes 3 found a node panicking
// on restart. The head truncation of compaction must hide old entries too.
func TestWALReopensAfterTailAndHeadTruncation(t *testing.T) {
	dir := t.TempDir()
	w, closeWAL := mustOpenWAL(t, dir)
	if err := w.StoreLogs(walEntries(1, 100, 1)); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteRange(91, 100); err != nil { // the follower's conflicting tail
		t.Fatal(err)
	}
	if err := w.StoreLogs(walEntries(91, 95, 2)); err != nil {
		t.Fatal(err)
	}
	closeWAL()

	w, closeWAL = mustOpenWAL(t, dir)
	defer closeWAL()
	want := func(first, last uint64) {
		t.Helper()
		if got, err := w.FirstIndex(); err != nil || got != first {
			t.Fatalf("FirstIndex = %d, %v; want %d", got, err, first)
		}
		if got, err := w.LastIndex(); err != nil || got != last {
			t.Fatalf("LastIndex = %d, %v; want %d", got, err, last)
		}
		for i := first; i <= last; i++ {
			var l raft.Log
			if err := w.GetLog(i, &l); err != nil {
				t.Fatalf("GetLog(%d): %v", i, err)
			}
			term := uint64(1)
			if i > 90 {
				term = 2
			}
			if l.Index != i || l.Term != term || string(l.Data) != fmt.Sprintf("entry %d term %d", i, term) {
				t.Fatalf("GetLog(%d) = index %d term %d %q", i, l.Index, l.Term, l.Data)
			}
		}
	}
	want(1, 95)
	if err := w.StoreLogs(walEntries(96, 99, 2)); err != nil {
		t.Fatalf("appending after the reopen: %v", err)
	}
	if err := w.DeleteRange(1, 50); err != nil { // compaction
		t.Fatal(err)
	}
	want(51, 99)
	var l raft.Log
	if err := w.GetLog(50, &l); err != raft.ErrLogNotFound {
		t.Fatalf("GetLog of a compacted entry = %v, want ErrLogNotFound", err)
	}
}

// raft's messages reach slog at their own level, with their arguments as
// attributes; raft's info and debug chatter is dropped.
func TestRaftLogLevels(t *testing.T) {
	var buf bytes.Buffer
	l := raftLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Error("failed to appendEntries", "peer", "n2")
	l.Warn("clearing log suffix", "from", 7)
	l.Info("entering follower state")
	l.Debug("chatter")
	got := buf.String()
	for _, want := range []string{
		`level=ERROR msg="failed to appendEntries" component=raft peer=n2`,
		`level=WARN msg="clearing log suffix" component=raft from=7`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "follower") || strings.Contains(got, "chatter") {
		t.Errorf("log %q has raft's info or debug lines", got)
	}
}
