package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/fsm"
)

// untar unpacks the gzipped tarball at path into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			// raft-wal preallocates its segments (64 MiB of zeros):
			// leave holes instead of writing them.
			if err := copySparse(out, tr, h.Size); err != nil {
				t.Fatal(err)
			}
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// copySparse copies size bytes from r to f, seeking over blocks of zeros.
func copySparse(f *os.File, r io.Reader, size int64) error {
	buf := make([]byte, 64<<10)
	zero := make([]byte, len(buf))
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if bytes.Equal(buf[:n], zero[:n]) {
				if _, err := f.Seek(int64(n), io.SeekCurrent); err != nil {
					return err
				}
			} else if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return f.Truncate(size)
		}
		if err != nil {
			return err
		}
	}
}

// checkFixtureState checks the state scripts/upgrade-fixture.sh writes:
// session 1 holds orders (token 1) and after-snapshot (token 3, taken
// after the snapshot), jobs was released, and the keys hold their last
// values, some of them written after the snapshot.
func checkFixtureState(t *testing.T, s *Server) {
	t.Helper()
	for _, l := range []struct {
		name           string
		session, token uint64
	}{{"orders", 1, 1}, {"after-snapshot", 1, 3}, {"jobs", 0, 0}} {
		if sid, tok := lockHolder(s, l.name); sid != l.session || tok != l.token {
			t.Errorf("lock %s: held by session %d with token %d, want %d with %d", l.name, sid, tok, l.session, l.token)
		}
	}
	for key, want := range map[string]string{"orders/17": "paid", "config": "v2", "counter": "20"} {
		if got, _ := kvValue(s, key); got != want {
			t.Errorf("key %s = %q, want %q", key, got, want)
		}
	}
	var kv fsm.KeyValue
	var info fsm.SessionInfo
	var live bool
	s.fsm.Read(func(st *fsm.State) {
		kv, _ = st.Get("orders/17")
		info, live = st.Session(1)
	})
	if kv.Token != 1 || kv.Lock != "orders" {
		t.Errorf("orders/17 fenced by %s/%d, want orders/1", kv.Lock, kv.Token)
	}
	if !live || info.TTL != time.Hour {
		t.Errorf("session 1: live %v, TTL %v; want live with 1h", live, info.TTL)
	}
}

// A data dir written by an earlier fence (server/testdata/datadir-REV-STORE.tar.gz,
// made by scripts/upgrade-fixture.sh: a snapshot and log entries after
// it, in either log store) opens in this one: its locks, tokens, sessions
// and keys are served, tokens continue above every token it issued, and
// the dir, once written by this fence, opens again (docs/upgrading.md).
func TestUpgradeOpensOldDataDir(t *testing.T) {
	fixtures, err := filepath.Glob("testdata/datadir-*.tar.gz")
	if err != nil || len(fixtures) == 0 {
		t.Fatalf("no data dir fixtures in testdata (%v)", err)
	}
	for _, fixture := range fixtures {
		t.Run(strings.TrimSuffix(filepath.Base(fixture), ".tar.gz"), func(t *testing.T) {
			dir := t.TempDir()
			untar(t, fixture, dir)
			cfg := DefaultConfig()
			cfg.DataDir = dir
			cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
			s := mustStart(t, cfg)
			checkFixtureState(t, s)
			token := newAPI(t, s).mustAcquire(1, "new")
			if token <= 3 {
				t.Errorf("first token after the upgrade %d, not above the fixture's 3", token)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustStart(t, cfg)
			checkFixtureState(t, s)
			if _, tok := lockHolder(s, "new"); tok != token {
				t.Errorf("lock new after a second start: token %d, want %d", tok, token)
			}
		})
	}
}

// A snapshot file of format 1 (server/testdata/snapshot-format1.fsnap,
// saved from the data dir fixture) reads, verifies and restores.
func TestUpgradeRestoresFormat1Snapshot(t *testing.T) {
	const path = "testdata/snapshot-format1.fsnap"
	f, err := ReadSnapshotFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := SnapshotCounts{Sessions: 1, Locks: 2, Holders: 2, Keys: 3, KVRevision: 23, LastToken: 1001, LastSessionID: 1}
	if got := f.Counts(); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "restored")
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	if _, err := RestoreSnapshot(cfg, path, 0); err != nil {
		t.Fatal(err)
	}
	s := mustStart(t, cfg)
	checkFixtureState(t, s)
	if token := newAPI(t, s).mustAcquire(1, "new"); token != 1002 {
		t.Errorf("first token after restore %d, want 1002", token)
	}
}
