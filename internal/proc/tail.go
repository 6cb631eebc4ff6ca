package proc

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// Tail keeps the last Max bytes written to it, or all of them when Max is
// 0. It is safe for concurrent use.
type Tail struct {
	Max int

	mu  sync.Mutex
	buf []byte
}

// Write implements io.Writer; it never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if t.Max > 0 && len(t.buf) > t.Max {
		t.buf = t.buf[len(t.buf)-t.Max:]
	}
	return len(p), nil
}

// String returns what is kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// LastLines returns the last n lines of s, without a final newline.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// prefixMu serializes the lines of every prefix writer, so that lines of
// several processes on one terminal do not mix.
var prefixMu sync.Mutex

// prefixWriter writes whole lines, each with a prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string

	mu   sync.Mutex
	line []byte // the start of a line not yet ended
}

// NewPrefixWriter returns a writer that passes each complete line to w
// with prefix before it, in one write. Lines from all such writers are
// written one at a time; an unfinished last line is never written.
func NewPrefixWriter(w io.Writer, prefix string) io.Writer {
	return &prefixWriter{w: w, prefix: prefix}
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line = append(p.line, b...)
	for {
		i := bytes.IndexByte(p.line, '\n')
		if i < 0 {
			return len(b), nil
		}
		prefixMu.Lock()
		_, err := io.WriteString(p.w, p.prefix+string(p.line[:i+1]))
		prefixMu.Unlock()
		p.line = p.line[i+1:]
		if err != nil {
			return len(b), err
		}
	}
}
