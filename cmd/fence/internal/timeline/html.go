package timeline

import (
	"bytes"
	"html"
	"io"
)

// HTML writes the timeline as a self-contained page (no external
// resources): its title, the SVG picture inline, the notes, and the text
// timeline in a <pre>.
func (t *Timeline) HTML(w io.Writer) error {
	return writeHTML(w, t.Title, nil, []*Timeline{t}, false)
}

// HTML writes the page as one self-contained HTML document: its title and
// notes, then for each timeline a section with its title, its SVG picture
// inline, its notes and its text timeline.
func (p *Page) HTML(w io.Writer) error {
	return writeHTML(w, p.Title, p.Notes, p.Timelines, true)
}

const pageStyle = `body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;max-width:1000px;margin:2em auto;padding:0 1em;line-height:1.45}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}
svg{max-width:100%;height:auto;display:block;margin:1em 0}
ul.notes{padding-left:1.2em}
pre{background:#f6f8fa;border:1px solid #e3e6ea;border-radius:4px;padding:0.8em 1em;overflow-x:auto;font-size:13px;line-height:1.35}`

func writeHTML(w io.Writer, title string, notes []string, ts []*Timeline, headings bool) error {
	var b bytes.Buffer
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
	b.WriteString("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n")
	b.WriteString("<title>" + html.EscapeString(orDefault(title, "timeline")) + "</title>\n")
	b.WriteString("<style>\n" + pageStyle + "\n</style>\n</head>\n<body>\n")
	if title != "" {
		b.WriteString("<h1>" + html.EscapeString(title) + "</h1>\n")
	}
	for _, n := range notes {
		b.WriteString("<p>" + html.EscapeString(n) + "</p>\n")
	}
	for _, t := range ts {
		b.WriteString("<section>\n")
		if headings && t.Title != "" {
			b.WriteString("<h2>" + html.EscapeString(t.Title) + "</h2>\n")
		}
		if err := (&Page{Timelines: []*Timeline{t}}).svg(&b, svgOptions{}); err != nil {
			return err
		}
		if len(t.Notes) > 0 {
			b.WriteString("<ul class=\"notes\">\n")
			for _, n := range t.Notes {
				b.WriteString("<li>" + html.EscapeString(n) + "</li>\n")
			}
			b.WriteString("</ul>\n")
		}
		var text bytes.Buffer
		if err := t.Text(&text); err != nil {
			return err
		}
		if text.Len() > 0 {
			b.WriteString("<pre>" + html.EscapeString(text.String()) + "</pre>\n")
		}
		b.WriteString("</section>\n")
	}
	b.WriteString("</body>\n</html>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
