// Time and cancellation helpers. Every deadline the client keeps (a
// session's safe-until, a keepalive's schedule) is on the monotonic clock:
// a wall clock set back or forward moves none of them.

import { setTimeout as delay } from "node:timers/promises";
import { type Duration, durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";

/** Milliseconds on this process's monotonic clock (performance.now()). */
export function monotonicNow(): number {
  return performance.now();
}

/** A timer of a Clock. */
export interface ClockTimer {
  clear(): void;
}

/**
 * The clock of sessions' schedules and safe-until deadlines: now() in
 * milliseconds on a monotonic clock, and timers on it. Tests pass a fake
 * that they advance by hand.
 */
export interface Clock {
  now(): number;
  setTimer(fn: () => void, ms: number): ClockTimer;
}

/** performance.now() and Node's timers. */
export const realClock: Clock = {
  now: monotonicNow,
  setTimer(fn, ms) {
    const t = setTimeout(fn, ms);
    return { clear: () => clearTimeout(t) };
  },
};

/** Resolves after ms, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return delay(Math.max(0, ms), undefined, { signal });
}

/** An AbortController that also aborts, with the same reason, when any of parents does. */
export interface Abortable {
  readonly signal: AbortSignal;
  abort(reason: unknown): void;
  /** Stops following the parents; call it when the work under signal is over. */
  dispose(): void;
}

/** Returns an Abortable that follows parents (those not undefined). */
export function abortable(...parents: (AbortSignal | undefined)[]): Abortable {
  const controller = new AbortController();
  const followed: [AbortSignal, () => void][] = [];
  for (const parent of parents) {
    if (!parent) {
      continue;
    }
    if (parent.aborted) {
      controller.abort(parent.reason);
      break;
    }
    const onAbort = () => controller.abort(parent.reason);
    parent.addEventListener("abort", onAbort, { once: true });
    followed.push([parent, onAbort]);
  }
  return {
    signal: controller.signal,
    abort: (reason) => controller.abort(reason),
    dispose: () => {
      for (const [parent, onAbort] of followed) {
        parent.removeEventListener("abort", onAbort);
      }
    },
  };
}

/** A protobuf Duration of ms, rounded up to a whole millisecond (the wire's nanos are integers). */
export function toDuration(ms: number): Duration {
  return durationFromMs(Math.ceil(ms));
}

/** A protobuf Duration in milliseconds, 0 when unset. */
export function fromDuration(d: Duration | undefined): number {
  return d ? durationMs(d) : 0;
}
