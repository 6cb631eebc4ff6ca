package server

import (
	"context"
	"sync"
)

// leaseConfirmer proves to callers that this node was still the leader
// after their call arrived, for the answers a client turns into a safety
// deadline (a keepalive) or takes as the present state (a linearizable
// read). Without it a leader that was paused, and replaced while it slept,
// answers from its memory on the strength of a leader flag that only
// raft's notice of the new term clears.
//
// Each round runs confirm once for every caller that arrived before the
// round began, so that any number of concurrent keepalives and reads cost
// one round; a caller that arrives while a round runs waits for the next
// one, which starts after it arrived.
type leaseConfirmer struct {
	confirm func() error

	mu      sync.Mutex
	next    *confirmRound // the round that new callers join; nil when none is due
	running bool          // a goroutine runs rounds
}

type confirmRound struct {
	done chan struct{}
	err  error
}

func newLeaseConfirmer(confirm func() error) *leaseConfirmer {
	return &leaseConfirmer{confirm: confirm}
}

// wait returns nil once a round that began after the call has confirmed
// the leadership, the round's error if it failed, or ctx's error.
func (c *leaseConfirmer) wait(ctx context.Context) error {
	c.mu.Lock()
	if c.next == nil {
		c.next = &confirmRound{done: make(chan struct{})}
	}
	r := c.next
	if !c.running {
		c.running = true
		go c.run()
	}
	c.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run runs rounds while callers are waiting for one.
func (c *leaseConfirmer) run() {
	for {
		c.mu.Lock()
		r := c.next
		c.next = nil
		if r == nil {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		r.err = c.confirm()
		close(r.done)
	}
}
