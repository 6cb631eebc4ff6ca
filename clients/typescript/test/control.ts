// The suite's way to real nodes: the control service that the Go test
// TestTypeScriptClient serves on loopback (clients/control_test.go), which
// starts groups of `fence serve` processes and kills, pauses, resumes and
// restarts their nodes with real signals.

import { readFileSync } from "node:fs";
import { setTimeout as delay } from "node:timers/promises";
import type { TestContext } from "node:test";
import { Client, type ClientOptions, type Session } from "@fencelock/client";

const controlURL = process.env["FENCE_TEST_CONTROL"];

/** What POST /groups answers. */
interface GroupInfo {
  id: string;
  endpoints: string[];
  nodes: string[];
  ca_file: string;
  token: string;
}

async function control<T>(method: string, path: string, body?: unknown): Promise<T> {
  if (!controlURL) {
    throw new Error("FENCE_TEST_CONTROL is not set: run the suite with go test -run TestTypeScriptClient ./clients/");
  }
  const res = await fetch(controlURL + path, { method, body: body === undefined ? undefined : JSON.stringify(body) });
  const out = (await res.json()) as T & { error?: string };
  if (!res.ok) {
    throw new Error(`control ${method} ${path}: ${out.error ?? res.status}`);
  }
  return out;
}

/** A group of fence nodes that the control service runs for this suite. */
export class Group {
  private constructor(readonly info: GroupInfo) {}

  /** Starts a group; it stops when the Go test ends. */
  static async start(spec: { nodes?: number; tls?: boolean; auth?: boolean } = {}): Promise<Group> {
    return new Group(await control<GroupInfo>("POST", "/groups", { nodes: spec.nodes ?? 1, tls: spec.tls ?? false, auth: spec.auth ?? false }));
  }

  get endpoints(): string[] {
    return this.info.endpoints;
  }

  /** A client of the group, with its CA and token unless options say otherwise. */
  client(options: ClientOptions = {}): Client {
    return new Client({
      endpoints: this.endpoints,
      ...(this.info.ca_file ? { tls: { ca: readFileSync(this.info.ca_file) } } : {}),
      ...(this.info.token ? { token: this.info.token } : {}),
      ...options,
    });
  }

  /** The node that leads, once one does. */
  leader(): Promise<{ node: string; endpoint: string }> {
    return control("GET", `/groups/${this.info.id}/leader`);
  }

  /** kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT) or restart a node: an id, "leader" or "all". */
  async act(verb: "kill" | "pause" | "resume" | "restart", node: string): Promise<string[]> {
    return (await control<{ nodes: string[] }>("POST", `/groups/${this.info.id}/${verb}`, { node })).nodes;
  }
}

/**
 * Polls fn until it returns something other than undefined or false, and
 * returns that; fails after timeoutMs, saying what it waited for.
 */
export async function waitFor<T>(what: string, fn: () => T | undefined | false | Promise<T | undefined | false>, timeoutMs = 10_000): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined && v !== false) {
      return v;
    }
    if (performance.now() > deadline) {
      throw new Error(`waited ${timeoutMs} ms for ${what}`);
    }
    await delay(20);
  }
}

/** Resolves with signal's reason once it aborts. */
export function aborted(signal: AbortSignal): Promise<unknown> {
  return new Promise((resolve) => {
    if (signal.aborted) {
      resolve(signal.reason);
      return;
    }
    signal.addEventListener("abort", () => resolve(signal.reason), { once: true });
  });
}

/** Closes the sessions when the test ends, passed or failed: a live session keeps the process running. */
export function closeAfter(t: TestContext, ...sessions: Session[]): void {
  t.after(() => Promise.allSettled(sessions.map((s) => s.close())));
}
