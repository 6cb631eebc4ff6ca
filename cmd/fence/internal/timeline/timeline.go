// Package timeline renders what happened during a run, client by client:
// who held a lock and when, who was paused or down, which writes the
// resource accepted or rejected. It writes the same timeline as text for a
// terminal, as a standalone SVG picture, and as a self-contained HTML page.
// `fence demo` and `fence check` use it; it is part of the fence tool
// (cmd/fence/internal/).
//
// # Basics
//
// A Timeline has lanes (one per client or process), spans (intervals on a
// lane, drawn as bars) and marks (instants on a lane, drawn as symbols).
// Times are shown relative to the first event. Rendering only reads the
// Timeline; it is safe to render one Timeline from several goroutines as
// long as nobody changes it meanwhile.
//
// Output is deterministic: the same Timeline gives the same bytes.
//
// # The time axis
//
// The SVG's axis is linear in seconds, except that a quiet stretch much
// longer than everything else (a client paused for a second while the
// interesting writes take a few milliseconds) is drawn as a narrow break
// labelled with its length, so that bursts of events stay readable.
package timeline

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Span kinds with a colour of their own. A span of any other kind is grey.
const (
	SpanLease   = "lease"   // the lane holds the lock
	SpanPaused  = "paused"  // the process is stopped (SIGSTOP, a GC pause...)
	SpanWaiting = "waiting" // the lane waits for a grant
	SpanDown    = "down"    // the process or node is not running
)

// Mark kinds with a symbol of their own. A mark of any other kind is drawn
// like MarkInfo.
const (
	MarkGrant         = "grant"          // a lock was granted, with a token
	MarkWriteOK       = "write-ok"       // the resource accepted a write
	MarkWriteRejected = "write-rejected" // the resource rejected a write
	MarkLostUpdate    = "lost-update"    // an accepted write was overwritten
	MarkFault         = "fault"          // a fault was injected
	MarkInfo          = "info"           // anything else worth showing
)

// Span is an interval on a lane, such as the time a client held a lock.
type Span struct {
	// Lane names the lane the span is drawn on.
	Lane string
	// Start and End bound the span. A zero End means the span lasts until
	// the timeline's last event; an End before Start is taken as Start.
	Start, End time.Time
	// Kind is SpanLease, SpanPaused, SpanWaiting, SpanDown or any other
	// word (drawn grey).
	Kind string
	// Label describes the span. A span with a label also gets a line in
	// Text, at its start, with its length.
	Label string
}

// Mark is an instant on a lane, such as a write the resource accepted.
type Mark struct {
	// Lane names the lane the mark is drawn on.
	Lane string
	// At is when it happened.
	At time.Time
	// Kind is one of the Mark* constants, or any other word (drawn like
	// MarkInfo).
	Kind string
	// Label is a short description; the SVG shows up to 48 characters of
	// it next to the symbol, and all of it as the symbol's tooltip.
	Label string
}

// Timeline is the record of one run. Lanes lists the lanes in the order they
// are drawn; lanes used by spans or marks but not listed are added after
// them, in order of first use. Notes are free text shown under the picture
// (a verdict, the parameters of the run).
type Timeline struct {
	Title string
	Lanes []string
	Spans []Span
	Marks []Mark
	Notes []string
}

// Text writes the timeline as chronological lines, one per mark and one per
// labelled span (at its start, with its length), with times relative to the
// first event:
//
//	+0.000s  A  got lock orders, token 33
//	+0.002s  A  paused by SIGSTOP (for 1.021s)
//
// Events at the same instant keep their order in the Timeline, spans
// before marks. An empty timeline writes nothing.
func (t *Timeline) Text(w io.Writer) error {
	origin, ok := t.origin()
	if !ok {
		return nil
	}
	end := t.end()
	type line struct {
		at   time.Time
		lane string
		text string
	}
	var lines []line
	for _, s := range t.Spans {
		if s.Label == "" {
			continue
		}
		length := s.end(end).Sub(s.Start)
		lines = append(lines, line{s.Start, s.Lane, fmt.Sprintf("%s (for %s)", oneLine(s.Label), seconds(length))})
	}
	for _, m := range t.Marks {
		label := m.Label
		if label == "" {
			label = m.Kind
		}
		lines = append(lines, line{m.At, m.Lane, oneLine(label)})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })

	laneW, timeW := 0, 0
	for _, l := range lines {
		laneW = max(laneW, len([]rune(l.lane)))
		timeW = max(timeW, len(relative(l.at, origin)))
	}
	bw := bufio.NewWriter(w)
	for _, l := range lines {
		fmt.Fprintf(bw, "%*s  %s  %s\n", timeW, relative(l.at, origin), pad(l.lane, laneW), l.text)
	}
	return bw.Flush()
}

// lanes returns t.Lanes followed by the lanes used but not listed.
func (t *Timeline) lanes() []string {
	lanes := slices.Clone(t.Lanes)
	seen := map[string]bool{}
	for _, l := range lanes {
		seen[l] = true
	}
	add := func(l string) {
		if !seen[l] {
			seen[l] = true
			lanes = append(lanes, l)
		}
	}
	for _, s := range t.Spans {
		add(s.Lane)
	}
	for _, m := range t.Marks {
		add(m.Lane)
	}
	return lanes
}

// origin returns the time of the first event, and false if there is none.
func (t *Timeline) origin() (time.Time, bool) {
	var first time.Time
	found := false
	consider := func(at time.Time) {
		if !found || at.Before(first) {
			first, found = at, true
		}
	}
	for _, s := range t.Spans {
		consider(s.Start)
	}
	for _, m := range t.Marks {
		consider(m.At)
	}
	return first, found
}

// end returns the time of the last event, the end of open spans.
func (t *Timeline) end() time.Time {
	var last time.Time
	for _, s := range t.Spans {
		last = latest(last, latest(s.Start, s.End))
	}
	for _, m := range t.Marks {
		last = latest(last, m.At)
	}
	return last
}

// end resolves the span's end: open spans last until end.
func (s Span) end(end time.Time) time.Time {
	e := s.End
	if e.IsZero() {
		e = end
	}
	return latest(e, s.Start)
}

func latest(a, b time.Time) time.Time {
	if a.IsZero() || b.After(a) {
		return b
	}
	return a
}

// relative formats at as seconds since origin, "+1.234s".
func relative(at, origin time.Time) string {
	d := at.Sub(origin)
	if d < 0 {
		return "-" + seconds(-d)
	}
	return "+" + seconds(d)
}

// seconds formats d as seconds with millisecond precision, "1.234s".
func seconds(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

func pad(s string, width int) string {
	if n := len([]rune(s)); n < width {
		return s + strings.Repeat(" ", width-n)
	}
	return s
}

// oneLine folds line breaks and tabs into spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
