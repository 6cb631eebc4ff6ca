package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/timeline"
)

// demoRun is one play of the story and what came of it.
type demoRun struct {
	number int
	fenced bool
	tl     *timeline.Timeline

	tokenA, tokenB uint64
	writeA, writeB demoEvent
	final          string
	present        bool

	ok      bool   // the run ended as it should
	verdict string // one line
}

// mark puts a mark on the run's timeline.
func (r *demoRun) mark(lane string, at time.Time, kind, label string) {
	r.tl.Marks = append(r.tl.Marks, timeline.Mark{Lane: lane, At: at, Kind: kind, Label: label})
}

// span puts a span on the run's timeline.
func (r *demoRun) span(lane string, from, to time.Time, kind, label string) {
	r.tl.Spans = append(r.tl.Spans, timeline.Span{Lane: lane, Start: from, End: to, Kind: kind, Label: label})
}

// writeKind is the kind of mark a write's answer gets.
func writeKind(ev demoEvent) string {
	switch ev.Event {
	case "wrote":
		return timeline.MarkWriteOK
	case "rejected":
		return timeline.MarkWriteRejected
	}
	return timeline.MarkFault
}

// writeLabel says on the timeline how the storage answered a write.
func writeLabel(ev demoEvent, value string, token uint64, fenced bool) string {
	switch {
	case ev.Event == "wrote" && fenced:
		return fmt.Sprintf("wrote %q with token %d: accepted", value, token)
	case ev.Event == "wrote":
		return fmt.Sprintf("wrote %q, no token: accepted", value)
	case ev.Event == "rejected":
		return "write rejected: " + strings.TrimSuffix(ev.Message, " for key "+ev.Key)
	}
	return "write failed: " + ev.Message
}

// judge decides whether the run ended as the story says it must.
func (r *demoRun) judge(f demoFlags) {
	story := fmt.Sprintf("A (token %d) was paused past its lease; B got lock %s (token %d) and wrote \"B\"; A woke and wrote \"A\"", r.tokenA, f.lock, r.tokenB)
	final := "no value"
	if r.present {
		final = strconv.Quote(r.final)
	}
	switch {
	case r.tokenB <= r.tokenA:
		r.verdict = fmt.Sprintf("UNEXPECTED: B's token %d is not above A's %d", r.tokenB, r.tokenA)
	case r.writeB.Event != "wrote":
		r.verdict = fmt.Sprintf("UNEXPECTED: B's write, under the lock, failed: %s", r.writeB.Message)
	case !r.fenced && r.writeA.Event == "wrote" && r.present && r.final == "A":
		r.ok = true
		r.verdict = fmt.Sprintf("LOST UPDATE: %s, and the storage took it. It holds \"A\" now: B's update is lost, and the lock could not prevent it.", story)
	case !r.fenced:
		r.verdict = fmt.Sprintf("UNEXPECTED: the storage does not check tokens, so A's late write should have overwritten B's; A's write: %s; the value is %s", describe(r.writeA), final)
	case r.writeA.Event == "rejected" && r.writeA.Token == r.tokenA && r.writeA.Highest == r.tokenB && r.present && r.final == "B":
		r.ok = true
		r.verdict = fmt.Sprintf("SAFE: %s, but the storage rejected it with 409: stale fencing token %d < %d. It still holds \"B\".", story, r.tokenA, r.tokenB)
	default:
		r.verdict = fmt.Sprintf("UNEXPECTED: the storage checks tokens, so A's late write with token %d should have been rejected because B wrote with %d; A's write: %s; the value is %s", r.tokenA, r.tokenB, describe(r.writeA), final)
	}
}

// describe says what an event was, with its message if any.
func describe(ev demoEvent) string {
	if ev.Message != "" {
		return ev.Event + " (" + ev.Message + ")"
	}
	return ev.Event
}
