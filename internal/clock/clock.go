// Package clock lets time-based code take its clock as a dependency, so that
// tests drive a fake one by hand instead of sleeping.
//
// Real is the system's monotonic clock. Fake starts at a fixed instant and
// moves only when Advance is called; timers due by then fire in deadline order.
//
// The monotonic clock misses time: on Linux it stops while the machine is
// suspended, and so does every clock of a VM that is paused. Missed counts
// what it missed, where the system can tell (see Real), and Aware adds it
// to Now, for deadlines that must not outlive a suspend.
//
// It stands on the ground floor: the client's session deadlines and the
// server's expiry and keepalive schedules take a Clock from it.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of session deadlines, keepalive schedules, wait
// timeouts and the client's "safe until". Implementations are safe for
// concurrent use.
type Clock interface {
	// Now returns the current time. Durations between two Now values of a
	// Real clock are monotonic.
	Now() time.Time
	// NewTimer returns a timer that sends the time on C after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
	// Missed returns how much time, in all since an arbitrary origin, passed
	// without Now counting it: a suspend, a wall clock set forward. It never
	// decreases; only the difference of two readings means anything.
	// Timers do not count it either: one due in d fires when Now has moved
	// on by d.
	Missed() time.Duration
}

// Aware returns c's Now moved on by everything Now missed (Missed): an
// instant on a timeline that goes on through a suspend. The duration
// between two such instants is the time that passed by every clock c
// reads.
func Aware(c Clock) time.Time { return c.Now().Add(c.Missed()) }

// Timer is the part of *time.Timer that fence uses.
type Timer interface {
	// C is nil for timers made by AfterFunc.
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the system clock. Its Missed, on Linux, sums every forward jump
// against the monotonic clock of CLOCK_BOOTTIME (which goes on while the
// machine is suspended) and of the wall clock (set forward when a paused VM
// resumes and syncs it), a jump being the larger of the two between two
// readings, of a millisecond or more. A VM paused with all of its clocks,
// and never set forward, shows no jump. On other systems Missed is always 0.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Missed() time.Duration { return systemJumps.missed() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// Fake is a clock that moves only when told to. The zero value is not
// usable; call NewFake.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	missed time.Duration
	timers []*fakeTimer
	// changed is closed and replaced whenever a timer is added, so that
	// tests can wait for the code under test to arm one.
	changed chan struct{}
}

// NewFake returns a fake clock set to a fixed instant.
func NewFake() *Fake {
	return &Fake{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// AfterFunc calls fn in its own goroutine when the fake time reaches now+d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{clock: f, fn: fn}
	t.Reset(d)
	return t
}

// Missed returns the time Suspend added, in all.
func (f *Fake) Missed() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.missed
}

// Suspend moves on by d the time Now missed (Missed), as a suspend of d, or
// a wall clock set forward by d, would: Now stays, and no timer fires.
func (f *Fake) Suspend(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.missed += d
}

// Advance moves the fake time forward by d and fires every timer that is due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	now := f.now
	var due []*fakeTimer
	kept := f.timers[:0]
	for _, t := range f.timers {
		if !t.when.After(now) {
			due = append(due, t)
		} else {
			kept = append(kept, t)
		}
	}
	f.timers = kept
	f.mu.Unlock()
	sort.SliceStable(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	for _, t := range due {
		t.fire(now)
	}
}

// Timers returns how many timers are armed.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// WaitForTimers blocks until at least n timers are armed, so a test can
// advance the clock only once the code under test is waiting on it.
func (f *Fake) WaitForTimers(n int) {
	for {
		f.mu.Lock()
		armed, changed := len(f.timers), f.changed
		f.mu.Unlock()
		if armed >= n {
			return
		}
		<-changed
	}
}

type fakeTimer struct {
	clock *Fake
	c     chan time.Time
	fn    func()
	when  time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) fire(now time.Time) {
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.c <- now:
	default:
	}
}

// Stop disarms the timer and reports whether it was armed.
func (t *fakeTimer) Stop() bool {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removeLocked(t)
}

// Reset rearms the timer to fire d after the fake now and reports whether it
// was armed.
func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.clock
	f.mu.Lock()
	armed := f.removeLocked(t)
	t.when = f.now.Add(d)
	if d <= 0 {
		now := f.now
		f.mu.Unlock()
		t.fire(now)
		return armed
	}
	f.timers = append(f.timers, t)
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	return armed
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			return true
		}
	}
	return false
}
