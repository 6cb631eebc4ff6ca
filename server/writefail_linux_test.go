package server

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A leader whose log write fails (here its disk filled between two looks
// at its free space: the poll that would hand leadership over first is
// off) is stepped down by raft, which tells the others nothing: they would
// elect a leader only once their heartbeat timeout passed. The node knows
// why it stepped down, and asks the voter with the longest log to stand
// for election at once, as a leadership transfer does. (docs/design.md,
// Disk full.)
func TestALeaderWhoseLogWriteFailsHandsOver(t *testing.T) {
	const heartbeat = 3 * time.Second
	c := startCluster(t, 3, func(cfg *Config) {
		cfg.DataDir = filepath.Join(smallDisk(t, "64m"), "data")
		cfg.WALSegmentMB = 1
		cfg.MinFreeDisk = 0
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = heartbeat, heartbeat
	})
	leader := c.leader()
	fill(t, filepath.Dir(leader.cfg.DataDir))
	stepped := make(chan time.Time, 1)
	go func() {
		for leader.node.raft.State() == raft.Leader {
			time.Sleep(2 * time.Millisecond)
		}
		stepped <- time.Now()
	}()
	// Each put adds to the leader's log segment until the segment is full
	// and the next cannot be made.
	kv := c.client(c.endpoints()...).KV()
	value := bytes.Repeat([]byte("x"), 64<<10)
	var at time.Time
	for i := 0; at.IsZero(); i++ {
		if i == 100 {
			t.Fatal("100 puts of 64 KiB went into a 1 MiB segment on a full disk")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = kv.Put(ctx, "big", value)
		cancel()
		select {
		case at = <-stepped:
		default:
		}
	}
	waitForWithin(t, 4*heartbeat, "another node to lead", func() bool {
		return slices.ContainsFunc(c.followers(leader), func(s *Server) bool { return s.leaderReady.Load() })
	})
	took := time.Since(at)
	t.Logf("another node led %v after the leader's write failed", took)
	if took >= heartbeat {
		t.Errorf("another node led %v after the leader's write failed: it waited for its heartbeat timeout (%v)", took, heartbeat)
	}
}
