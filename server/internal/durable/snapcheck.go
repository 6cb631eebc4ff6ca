package durable

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"
)

// RemoveUnfinishedSnapshots deletes the directories of snapshots whose
// writing never finished (raft names them *.tmp until they are complete).
// Nothing reads them, and a node that crashed while writing snapshots, or
// failed to write them for want of disk or file descriptors, would keep
// them forever. The data dir is locked, so no other process writes there.
func RemoveUnfinishedSnapshots(dataDir string, logger *slog.Logger) {
	tmps, _ := filepath.Glob(filepath.Join(dataDir, "snapshots", "*.tmp"))
	for _, dir := range tmps {
		if err := os.RemoveAll(dir); err != nil {
			logger.Warn("could not remove an unfinished snapshot", "dir", dir, "err", err)
			continue
		}
		logger.Info("removed an unfinished snapshot", "dir", dir)
	}
}

// CheckSnapshots makes sure raft can rebuild the state from what is on
// disk: the newest snapshot that opens intact (raft checks its CRC on open,
// and skips snapshots it cannot read, falling back to older ones) and the
// log entries after it. Where a damaged snapshot leaves a gap between the
// intact one and the log's first entry, raft would panic while starting
// ("log not found"); this says what is wrong instead.
func CheckSnapshots(dataDir string, snaps raft.SnapshotStore, logs raft.LogStore, logger *slog.Logger) error {
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	damaged := unreadableSnapshots(dataDir, metas)
	var base uint64 // the index the intact snapshot restores to
	for _, meta := range metas {
		_, rc, err := snaps.Open(meta.ID)
		if err != nil {
			damaged = append(damaged, fmt.Sprintf("%s (%v)", meta.ID, err))
			continue
		}
		rc.Close()
		base = meta.Index
		break
	}
	for _, d := range damaged {
		logger.Error("snapshot is damaged; starting from an older one where the log allows", "snapshot", d)
	}
	first, last, err := logBounds(logs)
	if err != nil {
		return err
	}
	if last == 0 || first <= base+1 {
		return nil
	}
	from := "an empty state"
	if base > 0 {
		from = fmt.Sprintf("the newest intact snapshot, at index %d", base)
	}
	why := "no snapshot is left"
	if len(damaged) > 0 {
		why = "damaged snapshots: " + strings.Join(damaged, "; ")
	}
	return fmt.Errorf("the state in %s cannot be rebuilt: %s; the log begins at index %d, after %s, and the entries between are gone.\n%s",
		dataDir, why, first, from, recoveryAdvice)
}

// unreadableSnapshots names the snapshot directories raft's List passed
// over because their metadata does not read.
func unreadableSnapshots(dataDir string, listed []*raft.SnapshotMeta) []string {
	known := make(map[string]bool, len(listed))
	for _, m := range listed {
		known[m.ID] = true
	}
	dirs, _ := os.ReadDir(filepath.Join(dataDir, "snapshots"))
	var out []string
	for _, d := range dirs {
		if d.IsDir() && !strings.HasSuffix(d.Name(), ".tmp") && !known[d.Name()] {
			out = append(out, fmt.Sprintf("%s (its meta.json does not read)", d.Name()))
		}
	}
	return out
}
