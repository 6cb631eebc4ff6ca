package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fencelock/fence"
)

// Shutdown of a group's leader hands leadership over before it returns:
// another member leads at once, without waiting out an election timeout.
func TestShutdownHandsOffLeadership(t *testing.T) {
	c := startCluster(t, 3, nil)
	old := c.leader()
	term := old.node.raft.CurrentTerm()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := old.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	leaders := 0
	for _, s := range c.followers(old) {
		if s.node.raft.State() == raft.Leader {
			leaders++
			if got := s.node.raft.CurrentTerm(); got <= term {
				t.Errorf("new leader in term %d, want above %d", got, term)
			}
		}
	}
	if leaders != 1 {
		t.Fatalf("%d of the other members lead as Shutdown of the leader returns, want 1", leaders)
	}
}

// Shutdown of a single node, which has nobody to hand over to, closes it.
func TestShutdownSingleNode(t *testing.T) {
	s := startTestServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// While a leader hands over, raft refuses new entries; callers must see
// that as Unavailable (retry on the new leader), not as an internal error.
func TestLeadershipTransferIsUnavailable(t *testing.T) {
	s := startTestServer(t, nil)
	if err := s.node.raftError(raft.ErrLeadershipTransferInProgress); !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("raftError(ErrLeadershipTransferInProgress) = %v, want ErrUnavailable", err)
	}
}
