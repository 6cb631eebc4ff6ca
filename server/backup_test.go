package server

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/fsm"
)

// saveSnapshot saves the group's state at endpoints to path, as fence
// snapshot save does.
func saveSnapshot(t testing.TB, path string, endpoints ...string) SnapshotHeader {
	t.Helper()
	c, err := client.New(client.WithEndpoints(endpoints...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Close()
	h := SnapshotHeader{NodeID: snap.Header.GetNodeId(), Index: snap.Header.GetIndex(), Term: snap.Header.GetTerm(),
		LastToken: snap.Header.GetLastToken(), Size: snap.Header.GetSize(), SHA256: hex.EncodeToString(snap.Header.GetSha256())}
	if err := WriteSnapshotFile(path, h, snap); err != nil {
		t.Fatalf("WriteSnapshotFile: %v", err)
	}
	return h
}

func mustPut(t testing.TB, c *client.Client, key, value string) {
	t.Helper()
	if _, err := c.KV().Put(context.Background(), key, []byte(value)); err != nil {
		t.Fatalf("Put %s: %v", key, err)
	}
}

func kvValue(s *Server, key string) (string, bool) {
	var kv fsm.KeyValue
	var ok bool
	s.fsm.Read(func(st *fsm.State) { kv, ok = st.Get(key) })
	return string(kv.Value), ok
}

func lockHolder(s *Server, name string) (session, token uint64) {
	s.fsm.Read(func(st *fsm.State) {
		if l, ok := st.Lock(name); ok && len(l.Holders) > 0 {
			session, token = l.Holders[0].Session, l.Holders[0].Token
		}
	})
	return session, token
}

// A node restored from a snapshot serves the snapshot's state, not what
// was written after it, and its tokens continue above the snapshot's; a
// bump puts them above every token the old node issued after the save.
func TestSnapshotSaveAndRestore(t *testing.T) {
	src := startTestServer(t, nil)
	a := newAPI(t, src)
	c := newTestClient(t, src.Addr())
	sess := a.session(time.Hour)
	held := a.mustAcquire(sess, "held")
	a.release(sess, "released", a.mustAcquire(sess, "released"))
	mustPut(t, c, "k", "before")

	path := filepath.Join(t.TempDir(), "backup.fsnap")
	h := saveSnapshot(t, path, src.Addr())
	if h.LastToken != held+1 || h.Index == 0 || h.Term == 0 {
		t.Fatalf("header %+v: want last token %d and an index and term", h, held+1)
	}

	after := a.mustAcquire(sess, "after")
	mustPut(t, c, "k", "after")
	mustPut(t, c, "k2", "after")
	srcLast := lastToken(src)
	srcGroup := src.clusterID()
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name      string
		bump      uint64
		wantToken uint64 // the restored node's first grant
		logStore  string
	}{
		{"no bump", 0, h.LastToken + 1, LogStoreWAL},
		{"bump", DefaultRestoreBump, h.LastToken + DefaultRestoreBump + 1, LogStoreWAL},
		{"bolt log", 0, h.LastToken + 1, LogStoreBolt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataDir = filepath.Join(t.TempDir(), "restored")
			cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
			cfg.LogStore = tc.logStore
			res, err := RestoreSnapshot(cfg, path, tc.bump)
			if err != nil {
				t.Fatal(err)
			}
			if res.LastToken != h.LastToken+tc.bump {
				t.Fatalf("restored last token %d, want %d", res.LastToken, h.LastToken+tc.bump)
			}
			s := mustStart(t, cfg)
			if id := s.clusterID(); id == "" || id == srcGroup {
				t.Errorf("restored group's id %q, want a new one, not the saved group's %q", id, srcGroup)
			}
			if term := s.node.raft.CurrentTerm(); term <= h.Term {
				t.Errorf("restored node leads in term %d, not above the snapshot's %d", term, h.Term)
			}
			if sid, tok := lockHolder(s, "held"); sid != sess || tok != held {
				t.Errorf("lock held: session %d token %d, want %d %d", sid, tok, sess, held)
			}
			if sid, _ := lockHolder(s, "after"); sid != 0 {
				t.Errorf("lock taken after the snapshot is held by %d in the restored state", sid)
			}
			if v, _ := kvValue(s, "k"); v != "before" {
				t.Errorf("k = %q, want the snapshot's %q", v, "before")
			}
			if _, ok := kvValue(s, "k2"); ok {
				t.Error("k2, written after the snapshot, exists in the restored state")
			}
			ra := newAPIAt(t, "http://"+s.Addr(), a.secrets) // the session's secret survived the restore
			got := ra.mustAcquire(sess, "new")
			if got != tc.wantToken {
				t.Errorf("first token after restore %d, want %d (snapshot's last %d, bump %d)", got, tc.wantToken, h.LastToken, tc.bump)
			}
			if tc.bump > 0 && got <= srcLast {
				t.Errorf("token %d after a bumped restore is not above the old node's last %d (%d was granted after the save)", got, srcLast, after)
			}
			// The restored dir, with log entries after its snapshot, opens again.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustStart(t, cfg)
			if _, tok := lockHolder(s, "new"); tok != got {
				t.Errorf("after a restart the lock granted after the restore has token %d, want %d", tok, got)
			}
			if sid, tok := lockHolder(s, "held"); sid != sess || tok != held {
				t.Errorf("after a restart lock held: session %d token %d, want %d %d", sid, tok, sess, held)
			}
		})
	}
}

// A session in a restored snapshot is not kept alive forever: the restored
// leader gives it a full TTL, and expires it when no keepalive comes, which
// releases its locks.
func TestSnapshotRestoredSessionExpires(t *testing.T) {
	src := startTestServer(t, nil)
	a := newAPI(t, src)
	sess := a.session(time.Second)
	a.mustAcquire(sess, "orders")
	path := filepath.Join(t.TempDir(), "backup.fsnap")
	saveSnapshot(t, path, src.Addr())
	src.Close()

	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "restored")
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	if _, err := RestoreSnapshot(cfg, path, 0); err != nil {
		t.Fatal(err)
	}
	s := mustStart(t, cfg)
	if sid, _ := lockHolder(s, "orders"); sid != sess {
		t.Fatalf("restored lock holder %d, want session %d", sid, sess)
	}
	waitFor(t, "the restored session to expire", func() bool {
		sid, _ := lockHolder(s, "orders")
		var live bool
		s.fsm.Read(func(st *fsm.State) { _, live = st.Session(sess) })
		return sid == 0 && !live
	})
}

// A restore makes a new data dir: it refuses one that holds anything.
func TestSnapshotRestoreRefusesNonEmptyDir(t *testing.T) {
	src := startTestServer(t, nil)
	path := filepath.Join(t.TempDir(), "backup.fsnap")
	saveSnapshot(t, path, src.Addr())
	cfg := DefaultConfig()
	cfg.DataDir = src.cfg.DataDir
	_, err := RestoreSnapshot(cfg, path, 0)
	if err == nil || !strings.Contains(err.Error(), "is not empty") {
		t.Fatalf("restore into a used data dir: %v, want a refusal", err)
	}
}

// A damaged or truncated snapshot file is refused, naming the file and what
// is wrong with it, and a restore from it writes nothing.
func TestSnapshotCorruptFileRefused(t *testing.T) {
	src := startTestServer(t, nil)
	a := newAPI(t, src)
	sess := a.session(time.Hour)
	a.mustAcquire(sess, "orders")
	dir := t.TempDir()
	path := filepath.Join(dir, "backup.fsnap")
	saveSnapshot(t, path, src.Addr())
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSnapshotFile(path); err != nil {
		t.Fatalf("the intact file: %v", err)
	}
	bodyAt := bytes.Index(good, []byte("\ncrc32c ")) + len("\ncrc32c 00000000\n")
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 0x10
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"body byte flipped", flip(len(good) - 3), "body is damaged"},
		{"header byte flipped", flip(bytes.Index(good, []byte(`"index"`)) + 2), "header is damaged"},
		{"truncated", good[:len(good)-5], "truncated"},
		{"cut in the header", good[:bodyAt-20], "cut off"},
		{"trailing bytes", append(bytes.Clone(good), "junk"...), "follow the end of the body"},
		{"not a snapshot", []byte("hello\n"), "not a fence snapshot"},
		{"empty", nil, "does not start with"},
		{"newer format", bytes.Replace(good, []byte("FENCE-SNAPSHOT 1"), []byte("FENCE-SNAPSHOT 2"), 1), "format \"2\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(bad, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadSnapshotFile(bad)
			if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadSnapshotFile: %v, want an error naming %s and saying %q", err, bad, tc.want)
			}
			cfg := DefaultConfig()
			cfg.DataDir = filepath.Join(dir, "restored-"+filepath.Base(bad))
			if _, err := RestoreSnapshot(cfg, bad, 0); err == nil {
				t.Fatal("restored from a damaged file")
			}
			if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused restore left %s behind (%v)", cfg.DataDir, err)
			}
		})
	}
}

// A snapshot call that reaches a follower is sent to the leader, and the
// state of a group restored from it is the same on every member.
func TestSnapshotRestoreCluster(t *testing.T) {
	src := startCluster(t, 3, nil)
	leader := src.leader()
	a := newAPI(t, leader)
	sess := a.session(time.Hour)
	held := a.mustAcquire(sess, "held")
	mustPut(t, src.client(), "k", "before")
	path := filepath.Join(t.TempDir(), "backup.fsnap")
	h := saveSnapshot(t, path, src.followers(leader)[0].Addr())
	if h.NodeID != leader.cfg.NodeID {
		t.Errorf("snapshot taken by %s, want the leader %s", h.NodeID, leader.cfg.NodeID)
	}
	a.mustAcquire(sess, "after")

	dst := restoreCluster(t, 3, path, 0)
	l := dst.leader()
	for _, id := range dst.ids {
		s := dst.nodes[id]
		waitFor(t, id+" to apply the restored state", func() bool { return s.node.raft.AppliedIndex() >= h.Index })
		if sid, tok := lockHolder(s, "held"); sid != sess || tok != held {
			t.Errorf("%s: lock held by %d with %d, want %d with %d", id, sid, tok, sess, held)
		}
		if sid, _ := lockHolder(s, "after"); sid != 0 {
			t.Errorf("%s: lock taken after the snapshot is held", id)
		}
	}
	if got := newAPIAt(t, "http://"+l.Addr(), a.secrets).mustAcquire(sess, "new"); got <= h.LastToken {
		t.Errorf("token %d after restore, not above the snapshot's %d", got, h.LastToken)
	}
	// The restored group commits and replicates: every member applies the grant.
	want := l.node.raft.AppliedIndex()
	for _, id := range dst.ids {
		s := dst.nodes[id]
		waitFor(t, id+" to replicate", func() bool { return s.node.raft.AppliedIndex() >= want })
	}
}

// restoreCluster restores path into n new data dirs with one set of peers
// and starts them.
func restoreCluster(t *testing.T, n int, path string, bump uint64) *testCluster {
	c := newCluster(t, n, nil)
	for _, id := range c.ids {
		if _, err := RestoreSnapshot(c.cfgs[id], path, bump); err != nil {
			t.Fatalf("restoring %s: %v", id, err)
		}
	}
	for _, id := range c.ids {
		c.start(id)
	}
	return c
}

func newTestClient(t testing.TB, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.WithEndpoints(endpoints...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Whatever a snapshot file holds, reading it gives a verified snapshot or
// an error naming the file; it never panics, nor allocates what a
// damaged header claims.
func FuzzDecodeSnapshotFile(f *testing.F) {
	good, err := os.ReadFile("testdata/snapshot-format1.fsnap")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("FENCE-SNAPSHOT 1\n{\"format\":1,\"body_bytes\":17179869184}\ncrc32c 00000000\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := decodeSnapshotFile("fuzz.fsnap", bytes.NewReader(data))
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.fsnap") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if uint64(len(sf.Body)) != sf.Header.Size {
			t.Fatalf("body of %d bytes, header says %d", len(sf.Body), sf.Header.Size)
		}
	})
}
