package server

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/walfmt"
	"github.com/fencelock/fence/server/internal/durable"
)

// The tests here damage a stopped node's files the way a disk does (bytes
// flipped in place, a write torn at the end) and start it again.

// corruptionNode is a single node whose data dir outlives it.
type corruptionNode struct {
	t   *testing.T
	cfg Config
}

func newCorruptionNode(t *testing.T, logStore string, edit func(*Config)) *corruptionNode {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.LogStore = logStore
	if edit != nil {
		edit(&cfg)
	}
	return &corruptionNode{t: t, cfg: cfg}
}

// run starts the node, calls fn with it, and stops it.
func (c *corruptionNode) run(fn func(s *Server)) {
	c.t.Helper()
	s, err := Start(c.cfg)
	if err != nil {
		c.t.Fatalf("starting: %v", err)
	}
	waitFor(c.t, "a ready leader", s.leaderReady.Load)
	fn(s)
	if err := s.Close(); err != nil {
		c.t.Fatal(err)
	}
}

// startErr starts the node expecting it to refuse, and returns why.
func (c *corruptionNode) startErr() error {
	c.t.Helper()
	s, err := Start(c.cfg)
	if err == nil {
		s.Close()
		c.t.Fatal("the node started on a damaged data dir")
	}
	return err
}

func put(t *testing.T, s *Server, key, value string) {
	t.Helper()
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte(value)}}})
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func valueOf(s *Server, key string) string {
	var kv fsm.KeyValue
	s.fsm.Read(func(st *fsm.State) { kv, _ = st.Get(key) })
	return string(kv.Value)
}

// value is a recognisable value for key i, long enough to flip bytes in.
func value(i int) string { return fmt.Sprintf("value-%03d-", i) + strings.Repeat("abcdefgh", 8) }

// flip inverts n bytes of the file at off.
func flip(t *testing.T, path string, off, n int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := off; i < off+n; i++ {
		data[i] ^= 0xff
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// findIn returns the file under dir matching glob that holds needle, and
// where.
func findIn(t *testing.T, glob, needle string) (string, int) {
	t.Helper()
	files, _ := filepath.Glob(glob)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(data, []byte(needle)); i >= 0 {
			return f, i
		}
	}
	t.Fatalf("no file %s holds %q", glob, needle)
	return "", 0
}

func TestFlippedBytesInAnEntryStopTheNode(t *testing.T) {
	for _, kind := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(kind, func(t *testing.T) {
			c := newCorruptionNode(t, kind, nil)
			c.run(func(s *Server) {
				for i := range 20 {
					put(t, s, fmt.Sprintf("k%d", i), value(i))
				}
			})
			glob := filepath.Join(c.cfg.DataDir, "wal", "*.wal")
			if kind == LogStoreBolt {
				glob = filepath.Join(c.cfg.DataDir, "raft.db")
			}
			// bbolt copies pages on write, so a value may stand in more
			// than one page: damage every copy.
			file, _ := findIn(t, glob, value(10))
			for {
				data, _ := os.ReadFile(file)
				off := bytes.Index(data, []byte(value(10)))
				if off < 0 {
					break
				}
				flip(t, file, off+12, 16)
			}

			err := c.startErr()
			for _, want := range []string{"damaged", file, "checksum", "do not delete", "--join"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
			if kind == LogStoreWAL && !strings.Contains(err.Error(), "offset") {
				t.Errorf("the refusal does not name the offset: %v", err)
			}
		})
	}
}

// walFrames returns the offsets of the entry frames in a segment.
func walFrames(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return walfmt.EntryOffsets(data)
}

func tailSegment(t *testing.T, dataDir string) string {
	t.Helper()
	segs, err := walfmt.Segments(filepath.Join(dataDir, "wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segments: %v", err)
	}
	return segs[len(segs)-1].Path
}

// A damaged frame header in the middle of raft-wal's open segment made it
// drop every later batch without a word: the node came back at an older
// index, with an older last token.
func TestDamagedFrameHeaderMidLogStopsTheNode(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	c.run(func(s *Server) {
		a := newAPI(t, s)
		session := a.session(time.Minute)
		for i := range 20 {
			a.mustAcquire(session, fmt.Sprintf("lock-%d", i))
		}
	})
	seg := tailSegment(t, c.cfg.DataDir)
	frames := walFrames(t, seg)
	flip(t, seg, frames[len(frames)/2], 16)

	err := c.startErr()
	for _, want := range []string{"damaged", seg, "offset", "complete batch", "acknowledged"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

// A write torn at the end of the log was never acknowledged; the node
// drops it and starts.
func TestTornLastWriteIsDropped(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	c.run(func(s *Server) {
		for i := range 10 {
			put(t, s, fmt.Sprintf("k%d", i), value(i))
		}
	})
	seg := tailSegment(t, c.cfg.DataDir)
	_, off := findIn(t, seg, value(9))
	flip(t, seg, off+12, 16) // the last batch: raft-wal's own commit checksum fails

	c.run(func(s *Server) {
		for i := range 9 {
			if got := valueOf(s, fmt.Sprintf("k%d", i)); got != value(i) {
				t.Errorf("k%d = %q after the restart, want %q", i, got, value(i))
			}
		}
		if got := valueOf(s, "k9"); got != "" && got != value(9) {
			t.Errorf("the torn write came back as %q", got)
		}
	})
}

// A data dir whose log was written before entries carried checksums keeps
// working: its old entries are read as they are, new ones are checked.
func TestLogWithoutChecksumsStillStarts(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	c.run(func(s *Server) {
		put(t, s, "old", "v1")
	})
	rewriteWithoutChecksums(t, c.cfg.DataDir)
	c.run(func(s *Server) {
		if got := valueOf(s, "old"); got != "v1" {
			t.Fatalf("old = %q after the restart, want v1", got)
		}
		put(t, s, "new", "v2")
	})
	c.run(func(s *Server) {
		if got := valueOf(s, "new"); got != "v2" {
			t.Fatalf("new = %q after the restart, want v2", got)
		}
	})
}

// rewriteWithoutChecksums turns a data dir into one written before log
// checksums existed: the same entries, stored bare, and no record of where
// checksums begin.
func rewriteWithoutChecksums(t *testing.T, dataDir string) {
	t.Helper()
	old, done := mustOpenWAL(t, filepath.Join(dataDir, "wal"))
	first, _ := old.FirstIndex()
	last, _ := old.LastIndex()
	var bare []*raft.Log
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := old.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if data, sealed, ok := durable.UnwrapEntry(&l); sealed && ok {
			l.Data = data
		}
		bare = append(bare, &l)
	}
	done()
	if err := os.RemoveAll(filepath.Join(dataDir, "wal")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dataDir, "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	w, done := mustOpenWAL(t, filepath.Join(dataDir, "wal"))
	if err := w.StoreLogs(bare); err != nil {
		t.Fatal(err)
	}
	done()
	forgetChecksumStart(t, dataDir)
}

func forgetChecksumStart(t *testing.T, dataDir string) {
	t.Helper()
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dataDir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.SetUint64(durable.CheckedFromKey, 0); err != nil {
		t.Fatal(err)
	}
}
