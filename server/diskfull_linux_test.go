package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/server/internal/durable"
)

// smallDisk mounts a tmpfs of size at a temp dir for the test: a real disk
// that fills up. It needs root; without it the test is skipped.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mounting a %s tmpfs: %v", size, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil { // detached: a failed snapshot may hold a file open
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file until the disk under dir has no space left.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// A full disk fails writes with Unavailable, reason DISK_FULL and the data
// dir named (it was Internal, with no reason), and Status says so.
func TestDiskFullIsReported(t *testing.T) {
	disk := smallDisk(t, "96m")
	dataDir := filepath.Join(disk, "data")
	s := startTestServer(t, func(cfg *Config) { cfg.DataDir = dataDir })
	fill(t, disk)

	kv := fencev1connect.NewKVServiceClient(http.DefaultClient, "http://"+s.Addr())
	value := make([]byte, s.cfg.MaxValueBytes)
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		_, err = kv.Put(context.Background(), connect.NewRequest(&fencev1.PutRequest{Key: "big", Value: value}))
	}
	if err == nil {
		t.Fatal("1000 writes of 256 KiB fitted on a full disk")
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !errors.Is(rpcerr.FromConnect(err), fence.ErrDiskFull) {
		t.Fatalf("a write on a full disk failed with %v (code %v), want Unavailable with reason DISK_FULL", err, connect.CodeOf(err))
	}
	if !strings.Contains(err.Error(), dataDir) {
		t.Errorf("the error does not name the data dir %s: %v", dataDir, err)
	}
	st, err := handlers{Server: s}.Status(context.Background(), connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Msg.GetProblems(); len(p) == 0 || !strings.Contains(p[0], "disk full") {
		t.Errorf("Status lists problems %q, want disk full", p)
	}
}

// A token reserve that cannot be written for want of space is a problem
// the node reports (Status, fence_disk_full) until a write succeeds.
func TestFullDiskUnderTheTokenReserveIsReported(t *testing.T) {
	dir := smallDisk(t, "1m")
	r, err := durable.OpenTokenReserve(dir)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, dir)
	if err := r.Cover(5); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(r.Problem(), "disk full") {
		t.Fatalf("cover on a full disk: %v, problem %q; want ENOSPC and a disk-full problem", err, r.Problem())
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := r.Cover(5); err != nil || r.Problem() != "" || r.Floor() < 5 {
		t.Fatalf("cover once there is room: %v, problem %q, floor %d; want it written and no problem", err, r.Problem(), r.Floor())
	}
}

// A snapshot that fails on a full disk leaves no part of itself behind,
// whether it failed while starting or while being written: raft's store
// kept the temporary dir, which then filled the freed disk again.
func TestFailedSnapshotsLeaveNoTemporaryDirs(t *testing.T) {
	dir := smallDisk(t, "1m")
	files, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	store := durable.NewTidySnapshots(files, dir, slog.New(slog.DiscardHandler), nil)
	leftovers := func(when string) {
		t.Helper()
		if tmps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*.tmp")); len(tmps) > 0 {
			t.Errorf("%s: %v left behind", when, tmps)
		}
	}

	sink, err := store.Create(1, 10, 2, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		_, werr = sink.Write(make([]byte, 64<<10))
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing 4 MiB of snapshot to a 1 MiB disk: %v, want ENOSPC", werr)
	}
	_ = sink.Cancel() // fails too: raft flushes what it buffered first
	leftovers("a snapshot cancelled after a write found no space")

	fill(t, dir)
	if _, err := store.Create(1, 11, 2, raft.Configuration{}, 1, nil); err == nil {
		t.Fatal("starting a snapshot on a full disk succeeded")
	}
	leftovers("a snapshot that could not start on a full disk")
}

// TestALeaderWhoseDiskFillsHandsOver: a leader whose disk filled went on
// leading (raft-wal's preallocated segment still took its writes) until a
// write failed; raft then stepped it down without a word, and the group
// answered no grant until the others' heartbeat timeout had passed. Now it
// hands leadership to a voter with room while it can still write, and
// says in Status that its disk is low. (Here nothing writes enough to fill
// the leader's segment: without the hand-off, it would lead on.)
func TestALeaderWhoseDiskFillsHandsOver(t *testing.T) {
	c := startCluster(t, 3, func(cfg *Config) { cfg.DataDir = filepath.Join(smallDisk(t, "256m"), "data") })
	grantAndStore(t, c)
	leader := c.leader()
	disk := filepath.Dir(leader.cfg.DataDir)
	fill(t, disk)
	waitForWithin(t, 10*time.Second, "another node to lead", func() bool {
		return slices.ContainsFunc(c.followers(leader), func(s *Server) bool { return s.leaderReady.Load() })
	})
	if !slices.ContainsFunc(leader.problems(), func(p string) bool { return strings.HasPrefix(p, "disk nearly full") }) {
		t.Fatalf("the node whose disk filled does not say so: %q", leader.problems())
	}
	grantAndStore(t, c)
	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to see its disk has room again", func() bool { return !leader.node.lowDisk.Load() })
}
