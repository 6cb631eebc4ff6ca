package clock

import (
	"runtime"
	"testing"
	"time"
)

// The jumps counted from a sequence of readings of the offsets of
// CLOCK_BOOTTIME and of the wall clock from the monotonic clock.
func TestJumps(t *testing.T) {
	type offsets struct{ boot, wall time.Duration }
	const s = time.Second
	for _, tc := range []struct {
		name     string
		readings []offsets
		want     time.Duration
	}{
		{"first reading", []offsets{{5 * s, 1000 * s}}, 0},
		{"steady", []offsets{{0, 1000 * s}, {0, 1000 * s}, {0, 1000 * s}}, 0},
		{"a suspend moves both, counts once", []offsets{{0, 1000 * s}, {7 * s, 1007 * s}}, 7 * s},
		{"a paused VM's wall clock set forward", []offsets{{0, 1000 * s}, {0, 1004 * s}}, 4 * s},
		{"the larger of two moves", []offsets{{0, 1000 * s}, {3 * s, 1005 * s}}, 5 * s},
		{"jumps add up", []offsets{{0, 1000 * s}, {2 * s, 1002 * s}, {2 * s, 1002 * s}, {2 * s, 1005 * s}}, 5 * s},
		{"a wall clock set back counts nothing", []offsets{{0, 1000 * s}, {0, 997 * s}}, 0},
		{"forward again after back counts", []offsets{{0, 1000 * s}, {0, 997 * s}, {0, 1000 * s}}, 3 * s},
		{"moves under a millisecond are noise", []offsets{{0, 1000 * s}, {0, 1000*s + 900*time.Microsecond}, {0, 1000*s + 1800*time.Microsecond}}, 0},
		{"a millisecond counts", []offsets{{0, 1000 * s}, {time.Millisecond, 1000 * s}}, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			j := &jumps{read: func() (time.Duration, time.Duration, bool) {
				r := tc.readings[i]
				i++
				return r.boot, r.wall, true
			}}
			var got time.Duration
			for range tc.readings {
				m := j.missed()
				if m < got {
					t.Fatalf("missed went back from %v to %v", got, m)
				}
				got = m
			}
			if got != tc.want {
				t.Fatalf("missed %v, want %v", got, tc.want)
			}
		})
	}
	none := &jumps{read: func() (time.Duration, time.Duration, bool) { return 0, 0, false }}
	if m := none.missed(); m != 0 {
		t.Fatalf("with no clock to compare, missed %v", m)
	}
}

// On Linux the real clock reads CLOCK_BOOTTIME and the wall clock; a
// machine that is not suspended meanwhile misses nothing in a short while.
// Elsewhere it misses nothing ever.
func TestRealMissesNothingWhileAwake(t *testing.T) {
	if _, _, ok := readOffsets(); ok != (runtime.GOOS == "linux") {
		t.Fatalf("offsets readable on %s: %v", runtime.GOOS, ok)
	}
	before := Real.Missed()
	time.Sleep(50 * time.Millisecond)
	if d := Real.Missed() - before; d != 0 {
		t.Fatalf("missed %v in 50ms awake", d)
	}
}

// Fake's Suspend moves Missed on, and neither Now nor its timers.
func TestFakeSuspend(t *testing.T) {
	f := NewFake()
	now := f.Now()
	fired := make(chan struct{}, 1)
	f.AfterFunc(time.Second, func() { fired <- struct{}{} })
	f.Suspend(time.Minute)
	if f.Missed() != time.Minute || !f.Now().Equal(now) || !Aware(f).Equal(now.Add(time.Minute)) {
		t.Fatalf("after a suspend of 1m: missed %v, now moved %v, aware moved %v", f.Missed(), f.Now().Sub(now), Aware(f).Sub(now))
	}
	select {
	case <-fired:
		t.Fatal("a suspend fired a timer")
	case <-time.After(10 * time.Millisecond):
	}
	if f.Timers() != 1 {
		t.Fatalf("%d timers armed after a suspend, want 1", f.Timers())
	}
}
