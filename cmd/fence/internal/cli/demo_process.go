package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fence/internal/proc"
)

// demoWorker is a running `fence demo worker` process.
type demoWorker struct {
	name string // A or B
	p    *proc.Process
}

// parseEvent reads a worker's report line.
func parseEvent(l proc.Line) demoEvent {
	ev := demoEvent{at: l.At}
	if err := json.Unmarshal([]byte(l.Text), &ev); err != nil {
		return demoEvent{Event: "error", Message: fmt.Sprintf("unreadable report %q", l.Text), at: l.At}
	}
	return ev
}

// expect waits for the worker's next event, which must be one of want.
func (w *demoWorker) expect(ctx context.Context, timeout time.Duration, want ...string) (demoEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-w.p.Lines():
		if !ok {
			return demoEvent{}, fmt.Errorf("worker %s exited (%v) before reporting %s%s", w.name, w.p.State(), strings.Join(want, " or "), w.stderrTail())
		}
		ev := parseEvent(l)
		if slices.Contains(want, ev.Event) {
			return ev, nil
		}
		return ev, fmt.Errorf("worker %s reported %s, want %s%s", w.name, describe(ev), strings.Join(want, " or "), w.stderrTail())
	case <-t.C:
		return demoEvent{}, fmt.Errorf("worker %s did not report %s within %v%s", w.name, strings.Join(want, " or "), timeout, w.stderrTail())
	case <-ctx.Done():
		return demoEvent{}, ctx.Err()
	}
}

// command sends a command line to the worker and waits for its answer.
func (w *demoWorker) command(ctx context.Context, command string, want ...string) (demoEvent, error) {
	if err := w.p.WriteLine(command); err != nil {
		return demoEvent{}, fmt.Errorf("telling worker %s to %s: %w%s", w.name, command, err, w.stderrTail())
	}
	return w.expect(ctx, stepTimeout, want...)
}

// act tells the worker to do the story's step now (the write, the job,
// the sale), and returns how the resource answered.
func (w *demoWorker) act(ctx context.Context) (demoEvent, error) {
	return w.command(ctx, "act", "wrote", "rejected", "write-failed")
}

// waitExit waits for a worker told to exit, and fails unless it exits 0.
func (w *demoWorker) waitExit(ctx context.Context) error {
	t := time.NewTimer(stepTimeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-w.p.Lines():
			if !ok {
				if code := w.p.ExitCode(); code != 0 {
					return fmt.Errorf("worker %s exited with status %d%s", w.name, code, w.stderrTail())
				}
				return nil
			}
			if ev := parseEvent(l); ev.Event == "error" {
				return fmt.Errorf("worker %s: %s%s", w.name, ev.Message, w.stderrTail())
			}
		case <-t.C:
			return fmt.Errorf("worker %s did not exit within %v of being told to", w.name, stepTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// kill resumes the worker if it is paused, kills it and reaps it.
func (w *demoWorker) kill() {
	_ = w.p.Kill()
	for range w.p.Lines() {
	}
}

func (w *demoWorker) stderrTail() string {
	if s := strings.TrimSpace(w.p.Stderr()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}
