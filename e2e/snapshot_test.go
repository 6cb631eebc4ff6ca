package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
)

// startServerOn starts `fence serve` on an existing data dir, on free ports
// (raftAddr, when set, is the raft address the data dir was restored with).
func startServerOn(t *testing.T, dataDir, raftAddr string) *server {
	t.Helper()
	s := &server{dataDir: dataDir}
	t.Cleanup(func() {
		for _, p := range s.procs {
			p.cleanup(t)
		}
	})
	addrs := freeAddrs(t, 2)
	s.addr, s.raftAddr = addrs[0], raftAddr
	if !s.start(t) {
		t.Fatalf("fence serve could not bind its ports:\n%s", s.proc.Stderr())
	}
	s.waitReady(t)
	return s
}

// fence snapshot save, inspect and restore, with real processes: the
// restored node serves the state saved, not what was written after, and
// its tokens continue above the snapshot's by the bump; a damaged file and
// a used data dir are refused.
func TestSnapshotSaveRestoreProcesses(t *testing.T) {
	ctx := context.Background()
	src := startServer(t)
	c := newClient(t, src.addr)
	s := newSession(t, c, time.Minute, "backup test")
	g, err := client.NewMutex(s, "orders").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "config", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "backup.fsnap")
	out, stderr, code := runFence(t, append(src.endpoints(), "snapshot", "save", file)...)
	if code != 0 || !strings.Contains(out, "saved "+file) {
		t.Fatalf("snapshot save: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := c.KV().Put(ctx, "config", []byte("v2")); err != nil {
		t.Fatal(err)
	}

	out, stderr, code = runFence(t, "snapshot", "inspect", "--json", file)
	if code != 0 {
		t.Fatalf("snapshot inspect: exit %d\n%s", code, stderr)
	}
	var inspected struct {
		Header struct {
			LastToken uint64 `json:"lastToken,string"`
			Index     uint64 `json:"index,string"`
		} `json:"header"`
		Counts struct {
			Sessions int `json:"sessions,string"`
			Locks    int `json:"locks,string"`
			Keys     int `json:"kvKeys,string"`
		} `json:"counts"`
	}
	if err := json.Unmarshal([]byte(out), &inspected); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, out)
	}
	if h, n := inspected.Header, inspected.Counts; h.LastToken != g.Token() || h.Index == 0 || n.Sessions != 1 || n.Locks != 1 || n.Keys != 1 {
		t.Errorf("inspect: %+v, want last token %d, 1 session, 1 lock, 1 key", inspected, g.Token())
	}

	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := file + ".damaged"
	data[len(data)-1] ^= 0x01
	if err := os.WriteFile(bad, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runFence(t, "snapshot", "inspect", bad); code != 1 || !strings.Contains(stderr, bad) || !strings.Contains(stderr, "damaged") {
		t.Errorf("inspect of a damaged file: exit %d, %q; want 1 and a message naming it", code, stderr)
	}

	raftAddr := freeAddrs(t, 1)[0]
	dir := filepath.Join(t.TempDir(), "restored")
	restore := []string{"snapshot", "restore", file, "--data-dir", dir, "--raft-listen", raftAddr}
	if out, stderr, code := runFence(t, restore...); code != 0 {
		t.Fatalf("snapshot restore: exit %d\n%s%s", code, out, stderr)
	}
	if _, stderr, code := runFence(t, restore...); code != 1 || !strings.Contains(stderr, "not empty") {
		t.Errorf("restore into a used data dir: exit %d, %q; want a refusal", code, stderr)
	}
	if _, stderr, code := runFence(t, "snapshot", "restore", bad, "--data-dir", filepath.Join(t.TempDir(), "x")); code != 1 || !strings.Contains(stderr, bad) {
		t.Errorf("restore of a damaged file: exit %d, %q; want a refusal naming it", code, stderr)
	}

	dst := startServerOn(t, dir, raftAddr)
	c2 := newClient(t, dst.addr)
	kv, err := c2.KV().Get(ctx, "config")
	if err != nil || string(kv.Value) != "v1" {
		t.Errorf("config on the restored node: %v %v, want the snapshot's v1", kv, err)
	}
	if l := lockInfo(t, c2, "orders"); len(l.GetHolders()) != 1 || l.GetHolders()[0].GetToken() != g.Token() {
		t.Errorf("orders on the restored node: %v, want held with token %d", l, g.Token())
	}
	s2 := newSession(t, c2, time.Minute, "after restore")
	g2, err := client.NewMutex(s2, "next").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := g.Token() + 1_000_000_000; g2.Token() <= want {
		t.Errorf("first token after restore %d, want above %d (the snapshot's %d + the default bump)", g2.Token(), want, g.Token())
	}
}
