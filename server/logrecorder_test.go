package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// loggedRecord is one record a logRecorder kept, its attributes as text.
type loggedRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (r loggedRecord) String() string {
	return fmt.Sprintf("%s %q %v", r.Level, r.Msg, r.Attrs)
}

// logRecorder keeps every record of the loggers it makes, for a test to
// look at what a node logged and at which level.
type logRecorder struct {
	mu   sync.Mutex
	recs []loggedRecord
}

func (r *logRecorder) logger() *slog.Logger { return slog.New(recordingHandler{r: r}) }

// atLeast returns the records of level or above.
func (r *logRecorder) atLeast(level slog.Level) []loggedRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []loggedRecord
	for _, rec := range r.recs {
		if rec.Level >= level {
			out = append(out, rec)
		}
	}
	return out
}

// find returns the records of level with message msg.
func (r *logRecorder) find(level slog.Level, msg string) []loggedRecord {
	var out []loggedRecord
	for _, rec := range r.atLeast(level) {
		if rec.Level == level && rec.Msg == msg {
			out = append(out, rec)
		}
	}
	return out
}

type recordingHandler struct {
	r     *logRecorder
	attrs []slog.Attr
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordingHandler) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{}
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.r.recs = append(h.r.recs, loggedRecord{Level: rec.Level, Msg: rec.Message, Attrs: attrs})
	return nil
}

func (h recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return h
}

func (h recordingHandler) WithGroup(string) slog.Handler { return h }

// nodeLogs records the logs of a test cluster's nodes, one recorder per
// node id, kept across restarts.
type nodeLogs struct {
	mu    sync.Mutex
	byID  map[string]*logRecorder
	order []string
}

// edit is a startCluster edit that gives each node its recorder's logger.
func (l *nodeLogs) edit(cfg *Config) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*logRecorder{}
	}
	r := l.byID[cfg.NodeID]
	if r == nil {
		r = &logRecorder{}
		l.byID[cfg.NodeID] = r
		l.order = append(l.order, cfg.NodeID)
	}
	cfg.Logger = r.logger()
}

func (l *nodeLogs) of(id string) *logRecorder {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

// atLeast returns every node's records of level or above, each prefixed
// with its node's id in Attrs["node"].
func (l *nodeLogs) atLeast(level slog.Level) []loggedRecord {
	l.mu.Lock()
	ids := append([]string(nil), l.order...)
	l.mu.Unlock()
	var out []loggedRecord
	for _, id := range ids {
		for _, rec := range l.of(id).atLeast(level) {
			rec.Attrs["node"] = id
			out = append(out, rec)
		}
	}
	return out
}

func recordsText(recs []loggedRecord) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintln(&b, r)
	}
	return b.String()
}
