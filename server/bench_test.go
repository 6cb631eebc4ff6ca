package server

import (
	"context"
	"fmt"
	"testing"

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

// BenchmarkConfirmLeadership measures what a keepalive or a linearizable
// read waits for after it arrives (leaseConfirmer): nothing on a sole
// voter, a barrier committed on a quorum in a group. Run in parallel, the
// rounds are shared among waiting calls.
func BenchmarkConfirmLeadership(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			var s *Server
			if nodes == 1 {
				s = startTestServer(b, nil)
			} else {
				s = startCluster(b, nodes, nil).leader()
			}
			ctx := context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := s.confirmer.wait(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkProposeParallel measures commits proposed by many goroutines at
// once, as concurrent clients propose them: the batcher groups those that
// arrive while an entry is being committed into one entry.
func BenchmarkProposeParallel(b *testing.B) {
	s := startTestServer(b, nil)
	b.SetParallelism(8) // 16 proposers on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_LiftDelay{LiftDelay: &fsmpb.LiftDelay{Lock: "x"}}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
