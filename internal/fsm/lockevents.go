package fsm

import "time"

// LockEventKind says what happened to a lock (docs/design.md, "Watching
// locks").
type LockEventKind uint8

const (
	// LockGranted: a session was granted the lock (Token), at once or as
	// a waiter the lock was handed to.
	LockGranted LockEventKind = iota + 1
	// LockReleased: a holder let go of its grant: a Release, a
	// CancelAcquire of the grant, or its session's close by its own
	// client (End is then Closed).
	LockReleased
	// LockExpired, LockRevoked and LockAbandoned: a holder's session
	// ended otherwise than by its own close, and its grant with it.
	LockExpired
	LockRevoked
	LockAbandoned
	// LockQueued: a session joined the lock's queue.
	LockQueued
	// LockGaveUp: a waiter left the queue without being granted; GaveUp
	// says why.
	LockGaveUp
	// LockDelayStarted: a lock-delay (DelayID, Delay) began, as the
	// grant of Session and Token ended without its holder's release.
	LockDelayStarted
	// LockDelayEnded: the lock-delay DelayID was lifted.
	LockDelayEnded
)

// String names the kind as the API and the console do: "granted",
// "released", "expired", "revoked", "abandoned", "queued", "gave_up",
// "delay_started" or "delay_ended".
func (k LockEventKind) String() string { return enumName(k, "lock_event", lockEventKindNames) }

var lockEventKindNames = map[LockEventKind]string{
	LockGranted:      "granted",
	LockReleased:     "released",
	LockExpired:      "expired",
	LockRevoked:      "revoked",
	LockAbandoned:    "abandoned",
	LockQueued:       "queued",
	LockGaveUp:       "gave_up",
	LockDelayStarted: "delay_started",
	LockDelayEnded:   "delay_ended",
}

// GiveUp says why a waiter left a lock's queue ungranted.
type GiveUp uint8

const (
	// GaveUpCancelled: its acquire was given up: a CancelAcquire, or a
	// call whose caller went away (or lost its permission) while it waited.
	GaveUpCancelled GiveUp = iota + 1
	// GaveUpTimedOut: its wait timeout passed (a CancelWait that says so;
	// a group below Protocol4 records a timeout as a cancel).
	GaveUpTimedOut
	// GaveUpSessionEnded: its session ended; End says how.
	GaveUpSessionEnded
)

// String names the reason: "cancelled", "timed_out" or "session_ended".
func (g GiveUp) String() string { return enumName(g, "give_up", giveUpNames) }

var giveUpNames = map[GiveUp]string{
	GaveUpCancelled:    "cancelled",
	GaveUpTimedOut:     "timed_out",
	GaveUpSessionEnded: "session_ended",
}

// LockEvent is one change to one lock's holders, queue or lock-delays.
// Every command lists the events it caused in Effects.LockEvents, in the
// order they happened, so that every node, applying the same log, derives
// the same events in the same order: a watcher numbers them by the
// command's place in the log and theirs in its list.
type LockEvent struct {
	Kind LockEventKind
	Lock string
	// Session is the holder or waiter the event is about; for a
	// lock-delay, the holder whose end started it (0 for DelayEnded).
	Session uint64
	// Owner is that session's owner, as it named itself.
	Owner string
	// Token is the grant's: the one made (Granted), or the one that ended
	// (Released, Expired, Revoked, Abandoned, DelayStarted).
	Token uint64
	// Mode is the holder's or waiter's; Permits a semaphore's number.
	Mode    Mode
	Permits uint32
	// GaveUp says why a waiter left the queue (LockGaveUp).
	GaveUp GiveUp
	// End is how the session ended, when its end caused the event: its
	// grants' ends, its waits' (GaveUpSessionEnded). Zero otherwise.
	End End
	// Delay and DelayID are a lock-delay's (DelayStarted, DelayEnded;
	// Delay is 0 for DelayEnded).
	Delay   time.Duration
	DelayID uint64
}

// holderEnd is the kind of event a grant's end is, by how its session
// ended: Released for its own close, otherwise as the session ended.
func holderEnd(how End) LockEventKind {
	switch how {
	case Expired:
		return LockExpired
	case Revoked:
		return LockRevoked
	case Abandoned:
		return LockAbandoned
	}
	return LockReleased
}

// emit records an event of the command being applied.
func (s *State) emit(ev LockEvent) { s.lockEvents = append(s.lockEvents, ev) }

// ownerOf is the owner of session id, "" if it is gone.
func (s *State) ownerOf(id uint64) string {
	if sess, ok := s.sessions[id]; ok {
		return sess.owner
	}
	return ""
}

// emitGranted records g, made on l.
func (s *State) emitGranted(l *lock, g Grant) {
	s.emit(LockEvent{Kind: LockGranted, Lock: l.name, Session: g.Session, Owner: s.ownerOf(g.Session), Token: g.Token, Mode: g.Mode, Permits: l.permits})
}

// emitHolderEnd records the end of h's grant of l: how is 0 for a
// release, or how the holder's session ended.
func (s *State) emitHolderEnd(l *lock, h holder, how End) {
	s.emit(LockEvent{Kind: holderEnd(how), Lock: l.name, Session: h.session, Owner: s.ownerOf(h.session), Token: h.token, Mode: h.mode, Permits: l.permits, End: how})
}

// emitWaiterEnd records that w left l's queue ungranted, for why (and,
// for a session's end, how it ended).
func (s *State) emitWaiterEnd(l *lock, w waiter, why GiveUp, how End) {
	s.emit(LockEvent{Kind: LockGaveUp, Lock: l.name, Session: w.session, Owner: s.ownerOf(w.session), Mode: w.mode, Permits: l.permits, GaveUp: why, End: how})
}
