package apinet

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// workers runs every function handed to it, many at once when they
// block, keeps at most maxIdleWorkers goroutines idle afterwards, and ends
// them all once done is closed.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	done := make(chan struct{})
	w := NewWorkers(done)
	const n = 3 * maxIdleWorkers
	var started, finished sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	finished.Add(n)
	for range n {
		w.Run(func() {
			started.Done()
			<-release // all n block at once: none may wait for another
			finished.Done()
		})
	}
	started.Wait()
	close(release)
	finished.Wait()
	settle := func(want func(int) bool) int {
		deadline := time.Now().Add(10 * time.Second)
		for {
			g := runtime.NumGoroutine() - base
			if want(g) || time.Now().After(deadline) {
				return g
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if g := settle(func(g int) bool { return g <= maxIdleWorkers }); g > maxIdleWorkers {
		t.Errorf("%d goroutines left idle, want at most %d", g, maxIdleWorkers)
	}
	// An idle goroutine takes the next function.
	ran := make(chan struct{})
	w.Run(func() { close(ran) })
	<-ran
	close(done)
	if g := settle(func(g int) bool { return g <= 0 }); g > 0 {
		t.Errorf("%d goroutines left after done closed", g)
	}
}
