package server

import (
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
