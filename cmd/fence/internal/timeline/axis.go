package timeline

import (
	"cmp"
	"math"
	"slices"
	"strconv"
)

// Axis geometry, in SVG user units (pixels).
const (
	breakWidth = 52.0 // the width of a collapsed quiet stretch
	segmentPad = 14.0 // room before the first and after the last event of a segment
	minSegment = 60.0 // the least width of a segment
	maxBreaks  = 4
	// breakRatio: a quiet stretch is collapsed when it is longer than
	// breakRatio times all the remaining (not collapsed) time together,
	// and at least breakShare of the whole timeline.
	breakRatio = 3.0
	breakShare = 0.2
	tickSpace  = 80.0 // the least distance between ticks, before rounding
)

// axis maps seconds since the origin to x. It is linear in each segment;
// between two segments lies a break: a quiet stretch drawn breakWidth wide
// whatever its length.
type axis struct {
	segs []segment
}

// segment is a stretch of the axis drawn to scale, k pixels per second.
// from and to are the seconds at its edges, first and last the events it
// holds.
type segment struct {
	from, to    float64
	first, last float64
	x0, x1      float64
	k           float64
}

// gap is a quiet stretch drawn as a break.
type gap struct {
	x0, x1 float64 // the break's edges
	length float64 // seconds between the events either side
}

// tick is a labelled time on the axis.
type tick struct {
	x     float64
	label string
}

// newAxis lays out sorted event times (seconds since the origin) between x0
// and x1. Without breaks the axis has one scale. With breaks, each segment
// gets a share of the width in proportion to the events it holds (and at
// least minSegment), so that a burst of events is not squeezed by a slower
// stretch beside it; the ticks give each segment's times.
func newAxis(times []float64, x0, x1 float64) axis {
	width := x1 - x0
	if len(times) == 0 {
		times = []float64{0}
	}
	first, last := times[0], times[len(times)-1]
	if last <= first {
		// One instant: a second-wide axis centred on it.
		return axis{segs: []segment{{from: first - 0.5, to: first + 0.5, first: first, last: first, x0: x0, x1: x1, k: width}}}
	}
	type group struct {
		first, last float64
		events      int
	}
	cut := collapsedGaps(times)
	groups := []group{{first: first, events: 1}}
	for i := range len(times) - 1 {
		if cut[i] {
			groups[len(groups)-1].last = times[i]
			groups = append(groups, group{first: times[i+1]})
		}
		groups[len(groups)-1].events++
	}
	groups[len(groups)-1].last = last

	avail := width - float64(len(groups)-1)*breakWidth
	spare := avail - float64(len(groups))*minSegment
	var a axis
	x := x0
	for j, g := range groups {
		if j > 0 {
			x += breakWidth
		}
		w := avail
		if len(groups) > 1 {
			w = minSegment + spare*float64(g.events)/float64(len(times))
		}
		s := segment{first: g.first, last: g.last, x0: x, x1: x + w}
		if g.last > g.first {
			s.k = (w - 2*segmentPad) / (g.last - g.first)
			s.from, s.to = g.first-segmentPad/s.k, g.last+segmentPad/s.k
		} else {
			// One instant: centred, on the scale of a second per width.
			s.k = w
			s.from, s.to = g.first-0.5, g.first+0.5
		}
		a.segs = append(a.segs, s)
		x += w
	}
	return a
}

// collapsedGaps picks the quiet stretches to draw as breaks: the longest
// gaps between consecutive events, each longer than breakRatio times all
// the time left after it and than breakShare of the whole, at most
// maxBreaks. cut[i] is the gap after times[i].
func collapsedGaps(times []float64) []bool {
	n := len(times) - 1
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	length := func(i int) float64 { return times[i+1] - times[i] }
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(length(b), length(a)) })
	cut := make([]bool, n)
	active := times[n] - times[0]
	for _, i := range order[:min(maxBreaks, n)] {
		g := length(i)
		rest := active - g
		if rest <= 0 || g <= breakRatio*rest || g < breakShare*(times[n]-times[0]) {
			break // every shorter gap fails too
		}
		cut[i] = true
		active = rest
	}
	return cut
}

// x returns the x of t seconds since the origin.
func (a axis) x(t float64) float64 {
	for j, s := range a.segs {
		if t > s.to && j < len(a.segs)-1 {
			continue
		}
		if t < s.from {
			if j == 0 {
				return s.x0
			}
			p := a.segs[j-1] // t lies in the break before s
			return p.x1 + (t-p.to)/(s.from-p.to)*(s.x0-p.x1)
		}
		return min(s.x0+(t-s.from)*s.k, s.x1)
	}
	return 0 // unreachable: there is always a segment
}

// gaps returns the breaks between segments.
func (a axis) gaps() []gap {
	var out []gap
	for j := 1; j < len(a.segs); j++ {
		p, s := a.segs[j-1], a.segs[j]
		out = append(out, gap{x0: p.x1, x1: s.x0, length: s.first - p.last})
	}
	return out
}

// nextBreak returns the x of the first break starting at or after x, or
// +Inf if there is none.
func (a axis) nextBreak(x float64) float64 {
	for _, g := range a.gaps() {
		if g.x0 >= x {
			return g.x0
		}
	}
	return math.Inf(1)
}

// ticks returns round times inside the segments, at least tickSpace apart
// before rounding, skipping any whose label would crowd another or a
// break's label.
func (a axis) ticks() []tick {
	var taken [][2]float64 // x intervals of labels on the axis line
	for _, g := range a.gaps() {
		mid := (g.x0 + g.x1) / 2
		taken = append(taken, [2]float64{mid - 26, mid + 26})
	}
	free := func(x0, x1 float64) bool {
		for _, t := range taken {
			if x0 < t[1] && t[0] < x1 {
				return false
			}
		}
		return true
	}
	var out []tick
	for _, s := range a.segs {
		step := niceStep(tickSpace / s.k)
		decimals := max(0, int(math.Ceil(-math.Log10(step)-1e-9)))
		for n := math.Ceil(max(s.from, 0)/step - 1e-9); n*step <= s.to+1e-12; n++ {
			t := n * step
			if t == 0 {
				t = 0 // not -0, which would print as "-0.000s"
			}
			label := formatSeconds(t, decimals)
			x := a.x(t)
			half := textWidth(label, tickFont)/2 + 4
			if !free(x-half, x+half) {
				continue
			}
			taken = append(taken, [2]float64{x - half, x + half})
			out = append(out, tick{x: x, label: label})
		}
	}
	return out
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	switch f := x / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}

func formatSeconds(t float64, decimals int) string {
	return strconv.FormatFloat(t, 'f', decimals, 64) + "s"
}
