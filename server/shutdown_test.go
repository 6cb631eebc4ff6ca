package server

import (
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/fsmpb"
)

// Close returns while proposals are still queued for raft: raft answers
// none of those once it has shut down, and a proposal waiting on its
// answer alone held Close for ever.
func TestCloseWithProposalsInFlight(t *testing.T) {
	for range 20 {
		s := startTestServer(t, nil)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					s.node.propose(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{TtlNs: int64(time.Minute)}}})
				}
			})
		}
		time.Sleep(20 * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatal("Close did not return within 20s of proposals in flight")
		}
		close(stop)
		wg.Wait()
	}
}
