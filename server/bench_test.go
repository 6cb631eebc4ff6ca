package server

import (
	"testing"
	"time"

	"github.com/fencelock/fence/internal/fsmpb"
)

// BenchmarkPropose measures one raft commit on a single node with a real
// bbolt log on disk: the floor under every write.
func BenchmarkPropose(b *testing.B) {
	s := startTestServer(b, nil)
	for b.Loop() {
		if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_LiftDelay{LiftDelay: &fsmpb.LiftDelay{Lock: "x"}}}); err != nil {
			b.Fatal(err)
		}
	}
}

func startTestServer(tb testing.TB, edit func(*Config)) *Server {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for !s.node.isLeader() {
		if time.Now().After(deadline) {
			tb.Fatal("no leader after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s
}
