package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fence/client"
)

// nodeDiskSize is the size of each node's own small disk under the
// disk-full fault: room for a run's log and snapshots, small enough to
// fill in a moment.
const nodeDiskSize = 256 << 20

// fillDisk fills the disk of the leader, or of a follower, for 1 to 3s,
// then frees it. The node must answer writes DISK_FULL (or be passed over
// for another leader) and lose nothing; once freed, it must take its part
// again without a restart.
func (r *runner) fillDisk(ctx context.Context, ev *FaultEvent) bool {
	kind := FaultPauseLeader
	if len(r.nodes) > 1 && r.rng.IntN(2) == 0 {
		kind = FaultPauseFollower
	}
	n := r.pauseTarget(kind)
	hold := time.Duration((1 + 2*r.rng.Float64()) * float64(time.Second))
	if n == nil {
		return false
	}
	ev.Target = n.name()
	ev.Start = time.Now()
	filler := filepath.Join(n.dir, "filler")
	if err := fillUp(filler); err != nil {
		fmt.Fprintf(r.log, "check: filling the disk of %s: %v\n", n.name(), err)
	}
	if r.reportsDiskFull(ctx, n, hold) {
		ev.Note = "reported by the node"
	}
	if err := os.Remove(filler); err != nil {
		fmt.Fprintf(r.log, "check: freeing the disk of %s: %v\n", n.name(), err)
	}
	return true
}

// reportsDiskFull watches n for hold: whether its status says its disk is
// full, or its log that a write found no space.
func (r *runner) reportsDiskFull(ctx context.Context, n *node, hold time.Duration) bool {
	logFile := n.dir + ".log"
	var from int64
	if fi, err := os.Stat(logFile); err == nil {
		from = fi.Size()
	}
	c, err := client.New(client.WithEndpoints(n.api), client.WithClusterID(r.clusterID))
	if err != nil {
		sleep(ctx, hold)
		return false
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, hold)
	defer cancel()
	reported := false
	for ctx.Err() == nil {
		if st, err := c.StatusOf(ctx, n.api); err == nil && !reported {
			reported = slices.ContainsFunc(st.GetProblems(), func(p string) bool { return strings.HasPrefix(p, "disk full") })
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return reported || logged(logFile, from, "no space left on device")
}

// logged reports whether the file at path has text past offset from.
func logged(path string, from int64, text string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, from, 1<<30))
	return err == nil && strings.Contains(string(data), text)
}

// fillUp writes the file at path until the disk under it has no room left.
func fillUp(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return f.Sync()
			}
			return err
		}
	}
}

// mountDisks gives every node a small disk of its own for its data dir.
func (r *runner) mountDisks() error {
	for _, n := range r.nodes {
		if err := os.MkdirAll(n.dir, 0o700); err != nil {
			return err
		}
		if err := mountSmallDisk(n.dir, nodeDiskSize); err != nil {
			return fmt.Errorf("disk-full: giving %s a disk of its own: %w", n.name(), err)
		}
		n.mounted = true
	}
	return nil
}

// unmountDisks undoes mountDisks, once the nodes are stopped.
func (r *runner) unmountDisks() {
	for _, n := range r.nodes {
		if n.mounted {
			if err := unmountSmallDisk(n.dir); err != nil {
				fmt.Fprintf(r.log, "check: unmounting the disk of %s at %s: %v\n", n.name(), n.dir, err)
			}
			n.mounted = false
		}
	}
}
