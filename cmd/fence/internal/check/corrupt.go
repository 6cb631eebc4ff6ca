package check

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fencelock/fence/internal/walfmt"
)

// corruptFollower kills a follower, damages the open segment of its raft
// log the way a disk does, and starts it again. Damage in the middle (a
// frame header flipped, with acknowledged batches after it) must make the
// node refuse to start and say so; a write torn at the very end (the last
// commit frame lost) must not, as that batch was never acknowledged by
// this node's disk. A node that refused has its damage undone, as a restore
// from a backup would, and is started again. Once begun, the fault runs
// to its end even if the run's time is up meanwhile: waited for with the
// run's context, an ended run would pass for a node that started.
func (r *runner) corruptFollower(ctx context.Context, ev *FaultEvent) bool {
	ctx = context.WithoutCancel(ctx)
	n := r.pauseTarget(FaultPauseFollower)
	if n == nil {
		return false
	}
	middle := r.rng.IntN(2) == 0
	kill(n.proc)
	undo, err := damageLog(n.dir, middle)
	if err != nil {
		fmt.Fprintf(r.log, "check: %s: %v; restarting it as it is\n", n.name(), err)
		r.relaunch(n)
		return false
	}
	ev.Target = n.name() + map[bool]string{true: " (middle)", false: " (torn tail)"}[middle]
	mark, _ := os.Stat(n.dir + ".log")
	r.relaunch(n)
	refused := n.proc.Wait(ctx, 5*time.Second) == nil
	log := logSince(n.dir+".log", mark)
	switch {
	case middle && !refused:
		r.addViolation(Violation{Kind: ViolationCorruptionMissed, Detail: fmt.Sprintf("%s started on a raft log damaged in the middle", n.name())})
	case middle && !strings.Contains(log, "damaged"):
		r.addViolation(Violation{Kind: ViolationCorruptionMissed, Detail: fmt.Sprintf("%s stopped on a damaged raft log without saying so:\n%s", n.name(), log)})
	case !middle && refused:
		r.addViolation(Violation{Kind: ViolationTornTailRefused, Detail: fmt.Sprintf("%s would not start after a write torn at the end of its log:\n%s", n.name(), log)})
	}
	if refused {
		// The refusal wrote nothing; undo the damage, as a restore would.
		// (A node that started has written over it, and runs on.)
		if err := undo(); err != nil {
			fmt.Fprintf(r.log, "check: repairing %s: %v\n", n.name(), err)
		}
		r.relaunch(n)
	}
	return true
}

func (r *runner) relaunch(n *node) {
	if err := n.launch(); err != nil {
		fmt.Fprintf(r.log, "check: restarting %s: %v\n", n.name(), err)
	}
}

// damageLog damages the open segment of the raft log in a node's data dir:
// in the middle, 16 bytes flipped from the header of an entry frame a third
// of the way in; at the end, the last commit frame zeroed. It returns how
// to undo it.
func damageLog(dataDir string, middle bool) (undo func() error, err error) {
	segs, err := walfmt.Segments(filepath.Join(dataDir, "wal"))
	if err != nil || len(segs) == 0 {
		return nil, fmt.Errorf("no raft-wal segment to damage (%v)", err)
	}
	path := segs[len(segs)-1].Path
	data, err := walfmt.ReadWritten(path)
	if err != nil {
		return nil, err
	}
	var off, size int
	if middle {
		entries := entriesBeforeTwoCommits(data)
		if len(entries) < 10 {
			return nil, fmt.Errorf("its open segment holds %d entries with two batches after them, too few to damage one in the middle", len(entries))
		}
		off, size = entries[len(entries)/3], 16
	} else {
		off, size = len(data)-walfmt.FrameHeaderLen, walfmt.FrameHeaderLen
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	saved := append([]byte(nil), data[off:off+size]...)
	damaged := make([]byte, size)
	for i := range damaged {
		if middle {
			damaged[i] = saved[i] ^ 0xff
		}
	}
	if _, err := f.WriteAt(damaged, int64(off)); err != nil {
		return nil, err
	}
	return func() error {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.WriteAt(saved, int64(off))
		return err
	}, nil
}

// entriesBeforeTwoCommits returns the entry frames followed by at least two
// commit frames: damage there is not in the last batch, so it cannot pass
// for a torn write.
func entriesBeforeTwoCommits(data []byte) []int {
	var entries, commits []int
	walfmt.Walk(data, func(off int, f walfmt.Frame) {
		switch f.Type {
		case walfmt.FrameEntry:
			entries = append(entries, off)
		case walfmt.FrameCommit:
			commits = append(commits, off)
		}
	})
	if len(commits) < 2 {
		return nil
	}
	last := commits[len(commits)-2]
	for i, e := range entries {
		if e > last {
			return entries[:i]
		}
	}
	return entries
}

// logSince returns what was appended to a log file after it had the size
// in mark (nil: all of it).
func logSince(path string, mark os.FileInfo) string {
	data, _ := os.ReadFile(path)
	if mark != nil && mark.Size() <= int64(len(data)) {
		data = data[mark.Size():]
	}
	return string(data)
}
