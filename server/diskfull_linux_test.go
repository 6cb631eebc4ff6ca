package server

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/rpcerr"
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
		if err := syscall.Unmount(dir, 0); err != nil {
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
	st, err := s.Status(context.Background(), connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Msg.GetProblems(); len(p) == 0 || !strings.Contains(p[0], "disk full") {
		t.Errorf("Status lists problems %q, want disk full", p)
	}
}
