package check

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/server"
)

func startNode(t *testing.T) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.WaitLeader(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// A run whose endpoints name nodes of two groups would mix two histories,
// and report tokens granted twice and increments lost that neither group
// lost: the checker refuses to start it.
func TestGroupOfRefusesTwoGroups(t *testing.T) {
	ctx := context.Background()
	a, b := startNode(t), startNode(t)
	id, err := groupOf(ctx, []string{a.Addr()})
	if err != nil || id == "" {
		t.Fatalf("groupOf one node: %q, %v; want its group", id, err)
	}
	if _, err := groupOf(ctx, []string{a.Addr(), b.Addr()}); !errors.Is(err, fence.ErrWrongCluster) {
		t.Fatalf("groupOf nodes of two groups: %v, want ErrWrongCluster", err)
	}
}
