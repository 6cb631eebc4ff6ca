package apinet

import "sync/atomic"

// maxIdleWorkers bounds the goroutines a Workers keeps waiting for work:
// about the operations a busy node runs at once, at a few KiB of stack each.
const maxIdleWorkers = 128

// Workers runs functions on goroutines kept between calls, for the work
// done once per operation (a stream operation, a wait on raft). A
// goroutine started for each call begins with a small stack and grows it,
// copying it, on nearly every operation that reaches raft: the proposal's
// encoding and raft's call chain run deep. A goroutine kept keeps the
// stack it grew, and costs no start.
//
// Run never blocks: without an idle goroutine, it starts one. Idle
// goroutines beyond maxIdleWorkers end, and all end once done is closed.
// A function run must not expect to run on a goroutine of its own past its
// return (no goroutine-local state is involved: Go has none).
type Workers struct {
	work chan func() // unbuffered: a send succeeds only to an idle goroutine
	done <-chan struct{}

	idle atomic.Int32
}

// NewWorkers returns a pool whose goroutines end once done is closed.
func NewWorkers(done <-chan struct{}) *Workers {
	return &Workers{work: make(chan func()), done: done}
}

// Run calls f on an idle goroutine, or on a new one.
func (w *Workers) Run(f func()) {
	select {
	case w.work <- f:
	default:
		go w.serve(f)
	}
}

// serve calls f, then each function handed to it while it is idle, until
// too many others are idle or done is closed.
func (w *Workers) serve(f func()) {
	for {
		f()
		if !w.becomeIdle() {
			return
		}
		select {
		case f = <-w.work:
			w.leaveIdle()
		case <-w.done:
			w.leaveIdle()
			return
		}
	}
}

// becomeIdle counts the calling goroutine idle, unless enough are.
func (w *Workers) becomeIdle() bool {
	if w.idle.Add(1) > maxIdleWorkers {
		w.idle.Add(-1)
		return false
	}
	return true
}

func (w *Workers) leaveIdle() { w.idle.Add(-1) }
