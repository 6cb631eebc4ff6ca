package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// New holds nothing until Start: no data dir, no port, no goroutine, and
// Close lets an unstarted node go. A node starts once, and not once
// closed; a second Close answers as the first.
func TestNewHoldsNothingUntilStart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond

	before := runtime.NumGoroutine()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after New, %d before: want none started", n, before)
	}
	if _, err := os.Stat(cfg.DataDir); !os.IsNotExist(err) {
		t.Errorf("the data dir after New: %v, want none made", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close of a node never started: %v", err)
	}
	if err := s.Start(); err == nil {
		t.Error("Start after Close succeeded")
	}

	s, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Start(); err == nil {
		t.Error("a second Start succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatalf("the started node's API port: %v", err)
	}
	c.Close()
	first := s.Close()
	if again := s.Close(); again != first {
		t.Errorf("a second Close answered %v, the first %v", again, first)
	}
	if _, err := net.Dial("tcp", s.Addr()); err == nil {
		t.Error("the API port still answers after Close")
	}
}
