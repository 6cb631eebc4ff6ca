package client

import (
	"sync"
	"time"

	"github.com/fencelock/fence/internal/clock"
)

// wakeCheck is how often a client with live sessions looks whether its
// clock missed time (clock.Clock.Missed: the machine was suspended, the
// wall clock set forward): a session whose safe-until passed meanwhile
// ends within about this long after the process runs again.
const wakeCheck = 100 * time.Millisecond

// awareNow is the instant on the timeline of the client's session
// schedules and safe-until deadlines: its clock moved on by everything it
// missed (clock.Aware), so that a suspend brings them closer by its length
// instead of pushing them later.
func (c *Client) awareNow() time.Time { return clock.Aware(c.opts.clock) }

// wakeWatch moves the timers of a client's sessions when the clock missed
// time. Those timers run on the monotonic clock, which stands still while
// the machine is suspended: after a resume they would fire as late as the
// suspend was long, and a session whose safe-until passed meanwhile would
// live on until its next renewal fell due. One timer per client looks
// every wakeCheck, while the client has sessions; when time was missed,
// every session rearms its timers from the deadlines it holds (a lapsed
// one ends as lost at once, one still safe renews at once if due).
type wakeWatch struct {
	c *Client

	mu       sync.Mutex
	sessions map[*Session]struct{}
	timer    clock.Timer // nil while there is no session
	seen     time.Duration
}

// add counts s among the sessions to rearm, and starts looking if s is
// the first.
func (w *wakeWatch) add(s *Session) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sessions == nil {
		w.sessions = map[*Session]struct{}{}
	}
	w.sessions[s] = struct{}{}
	if w.timer == nil {
		w.seen = w.c.opts.clock.Missed()
		w.timer = w.c.opts.clock.AfterFunc(wakeCheck, w.check)
	}
}

// remove forgets s, and stops looking after the last session.
func (w *wakeWatch) remove(s *Session) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.sessions, s)
	if len(w.sessions) == 0 && w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}

// check rearms every session if the clock missed time since it last
// looked, and looks again after wakeCheck.
func (w *wakeWatch) check() {
	missed := w.c.opts.clock.Missed()
	w.mu.Lock()
	if w.timer == nil {
		w.mu.Unlock()
		return // no session left
	}
	var rearm []*Session
	if missed > w.seen {
		w.seen = missed
		for s := range w.sessions {
			rearm = append(rearm, s)
		}
	}
	w.timer.Reset(wakeCheck)
	w.mu.Unlock()
	for _, s := range rearm {
		s.rearm()
	}
}
