// A Clock that the test advances by hand, as Go's internal/clock.Fake.

import type { Clock, ClockTimer } from "@fencelock/client";

export class FakeClock implements Clock {
  #now = 0;
  #timers = new Set<{ at: number; fn: () => void }>();

  now(): number {
    return this.#now;
  }

  setTimer(fn: () => void, ms: number): ClockTimer {
    const timer = { at: this.#now + ms, fn };
    this.#timers.add(timer);
    return { clear: () => this.#timers.delete(timer) };
  }

  /**
   * Moves the clock ms on at once, as a process paused for ms finds it on
   * waking, then runs the timers due by then, earliest first: all of them,
   * or the first `run` (the others have not run yet).
   */
  advance(ms: number, run = Infinity): void {
    this.#now += ms;
    const due = [...this.#timers].filter((t) => t.at <= this.#now).sort((a, b) => a.at - b.at);
    for (const t of due.slice(0, run)) {
      if (this.#timers.delete(t)) {
        t.fn();
      }
    }
  }
}
