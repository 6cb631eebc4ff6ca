package timeline

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 14, 9, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// story is the article's timeline: A pauses past its lease, B takes the
// lock and writes, A wakes and writes too.
func story() *Timeline {
	return &Timeline{
		Title: "lease lock, resource does not check tokens",
		Lanes: []string{"A", "B", "storage"},
		Spans: []Span{
			{Lane: "A", Start: at(0), End: at(1019), Kind: SpanLease},
			{Lane: "A", Start: at(3), End: at(1025), Kind: SpanPaused, Label: "paused by SIGSTOP"},
			{Lane: "B", Start: at(6), End: at(1019), Kind: SpanWaiting, Label: "waiting for the lock"},
			{Lane: "B", Start: at(1019), End: at(1023), Kind: SpanLease},
		},
		Marks: []Mark{
			{Lane: "A", At: at(0), Kind: MarkGrant, Label: "got lock orders, token 33"},
			{Lane: "B", At: at(1019), Kind: MarkGrant, Label: "got lock orders, token 34"},
			{Lane: "A", At: at(1019), Kind: MarkInfo, Label: "lease expired on the server"},
			{Lane: "B", At: at(1021), Kind: MarkWriteOK, Label: `wrote "B": accepted`},
			{Lane: "A", At: at(1025), Kind: MarkFault, Label: "SIGCONT"},
			{Lane: "A", At: at(1027), Kind: MarkWriteOK, Label: `wrote "A": accepted`},
			{Lane: "storage", At: at(1029), Kind: MarkLostUpdate, Label: `lost update: B's write is gone`},
		},
		Notes: []string{"LOST UPDATE: the value is A's although B wrote after A's lease ended."},
	}
}

func ExampleTimeline_Text() {
	start := time.Date(2026, 11, 14, 9, 0, 0, 0, time.UTC)
	t := &Timeline{
		Lanes: []string{"A", "B"},
		Spans: []Span{{Lane: "A", Start: start.Add(2 * time.Millisecond), End: start.Add(1500 * time.Millisecond), Kind: SpanPaused, Label: "paused"}},
		Marks: []Mark{
			{Lane: "A", At: start, Kind: MarkGrant, Label: "got lock orders, token 33"},
			{Lane: "B", At: start.Add(1234 * time.Millisecond), Kind: MarkGrant, Label: "got lock orders, token 34"},
			{Lane: "A", At: start.Add(1501 * time.Millisecond), Kind: MarkWriteRejected, Label: "stale fencing token 33 < 34"},
		},
	}
	_ = t.Text(os.Stdout)
	// Output:
	// +0.000s  A  got lock orders, token 33
	// +0.002s  A  paused (for 1.498s)
	// +1.234s  B  got lock orders, token 34
	// +1.501s  A  stale fencing token 33 < 34
}

// svgDoc is what a test reads back from an SVG.
type svgDoc struct {
	root     xml.StartElement
	lanes    []string // text of class="lane"
	marks    int      // elements of class="mark"
	texts    []string // all character data
	elements int
}

// parseSVG decodes an SVG with encoding/xml, failing the test if it is not
// well-formed.
func parseSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	dec := xml.NewDecoder(bytes.NewReader(data))
	var inLane bool
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, data)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if doc.elements == 0 {
				doc.root = tok.Copy()
			}
			doc.elements++
			for _, a := range tok.Attr {
				if a.Name.Local == "class" && a.Value == "mark" {
					doc.marks++
				}
				if a.Name.Local == "class" && a.Value == "lane" {
					inLane = true
				}
			}
		case xml.CharData:
			s := strings.TrimSpace(string(tok))
			if s == "" {
				continue
			}
			doc.texts = append(doc.texts, s)
			if inLane {
				doc.lanes = append(doc.lanes, s)
			}
		case xml.EndElement:
			inLane = false
		}
	}
	if doc.root.Name.Local != "svg" || doc.root.Name.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element is %v, want svg in the SVG namespace", doc.root.Name)
	}
	return doc
}

func render(t *testing.T, f func(io.Writer) error) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := f(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSVGHasLanesAndMarks(t *testing.T) {
	tl := story()
	doc := parseSVG(t, render(t, tl.SVG))
	if got, want := strings.Join(doc.lanes, ","), "A,B,storage"; got != want {
		t.Errorf("lane labels %q, want %q", got, want)
	}
	if doc.marks != len(tl.Marks) {
		t.Errorf("%d mark elements, want %d", doc.marks, len(tl.Marks))
	}
	joined := strings.Join(doc.texts, "\n")
	for _, want := range []string{tl.Title, "got lock orders, token 33", "lost update: B's write is gone", tl.Notes[0], "lock held (lease)", "write accepted"} {
		if !strings.Contains(joined, want) {
			t.Errorf("SVG text lacks %q", want)
		}
	}
}

func TestSVGCollapsesLongQuietStretch(t *testing.T) {
	tl := story()
	data := string(render(t, tl.SVG))
	if n := strings.Count(data, `class="break"`); n != 1 {
		t.Errorf("%d breaks in the axis, want 1 (the pause)", n)
	}
	// The break is labelled with the quiet stretch between the events
	// either side: from B waiting (+0.006s) to the grant (+1.019s).
	if !strings.Contains(data, ">1.013s<") {
		t.Errorf("the break is not labelled 1.013s:\n%s", data)
	}
}

func TestAxisIsMonotonic(t *testing.T) {
	times := []float64{0, 0.003, 0.006, 1.019, 1.021, 1.025, 1.027, 1.029}
	ax := newAxis(times, 100, 900)
	if len(ax.segs) != 2 {
		t.Fatalf("%d segments, want 2", len(ax.segs))
	}
	prev := -1.0
	for ts := -0.1; ts <= 1.2; ts += 0.0005 {
		x := ax.x(ts)
		if x < prev-1e-9 || x < 100 || x > 900 {
			t.Fatalf("x(%v) = %v after %v: not monotonic within [100, 900]", ts, x, prev)
		}
		prev = x
	}
	if got := ax.x(1.029); got > 900-segmentPad+0.01 || got < 900-segmentPad-0.01 {
		t.Errorf("last event at x=%v, want %v", got, 900-segmentPad)
	}
	// A short stretch beside a long one stays to scale: one break only.
	if ax := newAxis([]float64{0, 0.0001, 0.015, 0.998, 0.999, 1.0, 1.002, 1.003}, 0, 800); len(ax.segs) != 2 {
		t.Errorf("one long quiet stretch: %d segments, want 2", len(ax.segs))
	}
	// No break when the events are spread evenly.
	if ax := newAxis([]float64{0, 1, 2, 3}, 0, 800); len(ax.segs) != 1 {
		t.Errorf("evenly spread events: %d segments, want 1", len(ax.segs))
	}
}

func TestEscaping(t *testing.T) {
	nasty := `<b>&"x"</b>`
	tl := &Timeline{
		Title: "title " + nasty,
		Lanes: []string{"lane " + nasty},
		Spans: []Span{{Lane: "lane " + nasty, Start: at(0), End: at(100), Kind: "kind " + nasty, Label: "span " + nasty}},
		Marks: []Mark{{Lane: "lane " + nasty, At: at(50), Kind: "mark " + nasty, Label: "mark " + nasty}},
		Notes: []string{"note " + nasty},
	}
	svg := render(t, tl.SVG)
	doc := parseSVG(t, svg)
	if bytes.Contains(svg, []byte(nasty)) {
		t.Errorf("SVG contains the label unescaped:\n%s", svg)
	}
	joined := strings.Join(doc.texts, "\n")
	for _, want := range []string{"title " + nasty, "lane " + nasty, "mark " + nasty, "note " + nasty} {
		if !strings.Contains(joined, want) {
			t.Errorf("SVG text does not read back %q", want)
		}
	}
	page := render(t, tl.HTML)
	if bytes.Contains(page, []byte(nasty)) {
		t.Errorf("HTML contains the label unescaped:\n%s", page)
	}
	if !bytes.Contains(page, []byte("&lt;b&gt;&amp;")) {
		t.Errorf("HTML lacks the escaped label:\n%s", page)
	}
	text := string(render(t, tl.Text))
	if !strings.Contains(text, "mark "+nasty) {
		t.Errorf("text timeline should show labels as they are:\n%s", text)
	}
}

func TestEmptyTimeline(t *testing.T) {
	for _, tl := range []*Timeline{{}, {Title: "nothing happened", Lanes: []string{"A"}}} {
		if text := render(t, tl.Text); len(text) != 0 {
			t.Errorf("Text of an empty timeline: %q", text)
		}
		doc := parseSVG(t, render(t, tl.SVG))
		if doc.marks != 0 {
			t.Errorf("%d marks in an empty timeline", doc.marks)
		}
		if page := render(t, tl.HTML); !bytes.Contains(page, []byte("<svg")) {
			t.Errorf("HTML of an empty timeline has no SVG:\n%s", page)
		}
	}
	parseSVG(t, render(t, (&Page{}).SVG))
}

func TestOneInstant(t *testing.T) {
	tl := &Timeline{Marks: []Mark{{Lane: "A", At: at(0), Kind: MarkGrant, Label: "token 1"}, {Lane: "B", At: at(0), Kind: MarkInfo}}}
	doc := parseSVG(t, render(t, tl.SVG))
	if doc.marks != 2 || len(doc.lanes) != 2 {
		t.Errorf("%d marks and lanes %q, want 2 marks in lanes A and B", doc.marks, doc.lanes)
	}
}

func TestHTMLContainsSVG(t *testing.T) {
	tl := story()
	page := string(render(t, tl.HTML))
	for _, want := range []string{"<!DOCTYPE html>", "<svg xmlns=\"http://www.w3.org/2000/svg\"", "</svg>", "<pre>",
		"+1.027s  A        wrote &#34;A&#34;: accepted", "LOST UPDATE: the value is A&#39;s"} {
		if !strings.Contains(page, want) {
			t.Errorf("HTML lacks %q:\n%s", want, page)
		}
	}
	for _, external := range []string{"http://", "https://", "src="} {
		if n := strings.Count(page, external); external != "http://" && n > 0 || external == "http://" && n != 1 {
			t.Errorf("HTML refers to an external resource (%q appears %d times)", external, n)
		}
	}
	// The SVG inside the page is well-formed on its own.
	start, end := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	parseSVG(t, []byte(page[start:end+len("</svg>")]))
}

func TestPage(t *testing.T) {
	run1, run2 := story(), story()
	run2.Title = "with fencing"
	run2.Marks[5] = Mark{Lane: "A", At: at(1027), Kind: MarkWriteRejected, Label: "stale fencing token 33 < 34"}
	p := &Page{Title: "fence demo", Timelines: []*Timeline{run1, run2}, Notes: []string{"both runs as expected"}}
	doc := parseSVG(t, render(t, p.SVG))
	if len(doc.lanes) != 6 || doc.marks != 14 {
		t.Errorf("page SVG: lanes %q and %d marks, want 6 lanes and 14 marks", doc.lanes, doc.marks)
	}
	page := string(render(t, p.HTML))
	if n := strings.Count(page, "<svg"); n != 2 {
		t.Errorf("page HTML has %d SVGs, want 2", n)
	}
	for _, want := range []string{"<h1>fence demo</h1>", "<h2>with fencing</h2>", "stale fencing token 33 &lt; 34"} {
		if !strings.Contains(page, want) {
			t.Errorf("page HTML lacks %q", want)
		}
	}
}

func TestDeterministic(t *testing.T) {
	p := &Page{Title: "x", Timelines: []*Timeline{story(), story()}}
	for name, f := range map[string]func(io.Writer) error{"svg": p.SVG, "html": p.HTML, "text": story().Text} {
		a, b := render(t, f), render(t, f)
		if !bytes.Equal(a, b) {
			t.Errorf("%s output differs between two renderings", name)
		}
	}
}

func TestManyMarks(t *testing.T) {
	tl := &Timeline{}
	for i := range 500 {
		lane := []string{"w1", "w2", "w3"}[i%3]
		tl.Marks = append(tl.Marks, Mark{Lane: lane, At: at(i), Kind: MarkWriteOK, Label: "a write with a long label number " + strings.Repeat("x", i%40)})
		tl.Spans = append(tl.Spans, Span{Lane: lane, Start: at(i), End: at(i + 7), Kind: SpanLease})
	}
	tl.Spans = append(tl.Spans, Span{Lane: "server", Start: at(100), Kind: SpanDown, Label: "killed"})
	data := render(t, tl.SVG)
	doc := parseSVG(t, data)
	if doc.marks != 500 || len(doc.lanes) != 4 {
		t.Errorf("%d marks and lanes %q, want 500 and 4", doc.marks, doc.lanes)
	}
	text := string(render(t, tl.Text))
	if !strings.Contains(text, "+0.100s  server  killed (for 0.406s)") {
		t.Errorf("an open span should last to the last event:\n%s", text[:min(len(text), 2000)])
	}
}

func TestWrap(t *testing.T) {
	got := wrap("one two three four\nfive "+strings.Repeat("x", 12), 10)
	want := []string{"one two", "three four", "five", "xxxxxxxxxx", "xx"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}
