import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client, Endpoint } from "./client.js";
import { UnavailableError, fromConnect } from "./errors.js";
import {
  type CompareSchema,
  CompareOp,
  type Event,
  type FenceSchema,
  type KeyValue,
  type TxnOpSchema,
  type TxnResponse,
  type WatchResponse,
} from "./gen/fence/v1/fence_pb.js";
import type { Grant } from "./mutex.js";
import type { Session } from "./session.js";
import { abortable, toDuration } from "./time.js";

export type { Event, KeyValue, TxnResponse };

/** A value: bytes, or a string stored as UTF-8. */
export type Value = string | Uint8Array;

/**
 * How a write is fenced. With a token, the store refuses the write with
 * StaleTokenError when the key has seen a higher one; with strict, the
 * token must also be the lock's current grant (NotHolderError otherwise).
 */
export interface FenceOptions {
  /** Fence with a grant's lock and token (instead of lock and token). */
  grant?: Grant;
  /** The lock the token is of (as `fence lock` passes FENCE_LOCK); needed with strict. */
  lock?: string;
  /** The fencing token, as `fence lock` passes FENCE_TOKEN. */
  token?: bigint;
  /** Require the token to be the lock's current grant, not only at least the key's highest. */
  strict?: boolean;
  /** Compare-and-swap: apply only if the key's mod revision is this (0n: the key must not exist), or fail with RevisionMismatchError. */
  ifRevision?: bigint;
}

/** How a write is made; fenced as FenceOptions says. */
export interface WriteOptions extends FenceOptions {
  /**
   * The idempotency key every attempt of the write carries, so that a retry
   * after a lost answer is applied once (default: a new random key per
   * call). Give your own to make a write that your program retries (after a
   * crash, say) apply once too.
   */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

/** What list read. */
export interface Listing {
  /** The keys, in key order. */
  kvs: KeyValue[];
  /** More keys match than were returned. */
  more: boolean;
  /** The store's revision when the keys were read: watch from revision + 1n to see every change after. */
  revision: bigint;
}

/** One compare of a txn: what of key is compared, by op, with what. */
export type TxnCompare =
  | { key: string; op?: "=" | "!=" | "<" | ">"; value: Value }
  | { key: string; op?: "=" | "!=" | "<" | ">"; version: bigint }
  | { key: string; op?: "=" | "!=" | "<" | ">"; createRevision: bigint }
  | { key: string; op?: "=" | "!=" | "<" | ">"; modRevision: bigint }
  | { key: string; absent: boolean };

/** One operation of a txn. */
export type TxnOperation = { put: { key: string; value: Value } } | { delete: string } | { get: string };

const compareOps = { "=": CompareOp.EQUAL, "!=": CompareOp.NOT_EQUAL, "<": CompareOp.LESS, ">": CompareOp.GREATER } as const;

const encoder = new TextEncoder();

function bytes(v: Value): Uint8Array {
  return typeof v === "string" ? encoder.encode(v) : v;
}

/** The Fence message of o. */
function fenceOf(o: FenceOptions): MessageInitShape<typeof FenceSchema> {
  return {
    lock: o.grant?.lock ?? o.lock ?? "",
    token: o.grant?.token ?? o.token ?? 0n,
    strict: o.strict ?? false,
    ...(o.ifRevision === undefined ? {} : { expectRevision: o.ifRevision }),
  };
}

/**
 * The service's fenced key-value store: it keeps, per key, the highest
 * fencing token it accepted and refuses writes with a lower one
 * (StaleTokenError, carrying the key's token and the write's). Get it as
 * Client.kv. Every write carries an idempotency key across its retries, so
 * a write whose answer was lost is applied once; one that fails with
 * UnavailableError may or may not have been applied.
 */
export class KV {
  /** @internal */
  constructor(readonly client: Client) {}

  /** Writes value under key and returns the key's new mod revision. */
  async put(key: string, value: Value, options: WriteOptions & { boundTo?: Session } = {}): Promise<bigint> {
    const req = {
      key,
      value: bytes(value),
      fence: fenceOf(options),
      sessionId: options.boundTo?.id ?? 0n,
      sessionSecret: options.boundTo?.secret ?? "",
    };
    const headers = idempotent(options);
    const r = await this.client.unary((ep, signal) => ep.kv.put(req, { signal, headers }), options.signal);
    return r.revision;
  }

  /** Reads key, linearizably unless stale; undefined when it does not exist. */
  async get(key: string, options: { stale?: boolean; signal?: AbortSignal } = {}): Promise<KeyValue | undefined> {
    const r = await this.client.unary((ep, signal) => ep.kv.get({ key, stale: options.stale ?? false }, { signal }), options.signal);
    return r.found ? r.kv : undefined;
  }

  /** Removes key, fenced like put, and reports whether it existed. */
  async delete(key: string, options: WriteOptions = {}): Promise<boolean> {
    const req = { key, fence: fenceOf(options) };
    const headers = idempotent(options);
    const r = await this.client.unary((ep, signal) => ep.kv.delete(req, { signal, headers }), options.signal);
    return r.deleted;
  }

  /** Reads up to 1000 keys that start with prefix, in key order; linearizably unless stale. */
  async list(prefix: string, options: { stale?: boolean; signal?: AbortSignal } = {}): Promise<Listing> {
    const r = await this.client.unary((ep, signal) => ep.kv.list({ prefix, stale: options.stale ?? false }, { signal }), options.signal);
    return { kvs: r.kvs, more: r.more, revision: r.revision };
  }

  /**
   * Compares keys and, in one commit, runs `then` if every compare holds
   * and `else` otherwise, as etcd's Txn does; the whole is fenced by one
   * token (FenceOptions). A compare without op is "=".
   */
  async txn(
    txn: { if?: TxnCompare[]; then?: TxnOperation[]; else?: TxnOperation[] },
    options: WriteOptions = {},
  ): Promise<TxnResponse> {
    const req = {
      compares: (txn.if ?? []).map(compareOf),
      then: (txn.then ?? []).map(opOf),
      else: (txn.else ?? []).map(opOf),
      fence: fenceOf(options),
    };
    const headers = idempotent(options);
    return this.client.unary((ep, signal) => ep.kv.txn(req, { signal, headers }), options.signal);
  }

  /**
   * Starts watching the keys that start with prefix and resolves once the
   * watch is in place: every change committed after that is delivered, in
   * commit order (and, with fromRevision, those from that revision on).
   * When the stream breaks (its node fails or loses leadership), the watch
   * resumes on the leader from the revision after the last one delivered,
   * within the retry budget, so that no change is missed or delivered
   * twice. Iteration ends when the signal aborts or the loop breaks, and
   * throws when the watch cannot go on (CompactedError: list again, and
   * watch from there).
   */
  async watch(prefix: string, options: { fromRevision?: bigint; signal?: AbortSignal } = {}): Promise<Watch> {
    const w = new Watch(this.client, prefix, options.fromRevision ?? 0n, options.signal);
    await w.start();
    return w;
  }
}

/** A change stream of the KV store; see KV.watch. Iterate it once. */
export class Watch implements AsyncIterable<Event>, AsyncDisposable {
  readonly #client: Client;
  readonly #prefix: string;
  /** The revision the stream opens at: the first event not yet delivered (0n until the first stream said where it started). */
  #next: bigint;
  readonly #closed: ReturnType<typeof abortable>;
  #stream: WatchStream | undefined;

  /** @internal */
  constructor(client: Client, prefix: string, from: bigint, signal: AbortSignal | undefined) {
    this.#client = client;
    this.#prefix = prefix;
    this.#next = from;
    this.#closed = abortable(signal);
  }

  /** Opens the first stream and waits until it is in place. @internal */
  async start(): Promise<void> {
    const [stream, header] = await this.#open();
    if (this.#next === 0n) {
      this.#next = header + 1n;
    }
    this.#stream = stream;
  }

  /** Ends the watch; an iteration in progress ends too. */
  close(): void {
    this.#closed.abort(new DOMException("the watch was closed", "AbortError"));
    this.#closed.dispose();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Event> {
    try {
      for (let stream = this.#stream; stream; ) {
        let err: unknown;
        try {
          for (;;) {
            const msg = await stream.receive();
            if (!msg) {
              break;
            }
            for (const ev of msg.events) {
              yield ev;
              this.#next = (ev.kv?.modRevision ?? 0n) + 1n;
            }
          }
          err = new UnavailableError("fence: the watch stream ended");
        } catch (e) {
          err = fromConnect(e);
        } finally {
          stream.close();
        }
        if (this.#closed.signal.aborted) {
          return;
        }
        if (!(err instanceof UnavailableError)) {
          throw err;
        }
        [stream] = await this.#open();
      }
    } finally {
      this.close();
    }
  }

  /**
   * Starts a stream at next and waits for the server's "in place" message,
   * whose revision it returns. The server sends progress every attempt
   * timeout while there is no event; a stream silent for three of those is
   * given up for another node.
   */
  #open(): Promise<[WatchStream, bigint]> {
    const interval = this.#client.attemptTimeoutMs;
    return this.#client.call(async (ep, signal) => {
      const stream = new WatchStream(ep, 3 * interval, signal);
      try {
        stream.start(ep.kv.watch({ prefix: this.#prefix, startRevision: this.#next, progressInterval: toDuration(interval) }, { signal: stream.signal }));
        const first = await stream.receive();
        if (!first) {
          throw new UnavailableError("fence: the watch stream ended before it was in place");
        }
        return [stream, first.revision];
      } catch (err) {
        stream.close();
        throw err;
      }
    }, this.#closed.signal);
  }
}

/** One Watch call on one node, with the watchdog that ends it when the node sends nothing for too long. */
class WatchStream {
  readonly #call: ReturnType<typeof abortable>;
  #messages: AsyncIterator<WatchResponse> | undefined;

  constructor(
    readonly ep: Endpoint,
    readonly limitMs: number,
    signal: AbortSignal | undefined,
  ) {
    this.#call = abortable(signal);
  }

  get signal(): AbortSignal {
    return this.#call.signal;
  }

  start(messages: AsyncIterable<WatchResponse>): void {
    this.#messages = messages[Symbol.asyncIterator]();
  }

  /** The next message, or undefined when the stream ended; a silent node is an UnavailableError. */
  async receive(): Promise<WatchResponse | undefined> {
    const silent = new UnavailableError(`fence: ${this.ep.url} sent nothing on the watch for ${this.limitMs} ms`);
    const watchdog = setTimeout(() => this.#call.abort(silent), this.limitMs);
    try {
      const r = await this.#messages!.next();
      return r.done ? undefined : r.value;
    } catch (err) {
      if (this.#call.signal.reason === silent) {
        this.ep.silentUntil = Date.now() + 3_000;
        throw silent;
      }
      throw err;
    } finally {
      clearTimeout(watchdog);
    }
  }

  close(): void {
    this.#call.abort(new DOMException("the watch stream was closed", "AbortError"));
    this.#call.dispose();
  }
}

/** The headers of a write: its idempotency key. */
function idempotent(o: WriteOptions): Record<string, string> {
  return { "Idempotency-Key": o.idempotencyKey ?? crypto.randomUUID() };
}

function compareOf(c: TxnCompare): MessageInitShape<typeof CompareSchema> {
  if ("absent" in c) {
    return { key: c.key, target: { case: "absent", value: c.absent } };
  }
  const op = compareOps[c.op ?? "="];
  if ("value" in c) {
    return { key: c.key, op, target: { case: "value", value: bytes(c.value) } };
  }
  if ("version" in c) {
    return { key: c.key, op, target: { case: "version", value: c.version } };
  }
  if ("createRevision" in c) {
    return { key: c.key, op, target: { case: "createRevision", value: c.createRevision } };
  }
  return { key: c.key, op, target: { case: "modRevision", value: c.modRevision } };
}

function opOf(o: TxnOperation): MessageInitShape<typeof TxnOpSchema> {
  if ("put" in o) {
    return { op: { case: "put", value: { key: o.put.key, value: bytes(o.put.value) } } };
  }
  if ("delete" in o) {
    return { op: { case: "delete", value: { key: o.delete } } };
  }
  return { op: { case: "get", value: { key: o.get } } };
}
