package server

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// failingLog is a node's raft-wal log whose appends fail with EIO once
// armed: the disk below it failing, which no loopback test can make a real
// disk do. The node is assembled around it as around its own.
type failingLog struct {
	raft.LogStore
	fail atomic.Bool
}

func (l *failingLog) StoreLog(log *raft.Log) error { return l.StoreLogs([]*raft.Log{log}) }

func (l *failingLog) StoreLogs(logs []*raft.Log) error {
	if l.fail.Load() {
		return &os.PathError{Op: "write", Path: "wal", Err: syscall.EIO}
	}
	return l.LogStore.StoreLogs(logs)
}

// withFailingLogs has every node of the group opened by edit keep its log
// behind a failingLog, which logs returns by node id.
func withFailingLogs() (edit func(*Config), logs func(id string) *failingLog) {
	var mu sync.Mutex
	byID := map[string]*failingLog{}
	edit = func(cfg *Config) {
		cfg.openParts = func(cfg Config, hlog hclog.Logger, logger *slog.Logger, opened func(uint64)) (nodeParts, error) {
			parts, err := openParts(cfg, hlog, logger, opened)
			if err != nil {
				return parts, err
			}
			l := &failingLog{LogStore: parts.logs}
			parts.logs = l
			mu.Lock()
			byID[cfg.NodeID] = l
			mu.Unlock()
			return parts, nil
		}
	}
	return edit, func(id string) *failingLog {
		mu.Lock()
		defer mu.Unlock()
		return byID[id]
	}
}

// A leader whose disk fails its writes with an I/O error (not a full
// disk, which TestALeaderWhoseLogWriteFailsHandsOver fills a real one
// for) hands leadership over at once too, rather than leave the others
// to wait for their heartbeat timeout; its hellos then say its writes fail.
func TestALeaderWhoseDiskFailsHandsOver(t *testing.T) {
	const heartbeat = 3 * time.Second
	failing, logOf := withFailingLogs()
	c := startCluster(t, 3, func(cfg *Config) {
		failing(cfg)
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = heartbeat, heartbeat
	})
	leader := c.leader()
	logOf(leader.cfg.NodeID).fail.Store(true)
	wantHandOver(t, c, leader, heartbeat)
	if h := leader.node.hello(); !h.WriteFailing || h.LowDisk {
		t.Errorf("the old leader's hello says write failing %v, low disk %v; want true, false", h.WriteFailing, h.LowDisk)
	}
}

// wantHandOver puts until leader steps down, and wants another node to
// lead within its heartbeat timeout: the leader handed over.
func wantHandOver(t *testing.T, c *testCluster, leader *Server, heartbeat time.Duration) {
	t.Helper()
	at := putUntilStepsDown(t, c, leader)
	waitForWithin(t, 4*heartbeat, "another node to lead", func() bool {
		return slices.ContainsFunc(c.followers(leader), func(s *Server) bool { return s.leaderReady.Load() })
	})
	took := time.Since(at)
	t.Logf("another node led %v after the leader's write failed", took)
	if took >= heartbeat {
		t.Errorf("another node led %v after the leader's write failed: it waited for its heartbeat timeout (%v)", took, heartbeat)
	}
}

// putUntilStepsDown puts 64 KiB values until leader is no longer raft's
// leader, and returns when it saw that.
func putUntilStepsDown(t *testing.T, c *testCluster, leader *Server) time.Time {
	t.Helper()
	stepped := make(chan time.Time, 1)
	go func() {
		for leader.node.raft.State() == raft.Leader {
			time.Sleep(2 * time.Millisecond)
		}
		stepped <- time.Now()
	}()
	kv := c.client(c.endpoints()...).KV()
	value := bytes.Repeat([]byte("x"), 64<<10)
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatalf("%s still leads after 100 puts of 64 KiB", leader.cfg.NodeID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = kv.Put(ctx, "big", value)
		cancel()
		select {
		case at := <-stepped:
			return at
		default:
		}
	}
}
