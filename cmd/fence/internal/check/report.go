package check

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/fencelock/fence/cmd/fence/internal/timeline"
)

// Report writes the run as an HTML page: one lane per worker (leases,
// pauses, kills, refused writes, and the writes a violation names) and one
// for the server (kills), with the verdict in the notes.
func (r *Result) Report(w io.Writer) error {
	return r.page().HTML(w)
}

// ReportSVG writes the same picture as a standalone SVG.
func (r *Result) ReportSVG(w io.Writer) error {
	return r.page().SVG(w)
}

func (r *Result) page() *timeline.Page {
	tl := &timeline.Timeline{Title: fmt.Sprintf("fence check, seed %d", r.Seed)}
	workers := map[int]bool{}
	for _, op := range r.Ops {
		workers[op.Worker] = true
	}
	lane := func(id int) string { return "worker " + strconv.Itoa(id) }
	for _, id := range slices.Sorted(maps.Keys(workers)) {
		tl.Lanes = append(tl.Lanes, lane(id))
	}
	tl.Lanes = append(tl.Lanes, "server")

	// Leases: the workers' holds, from a grant to the end of the belief.
	for _, op := range r.Ops {
		switch {
		case op.Kind == "hold" && op.End != 0:
			tl.Spans = append(tl.Spans, timeline.Span{Lane: lane(op.Worker), Start: at(op.Start), End: at(op.End), Kind: timeline.SpanLease, Label: "token " + strconv.FormatUint(op.Token, 10)})
		case (op.Kind == "put" || op.Kind == "txn") && op.Result == Rejected:
			tl.Marks = append(tl.Marks, timeline.Mark{Lane: lane(op.Worker), At: at(op.End), Kind: timeline.MarkWriteRejected, Label: "refused, token " + strconv.FormatUint(op.Token, 10)})
		}
	}
	for _, f := range r.Faults {
		l := f.Target
		kind := timeline.SpanDown
		label := f.Kind
		switch f.Kind {
		case FaultPause:
			kind = timeline.SpanPaused
		case FaultKillServer:
			l = "server"
		case FaultPauseLeader, FaultPauseFollower, FaultDiskFull:
			l, kind, label = "server", timeline.SpanPaused, f.Kind+" "+f.Target
		case FaultWipe:
			// Down, then catching up, until it was a voter again.
			l, label = "server", f.Kind+" "+f.Target
		case FaultForeignAdd:
			l, kind, label = "server", "foreign", f.Kind+" "+f.Target
		}
		if f.Outcome != "" {
			label += ": " + f.Outcome
		}
		tl.Spans = append(tl.Spans, timeline.Span{Lane: l, Start: f.Start, End: f.End, Kind: kind, Label: label})
		tl.Marks = append(tl.Marks, timeline.Mark{Lane: l, At: f.Start, Kind: timeline.MarkFault, Label: label})
	}
	a := r.Analysis
	tl.Notes = append(tl.Notes,
		fmt.Sprintf("%d operations: %d grants, %d accepted writes, %d refused, %d of unknown outcome; %d faults.", a.Ops, a.Acquires, a.Writes, a.Rejected, a.Unknown, len(r.Faults)),
		fmt.Sprintf("%d holds (beliefs that a grant was held), %d of unknown end (their worker was killed), not checked for overlap.", a.Holds, a.HoldsUnknownEnd),
		fmt.Sprintf("Counter %s after %d acknowledged increments (%d of unknown outcome). Linearizability: %s.", orZero(r.Final.Counter), a.AckedIncrements, a.UnknownIncrements, a.Linearizability),
		fmt.Sprintf("Txn keys %s and %s after %d acknowledged moves (%d of unknown outcome).", orZero(r.Final.MoveFrom), orZero(r.Final.MoveTo), a.AckedMoves, a.UnknownMoves))
	if len(a.Violations) == 0 {
		tl.Notes = append(tl.Notes, "No violations.")
	}
	for i, v := range a.Violations {
		if i == 20 {
			tl.Notes = append(tl.Notes, fmt.Sprintf("... and %d more violations.", len(a.Violations)-20))
			break
		}
		tl.Notes = append(tl.Notes, "VIOLATION "+v.Kind+": "+v.Detail)
	}
	return &timeline.Page{Title: "fence check", Timelines: []*timeline.Timeline{tl}}
}

func at(ns int64) time.Time { return time.Unix(0, ns) }

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}
