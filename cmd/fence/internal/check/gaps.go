package check

import (
	"slices"
	"time"
)

// GrantGaps returns, for each fault kind, the longest time between two
// grants in a row (the End of successful acquires) during which a fault of
// that kind was under way; "none" is the longest gap that overlapped no
// fault. It measures what a fault costs the workers in availability.
func GrantGaps(ops []Op, faults []FaultEvent) map[string]time.Duration {
	var grants []int64
	for _, op := range ops {
		if op.Kind == "acquire" && op.Result == OK {
			grants = append(grants, op.End)
		}
	}
	slices.Sort(grants)
	out := map[string]time.Duration{}
	for i := 1; i < len(grants); i++ {
		from, to := grants[i-1], grants[i]
		gap := time.Duration(to - from)
		overlapped := false
		for _, f := range faults {
			if f.Start.UnixNano() < to && f.End.UnixNano() > from {
				overlapped = true
				out[f.Kind] = max(out[f.Kind], gap)
			}
		}
		if !overlapped {
			out["none"] = max(out["none"], gap)
		}
	}
	return out
}
