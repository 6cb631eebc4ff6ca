package server

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// snapshotDirs returns a data dir's finished snapshots, oldest first.
func snapshotDirs(t *testing.T, dataDir string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(dataDir, "snapshots", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		if !strings.HasSuffix(d, ".tmp") {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

func snapshot(t *testing.T, s *Server) {
	t.Helper()
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
}

// putAndSnapshot writes keys k<from>..k<to-1> and takes a snapshot.
func putAndSnapshot(t *testing.T, s *Server, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		put(t, s, fmt.Sprintf("k%d", i), value(i))
	}
	snapshot(t, s)
}

// A damaged newest snapshot is passed over for an older intact one when
// the log still holds the entries since.
func TestDamagedSnapshotFallsBackToAnOlderOne(t *testing.T) {
	damage := map[string]func(t *testing.T, dir string){
		"meta.json": func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "meta.json"), []byte("{\"Version\": 1, \"ID\": tor"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"state.bin": func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "state.bin"), 20, 16) },
	}
	for name, spoil := range damage {
		t.Run(name, func(t *testing.T) {
			c := newCorruptionNode(t, LogStoreWAL, nil)
			c.run(func(s *Server) {
				putAndSnapshot(t, s, 0, 10)
				putAndSnapshot(t, s, 10, 20)
			})
			dirs := snapshotDirs(t, c.cfg.DataDir)
			if len(dirs) != 2 {
				t.Fatalf("snapshots: %v", dirs)
			}
			spoil(t, dirs[1])
			c.run(func(s *Server) {
				for i := range 20 {
					if got := valueOf(s, fmt.Sprintf("k%d", i)); got != value(i) {
						t.Errorf("k%d = %q, want %q", i, got, value(i))
					}
				}
			})
		})
	}
}

// When the log no longer holds the entries since the older snapshot, the
// node says so and stops; raft panicked with "log not found".
func TestDamagedSnapshotWithoutTheLogStopsTheNode(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, func(cfg *Config) { cfg.SnapshotThreshold = 4 })
	c.run(func(s *Server) { putAndSnapshot(t, s, 0, 20) })
	dirs := snapshotDirs(t, c.cfg.DataDir)
	if err := os.WriteFile(filepath.Join(dirs[len(dirs)-1], "meta.json"), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := c.startErr()
	for _, want := range []string{"cannot be rebuilt", filepath.Base(dirs[len(dirs)-1]), "meta.json", "the log begins at index", "--join"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

func TestUnfinishedSnapshotsAreRemovedAtStart(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	c.run(func(s *Server) {})
	tmp := filepath.Join(c.cfg.DataDir, "snapshots", "2-10-1700000000000.tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	c.run(func(s *Server) {})
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("the unfinished snapshot is still there: %v", err)
	}
}
