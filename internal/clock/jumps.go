package clock

import (
	"sync"
	"time"
)

// minJump is the least move of a clock against the monotonic one, between
// two readings, that counts as time missed: a reading of two clocks is
// not one instant (readOffsets bounds the gap well under it), and moves
// smaller than this are far under any safe-until margin.
const minJump = time.Millisecond

// jumps sums the forward jumps, against the monotonic clock, of the clocks
// that count what it misses. read returns their offsets from it (the
// clock less the monotonic one), and ok false where the system has none.
type jumps struct {
	read func() (boot, wall time.Duration, ok bool)

	mu         sync.Mutex
	started    bool
	boot, wall time.Duration // the offsets at the last reading
	total      time.Duration
}

// missed reads the offsets and returns the jumps counted, in all. A
// suspend moves both offsets on by its length, and counts once; a wall
// clock set back counts nothing, and its jump forward again from there
// counts. The reading is made under the lock, so that readings are taken
// in the order they are counted.
func (j *jumps) missed() time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	boot, wall, ok := j.read()
	if !ok {
		return j.total
	}
	if j.started {
		if jump := max(boot-j.boot, wall-j.wall); jump >= minJump {
			j.total += jump
		}
	}
	j.started, j.boot, j.wall = true, boot, wall
	return j.total
}

// systemJumps are the system's clocks' jumps, for Real.
var systemJumps = &jumps{read: readOffsets}
