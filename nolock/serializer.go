package nolock

import (
	"context"
	"hash/fnv"
	"sync"
)

// Serializer gives each key a single writer within a process: Do runs the
// functions submitted for one key one at a time, in the order Do was
// called, and those of different keys concurrently. Route every write of
// a key to one process (Partition picks it) and a Serializer there, and the
// key's writes never race, with no lock at all. The zero value is ready.
type Serializer struct {
	mu    sync.Mutex
	tails map[string]*turn
}

// turn is one call's place in its key's queue.
type turn struct {
	done chan struct{} // closed when the call is over
}

// Do waits for the calls of key before it, then runs fn. If ctx ends while
// it waits, it returns ctx's error without running fn, and the calls after
// it still wait for those before it.
func (s *Serializer) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	prev, me := s.enqueue(key)
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			go func() { // keep the order: hand on only once the calls before are over
				<-prev
				s.finish(key, me)
			}()
			return ctx.Err()
		}
	}
	defer s.finish(key, me)
	return fn(ctx)
}

// enqueue makes a call the tail of key's queue and returns the done
// channel of the call before it (nil if none) and its own turn.
func (s *Serializer) enqueue(key string) (<-chan struct{}, *turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tails == nil {
		s.tails = map[string]*turn{}
	}
	me := &turn{done: make(chan struct{})}
	prev := s.tails[key]
	s.tails[key] = me
	if prev == nil {
		return nil, me
	}
	return prev.done, me
}

// finish ends a call: the next one may run, and a key whose last call
// this was is forgotten.
func (s *Serializer) finish(key string, me *turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(me.done)
	if s.tails[key] == me {
		delete(s.tails, key)
	}
}

// Partition maps key to one of n partitions (0 to n-1), the same for the
// same key in every process and every run (FNV-1a), for routing each key's
// writes to one worker, queue partition or process.
func Partition(key string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}
