package server

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/clock"
)

// The limiter logs a key's first line, holds back the others for a
// minute, and says how many it held back on the next line it logs;
// forget lets the next line through at once.
func TestLogLimiterCountsWhatItHoldsBack(t *testing.T) {
	clk := clock.NewFake()
	l := &logLimiter{clock: clk}
	rec := &logRecorder{}
	logger := rec.logger()
	for range 5 {
		l.log(logger, slog.LevelWarn, "a", "peer unreachable", "peer", "n2")
	}
	l.log(logger, slog.LevelWarn, "b", "peer unreachable", "peer", "n3")
	clk.Advance(59 * time.Second)
	l.log(logger, slog.LevelWarn, "a", "peer unreachable", "peer", "n2")
	clk.Advance(time.Second)
	l.log(logger, slog.LevelWarn, "a", "peer unreachable", "peer", "n2")
	got := rec.atLeast(slog.LevelDebug)
	if len(got) != 3 || got[0].Attrs["peer"] != "n2" || got[1].Attrs["peer"] != "n3" || got[2].Attrs["suppressed"] != "5" {
		t.Fatalf("records %v; want n2's first, n3's first, and n2's a minute later with suppressed=5", got)
	}
	if _, ok := got[0].Attrs["suppressed"]; ok {
		t.Errorf("a key's first line says suppressed: %v", got[0])
	}
	l.log(logger, slog.LevelWarn, "a", "peer unreachable", "peer", "n2")
	since, suppressed, ok := l.forget("a")
	if !ok || suppressed != 1 || !since.Equal(clk.Now().Add(-time.Minute)) {
		t.Fatalf("forget = %v, %d, %v; want the first line's time, 1, true", since, suppressed, ok)
	}
	l.log(logger, slog.LevelWarn, "a", "peer unreachable", "peer", "n2")
	if n := len(rec.atLeast(slog.LevelDebug)); n != 4 {
		t.Fatalf("%d records after forget and one more line, want 4", n)
	}
}
