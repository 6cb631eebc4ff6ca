package timeline

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Page is several timelines shown together, one above the other, each with
// its own title, lanes, axis and notes: one SVG picture or one HTML page.
// `fence demo` shows its two runs this way.
type Page struct {
	// Title heads the page; empty for none.
	Title string
	// Timelines are drawn in order.
	Timelines []*Timeline
	// Notes are shown after the timelines.
	Notes []string
}

// SVG writes the timeline as a standalone SVG picture: one horizontal lane
// per lane, spans as coloured bars, marks as symbols with short labels, a
// time axis in seconds, the notes, and a legend.
func (t *Timeline) SVG(w io.Writer) error {
	return (&Page{Timelines: []*Timeline{t}}).SVG(w)
}

// SVG writes the page as one standalone SVG picture: its title, each
// timeline as in Timeline.SVG, its notes, and one legend for all.
func (p *Page) SVG(w io.Writer) error {
	return p.svg(w, svgOptions{pageTitle: true, panelTitles: true, notes: true})
}

// svgOptions leave out what an HTML page shows as HTML instead.
type svgOptions struct {
	pageTitle, panelTitles, notes bool
}

// Layout, in SVG user units (pixels).
const (
	svgWidth      = 960.0
	marginX       = 16.0
	fontFamily    = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
	glyphWidth    = 0.6 // an upper estimate of a glyph's width, in em, for layout
	laneFont      = 12.0
	labelFont     = 11.0
	barFont       = 10.0
	tickFont      = 10.0
	noteFont      = 12.0
	trackHeight   = 14.0
	trackGap      = 3.0
	lanePad       = 6.0
	labelRow      = 14.0
	maxLabelRows  = 4
	maxLabelRunes = 48
	maxLaneRunes  = 24
)

type style struct{ fill, text, legend string }

var spanStyles = map[string]style{
	SpanLease:   {"#2e9d5b", "#ffffff", "lock held (lease)"},
	SpanPaused:  {"#f0a030", "#3d2600", "paused"},
	SpanWaiting: {"#a9c4e2", "#16324f", "waiting for the lock"},
	SpanDown:    {"#4f5358", "#ffffff", "down"},
}

var otherSpan = style{"#bfc3c8", "#222222", ""}

var markStyles = map[string]style{
	MarkGrant:         {"#1f63c6", "#1f4f9a", "lock granted"},
	MarkWriteOK:       {"#2e9d5b", "#1b6e3d", "write accepted"},
	MarkWriteRejected: {"#d62728", "#a61b1c", "write rejected"},
	MarkLostUpdate:    {"#f5c518", "#a61b1c", "lost update"},
	MarkFault:         {"#e67e22", "#a35200", "fault injected"},
	MarkInfo:          {"#7f8891", "#333333", "event"},
}

var (
	spanOrder = []string{SpanLease, SpanPaused, SpanWaiting, SpanDown}
	markOrder = []string{MarkGrant, MarkWriteOK, MarkWriteRejected, MarkLostUpdate, MarkFault, MarkInfo}
)

func spanStyle(kind string) style {
	if s, ok := spanStyles[kind]; ok {
		return s
	}
	return otherSpan
}

func markStyle(kind string) style {
	if s, ok := markStyles[kind]; ok {
		return s
	}
	return markStyles[MarkInfo]
}

// canvas collects SVG elements.
type canvas struct{ bytes.Buffer }

func (c *canvas) printf(format string, args ...any) { fmt.Fprintf(c, format, args...) }

// text writes a text element; attrs are extra attributes, already escaped.
func (c *canvas) text(x, y, size float64, attrs, s string) {
	c.printf(`<text x="%.1f" y="%.1f" font-size="%g"%s>%s</text>`+"\n", x, y, size, attrs, esc(s))
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder cannot fail
	return b.String()
}

// textWidth estimates the width of s in a sans-serif font of size px.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * glyphWidth
}

// truncate shortens s to at most n runes, ending it with an ellipsis.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// usedKinds collects the kinds drawn, for the legend.
type usedKinds struct{ spans, marks map[string]bool }

func (p *Page) svg(w io.Writer, o svgOptions) error {
	var c canvas
	used := usedKinds{spans: map[string]bool{}, marks: map[string]bool{}}
	plotX0 := marginX + laneColumn(p.Timelines)
	y := 0.0
	if o.pageTitle && p.Title != "" {
		y += 30
		c.text(marginX, y, 18, ` font-weight="bold" fill="#111" class="title"`, p.Title)
		y += 6
	}
	for i, t := range p.Timelines {
		if i > 0 {
			y += 10
			c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c9ced4"/>`+"\n", marginX, y, svgWidth-marginX, y)
		}
		y = drawPanel(&c, t, y, plotX0, o, used)
	}
	if o.notes && len(p.Notes) > 0 {
		y = drawNotes(&c, p.Notes, y+8)
	}
	y = drawLegend(&c, used, y+8)
	height := math.Ceil(y + 12)

	var out bytes.Buffer
	fmt.Fprintf(&out, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="%s">`+"\n",
		svgWidth, height, svgWidth, height, esc(fontFamily))
	if title := svgTitle(p); title != "" {
		fmt.Fprintf(&out, "<title>%s</title>\n", esc(title))
	}
	fmt.Fprintf(&out, `<rect width="%g" height="%g" fill="#ffffff"/>`+"\n", svgWidth, height)
	out.Write(c.Bytes())
	out.WriteString("</svg>\n")
	_, err := w.Write(out.Bytes())
	return err
}

// svgTitle names the picture for its <title>.
func svgTitle(p *Page) string {
	if p.Title != "" {
		return p.Title
	}
	var titles []string
	for _, t := range p.Timelines {
		if t.Title != "" {
			titles = append(titles, t.Title)
		}
	}
	return strings.Join(titles, "; ")
}

// laneColumn returns the width of the lane names' column.
func laneColumn(ts []*Timeline) float64 {
	longest := 0
	for _, t := range ts {
		for _, l := range t.lanes() {
			longest = max(longest, len([]rune(truncate(l, maxLaneRunes))))
		}
	}
	return min(max(float64(longest)*laneFont*glyphWidth+16, 48), 200)
}

// lane is the layout of one lane.
type lane struct {
	name   string
	top    float64
	height float64
	tracks int
	spans  []placedSpan
	marks  []placedMark
	rows   int
}

type placedSpan struct {
	Span
	stop     time.Time // the resolved end
	from, to float64   // seconds since the origin
	track    int
}

type placedMark struct {
	Mark
	at       float64 // seconds since the origin
	x        float64
	text     string  // the label as drawn
	row      int     // -1: no room for the label
	textX    float64 // where the label starts (by the width estimate)
	alignEnd bool    // the label ends at the symbol rather than starting there
}

func (l *lane) trackY(i int) float64 { return l.top + lanePad + float64(i)*(trackHeight+trackGap) }

func (l *lane) symbolY() float64 { return l.trackY(l.tracks) + 8 }

func (l *lane) rowY(r int) float64 { return l.symbolY() + 19 + float64(r)*labelRow }

// layoutLanes assigns spans to tracks and mark labels to rows, lane by lane.
func layoutLanes(t *Timeline, origin, end time.Time, ax axis, plotX0, plotX1 float64) []*lane {
	var lanes []*lane
	for _, name := range t.lanes() {
		l := &lane{name: name}
		for _, s := range t.Spans {
			if s.Lane == name {
				l.spans = append(l.spans, placedSpan{Span: s, stop: s.end(end), from: since(s.Start, origin), to: since(s.end(end), origin)})
			}
		}
		for _, m := range t.Marks {
			if m.Lane == name {
				l.marks = append(l.marks, placedMark{Mark: m, at: since(m.At, origin)})
			}
		}
		assignTracks(l)
		assignRows(l, ax, plotX0, plotX1)
		lanes = append(lanes, l)
	}
	return lanes
}

// assignTracks puts overlapping spans on separate tracks, earliest first.
func assignTracks(l *lane) {
	slices.SortStableFunc(l.spans, func(a, b placedSpan) int {
		if c := compareFloat(a.from, b.from); c != 0 {
			return c
		}
		return compareFloat(a.to, b.to)
	})
	var ends []float64
	for i := range l.spans {
		s := &l.spans[i]
		s.track = len(ends)
		for tr, e := range ends {
			if e <= s.from {
				s.track = tr
				break
			}
		}
		if s.track == len(ends) {
			ends = append(ends, s.to)
		} else {
			ends[s.track] = s.to
		}
	}
	l.tracks = len(ends)
}

// assignRows places mark labels under the symbols, in the first row where
// they overlap no other label; labels that find no row are left out (the
// symbol's tooltip still has them).
func assignRows(l *lane, ax axis, plotX0, plotX1 float64) {
	slices.SortStableFunc(l.marks, func(a, b placedMark) int { return compareFloat(a.at, b.at) })
	var rowEnds []float64
	for i := range l.marks {
		m := &l.marks[i]
		m.x = ax.x(m.at)
		label := m.Label
		if label == "" {
			label = m.Kind
		}
		m.text = truncate(oneLine(label), maxLabelRunes)
		w := textWidth(m.text, labelFont)
		// Left-aligned under the symbol, or, where that would run off the
		// right edge, right-aligned to it.
		m.textX = m.x - 4
		if m.textX+w > plotX1+marginX/2 {
			m.textX, m.alignEnd = max(plotX0-marginX/2, m.x+4-w), true
		}
		m.row = -1
		for r := range maxLabelRows {
			if r == len(rowEnds) {
				rowEnds = append(rowEnds, math.Inf(-1))
			}
			if m.textX >= rowEnds[r]+8 {
				m.row, rowEnds[r] = r, m.textX+w
				l.rows = max(l.rows, r+1)
				break
			}
		}
	}
}

func compareFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func since(at, origin time.Time) float64 { return at.Sub(origin).Seconds() }

// eventTimes returns the sorted distinct times of t's events, in seconds
// since origin.
func eventTimes(t *Timeline, origin, end time.Time) []float64 {
	var times []float64
	for _, s := range t.Spans {
		times = append(times, since(s.Start, origin), since(s.end(end), origin))
	}
	for _, m := range t.Marks {
		times = append(times, since(m.At, origin))
	}
	slices.Sort(times)
	return slices.Compact(times)
}

// drawPanel draws one timeline from y down and returns the y below it.
func drawPanel(c *canvas, t *Timeline, y, plotX0 float64, o svgOptions, used usedKinds) float64 {
	if o.panelTitles && t.Title != "" {
		y += 24
		c.text(marginX, y, 15, ` font-weight="bold" fill="#111" class="panel-title"`, t.Title)
		y += 4
	}
	origin, ok := t.origin()
	if !ok {
		y += 20
		c.text(marginX, y, laneFont, ` fill="#777"`, "(no events)")
		if o.notes {
			y = drawNotes(c, t.Notes, y+6)
		}
		return y
	}
	end := t.end()
	plotX1 := svgWidth - marginX
	ax := newAxis(eventTimes(t, origin, end), plotX0, plotX1)
	lanes := layoutLanes(t, origin, end, ax, plotX0, plotX1)

	top := y + 8
	y = top
	for _, l := range lanes {
		l.top = y
		l.height = lanePad + float64(l.tracks)*(trackHeight+trackGap) + lanePad
		if len(l.marks) > 0 {
			l.height += 16 + float64(l.rows)*labelRow
		}
		l.height = max(l.height, 34)
		y += l.height
	}
	axisY := y + 2

	for i, l := range lanes {
		if i%2 == 1 {
			c.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f6f7f9"/>`+"\n", marginX, l.top, svgWidth-2*marginX, l.height)
		}
		c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e3e6ea"/>`+"\n", marginX, l.top+l.height, svgWidth-marginX, l.top+l.height)
	}
	ticks := ax.ticks()
	for _, tk := range ticks {
		c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e6e8eb" stroke-dasharray="2 3"/>`+"\n", tk.x, top, tk.x, axisY)
	}
	for _, l := range lanes {
		drawSpans(c, l, ax, origin, used)
	}
	drawAxis(c, ax, ticks, top, axisY)
	for _, l := range lanes {
		drawMarks(c, l, origin, used)
		nameY := l.symbolY() + 4
		if l.tracks > 0 {
			nameY = l.trackY(0) + 11
		}
		c.text(marginX+4, nameY, laneFont, ` font-weight="bold" fill="#222" class="lane"`, truncate(l.name, maxLaneRunes))
	}
	y = axisY + 30
	if o.notes {
		y = drawNotes(c, t.Notes, y)
	}
	return y
}

func drawSpans(c *canvas, l *lane, ax axis, origin time.Time, used usedKinds) {
	for _, s := range l.spans {
		used.spans[s.Kind] = true
		st := spanStyle(s.Kind)
		x0, x1 := ax.x(s.from), ax.x(s.to)
		y := l.trackY(s.track)
		tip := fmt.Sprintf("%s: %s from %s to %s (%s)", l.name, orKind(s.Label, s.Kind),
			relative(s.Start, origin), relative(s.stop, origin), seconds(s.stop.Sub(s.Start)))
		c.printf(`<g class="span" data-kind="%s"><title>%s</title>`, esc(s.Kind), esc(tip))
		c.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%g" rx="3" fill="%s"/>`, x0, y, max(x1-x0, 2), trackHeight, st.fill)
		if s.Label != "" {
			text := oneLine(s.Label)
			room := min(x1, ax.nextBreak(x0)) - x0
			if textWidth(text, barFont)+8 <= room {
				c.printf(`<text x="%.1f" y="%.1f" font-size="%g" fill="%s">%s</text>`, x0+4, y+10.5, barFont, st.text, esc(text))
			}
		}
		c.printf("</g>\n")
	}
}

func orKind(label, kind string) string {
	if label == "" {
		return kind
	}
	return oneLine(label)
}

// drawAxis draws the time axis, its ticks and the breaks over the lanes.
func drawAxis(c *canvas, ax axis, ticks []tick, top, axisY float64) {
	first, last := ax.segs[0], ax.segs[len(ax.segs)-1]
	c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#666"/>`+"\n", first.x0, axisY, last.x1, axisY)
	for _, tk := range ticks {
		c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#666"/>`+"\n", tk.x, axisY, tk.x, axisY+4)
		c.text(tk.x, axisY+15, tickFont, ` text-anchor="middle" fill="#555" class="tick"`, tk.label)
	}
	for _, g := range ax.gaps() {
		c.printf(`<g class="break"><title>%s</title>`, esc("a quiet stretch of "+seconds(durationOf(g.length))+", not to scale"))
		c.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ffffff"/>`, g.x0+3, top, g.x1-g.x0-6, axisY-top+5)
		for _, x := range []float64{g.x0 + 3, g.x1 - 3} {
			c.printf(`<polyline points="%s" fill="none" stroke="#9aa0a6"/>`, zigzag(x, top, axisY+5))
		}
		c.printf(`<text x="%.1f" y="%.1f" font-size="%g" font-style="italic" text-anchor="middle" fill="#666">%s</text></g>`+"\n",
			(g.x0+g.x1)/2, axisY+15, tickFont, esc(seconds(durationOf(g.length))))
	}
	c.text(last.x1, axisY+28, tickFont, ` text-anchor="end" fill="#888"`,
		"seconds since the first event"+breakNote(ax))
}

func breakNote(ax axis) string {
	if len(ax.segs) < 2 {
		return ""
	}
	return "; a zigzag gap is a quiet stretch of the length shown, not to scale"
}

func durationOf(sec float64) time.Duration {
	return time.Duration(math.Round(sec * float64(time.Second)))
}

// zigzag returns the points of a vertical zigzag line at x.
func zigzag(x, y0, y1 float64) string {
	var b strings.Builder
	for i, y := 0, y0; y < y1; i, y = i+1, y+5 {
		dx := 2.5
		if i%2 == 1 {
			dx = -2.5
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x+dx, y)
	}
	fmt.Fprintf(&b, "%.1f,%.1f", x, y1)
	return b.String()
}

func drawMarks(c *canvas, l *lane, origin time.Time, used usedKinds) {
	sy := l.symbolY()
	for _, m := range l.marks {
		used.marks[m.Kind] = true
		st := markStyle(m.Kind)
		c.printf(`<g class="mark" data-kind="%s" data-lane="%s"><title>%s</title>`, esc(m.Kind), esc(l.name),
			esc(fmt.Sprintf("%s  %s: %s", relative(m.At, origin), l.name, orKind(m.Label, m.Kind))))
		if m.row >= 0 {
			ty := l.rowY(m.row)
			if m.row > 0 {
				c.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#b8bdc3"/>`, m.x, sy+8, m.x, ty-10)
			}
		}
		symbol(c, m.Kind, m.x, sy)
		if m.row >= 0 {
			weight := ""
			if m.Kind == MarkLostUpdate || m.Kind == MarkWriteRejected {
				weight = ` font-weight="bold"`
			}
			x, anchor := m.textX, ""
			if m.alignEnd {
				x, anchor = m.x+4, ` text-anchor="end"`
			}
			c.printf(`<text x="%.1f" y="%.1f" font-size="%g" fill="%s"%s%s stroke="#ffffff" stroke-width="3" paint-order="stroke">%s</text>`,
				x, l.rowY(m.row), labelFont, st.text, weight, anchor, esc(m.text))
		}
		c.printf("</g>\n")
	}
}

// symbol draws the symbol of a mark kind centred on (x, y).
func symbol(c *canvas, kind string, x, y float64) {
	st := markStyle(kind)
	switch kind {
	case MarkGrant:
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ" fill="%s" stroke="#ffffff"/>`,
			x, y-7, x+7, y, x, y+7, x-7, y, st.fill)
	case MarkWriteOK:
		c.printf(`<circle cx="%.1f" cy="%.1f" r="6.5" fill="%s"/>`, x, y, st.fill)
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1f" fill="none" stroke="#ffffff" stroke-width="2"/>`,
			x-3.5, y, x-1, y+2.5, x+3.5, y-2.5)
	case MarkWriteRejected:
		c.printf(`<circle cx="%.1f" cy="%.1f" r="6.5" fill="%s"/>`, x, y, st.fill)
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="#ffffff" stroke-width="2"/>`,
			x-3, y-3, x+3, y+3, x-3, y+3, x+3, y-3)
	case MarkLostUpdate:
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1fZ" fill="%s" stroke="#a61b1c" stroke-width="1.5" stroke-linejoin="round"/>`,
			x, y-8, x+8, y+6, x-8, y+6, st.fill)
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f" stroke="#a61b1c" stroke-width="2"/>`,
			x, y-3.5, x, y+1, x, y+2.8, x, y+4.3)
	case MarkFault:
		c.printf(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ" fill="%s"/>`,
			x+1.5, y-8, x-5, y+1, x-0.5, y+1, x-1.5, y+8, x+5, y-1, x+0.5, y-1, st.fill)
	default:
		c.printf(`<circle cx="%.1f" cy="%.1f" r="4.5" fill="%s"/>`, x, y, st.fill)
	}
}

// drawNotes writes notes, wrapped to the picture's width, from y down.
func drawNotes(c *canvas, notes []string, y float64) float64 {
	perLine := int(math.Floor((svgWidth - 2*marginX) / (noteFont * glyphWidth)))
	for _, n := range notes {
		for _, line := range wrap(n, perLine) {
			y += 16
			c.text(marginX, y, noteFont, ` fill="#222" class="note"`, line)
		}
		y += 2
	}
	return y
}

// wrap breaks s into lines of at most width runes, at spaces where it can.
func wrap(s string, width int) []string {
	var lines []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			for len([]rune(word)) > width {
				if line != "" {
					lines, line = append(lines, line), ""
				}
				r := []rune(word)
				lines, word = append(lines, string(r[:width])), string(r[width:])
			}
			switch {
			case line == "":
				line = word
			case len([]rune(line))+1+len([]rune(word)) <= width:
				line += " " + word
			default:
				lines, line = append(lines, line), word
			}
		}
		lines = append(lines, line)
	}
	return lines
}

// legendEntry is one kind of span or mark in the legend, with its text.
type legendEntry struct {
	span bool
	kind string
	text string
}

// legendEntries are the entries of the kinds used, spans if span, marks
// otherwise: the kinds with a style first, in order, with their styles'
// legends, then the others, sorted, each with its own name.
func legendEntries(span bool, used map[string]bool, order []string, styles map[string]style) []legendEntry {
	var entries []legendEntry
	for _, k := range order {
		if used[k] {
			entries = append(entries, legendEntry{span, k, styles[k].legend})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(used)) {
		if _, known := styles[k]; !known {
			entries = append(entries, legendEntry{span, k, k})
		}
	}
	return entries
}

// drawLegend explains the colours and symbols drawn, in a fixed order.
func drawLegend(c *canvas, used usedKinds, y float64) float64 {
	entries := legendEntries(true, used.spans, spanOrder, spanStyles)
	entries = append(entries, legendEntries(false, used.marks, markOrder, markStyles)...)
	if len(entries) == 0 {
		return y
	}
	y += 18
	x := marginX
	for _, e := range entries {
		w := 22 + textWidth(e.text, labelFont) + 10
		if x+w > svgWidth-marginX && x > marginX {
			x, y = marginX, y+20
		}
		c.printf(`<g class="legend" data-kind="%s">`, esc(e.kind))
		if e.span {
			c.printf(`<rect x="%.1f" y="%.1f" width="16" height="10" rx="2" fill="%s"/>`, x, y-9, spanStyle(e.kind).fill)
		} else {
			symbol(c, e.kind, x+8, y-4)
		}
		c.printf(`<text x="%.1f" y="%.1f" font-size="%g" fill="#333">%s</text></g>`+"\n", x+22, y, labelFont, esc(e.text))
		x += w
	}
	return y + 4
}
