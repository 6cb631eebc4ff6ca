package server

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// legacyFixture is a data dir written by fence before sessions had
// secrets (commit 89a34b7), made by TestWriteLegacyFixture. It holds, in
// a snapshot: session 1 (owner "snap-holder") holding lock "orders" and
// KV key "bound" bound to it; and in the log after the snapshot: session 2
// (owner "log-holder") holding lock "jobs". Both sessions have a TTL of 1h.
const legacyFixture = "testdata/legacy-datadir.tar.gz"

// TestWriteLegacyFixture writes legacyFixture when FENCE_WRITE_LEGACY_FIXTURE
// is set. It was run once with the code of commit 89a34b7, so that the
// migration test reads what that version wrote; running it again with
// newer code would write a newer data dir.
func TestWriteLegacyFixture(t *testing.T) {
	if os.Getenv("FENCE_WRITE_LEGACY_FIXTURE") == "" {
		t.Skip("set FENCE_WRITE_LEGACY_FIXTURE=1 to write " + legacyFixture)
	}
	dir := t.TempDir()
	s := startTestServer(t, func(c *Config) { c.DataDir = dir })
	url := "http://" + s.Addr()
	ctx := context.Background()
	hc := newAPI(t, s)
	kv := fencev1connect.NewKVServiceClient(http.DefaultClient, url)
	create := func(owner string) uint64 {
		resp, err := hc.sessions.CreateSession(ctx, connect.NewRequest(&fencev1.CreateSessionRequest{Ttl: durationpb.New(time.Hour), Owner: owner}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetSessionId()
	}
	s1 := create("snap-holder")
	hc.mustAcquire(s1, "orders")
	if _, err := kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "bound", Value: []byte("v"), SessionId: s1})); err != nil {
		t.Fatal(err)
	}
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	s2 := create("log-holder")
	hc.mustAcquire(s2, "jobs")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := writeTarGz(dir, legacyFixture); err != nil {
		t.Fatal(err)
	}
}

func writeTarGz(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return f.Close()
}
