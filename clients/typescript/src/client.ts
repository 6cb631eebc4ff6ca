import { createClient, type Client as ServiceClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  ClusterService,
  KVService,
  LockService,
  SessionService,
  type LockInfo,
  type StatusResponse,
} from "./gen/fence/v1/fence_pb.js";
import {
  UnauthenticatedError,
  UnavailableError,
  UnreachableError,
  WrongClusterError,
  connectionFailed,
  fromConnect,
} from "./errors.js";
import { type Clock, abortable, monotonicNow, realClock, sleep } from "./time.js";
import { KV } from "./kv.js";
import { Session, type SessionOptions } from "./session.js";
import { Lease, type LeaseOptions, takeLease } from "./lease.js";
import { type LeaderState, leaderOf, observeLeader } from "./election.js";

/** Where `fence serve` listens by default. */
export const DEFAULT_ENDPOINT = "127.0.0.1:7420";

/** How the client reaches the nodes over TLS. */
export interface TLSOptions {
  /** The CA certificates (PEM) that sign the nodes' certificates; the system's when unset. */
  ca?: string | Buffer;
  /** A client certificate and its key (PEM), for nodes that require one. */
  cert?: string | Buffer;
  key?: string | Buffer;
}

/** The options of a Client; every one has a default. */
export interface ClientOptions {
  /** The nodes, as host:port or URLs (default 127.0.0.1:7420). Any node will do: the client finds the leader. */
  endpoints?: string[];
  /** Talk to the nodes over TLS; endpoints given as host:port are then reached over https. */
  tls?: TLSOptions;
  /** A bearer token (`fence token create`), sent with every call, for a group with auth on. */
  token?: string;
  /** How long a call retries while no leader answers (default 15 000 ms). 0 tries each endpoint once. */
  retryBudgetMs?: number;
  /** How long one attempt on one node may take before the next node is tried (default 1 000 ms). */
  attemptTimeoutMs?: number;
  /**
   * How long a client that has not yet talked to its group tries while no
   * node answers at all before failing with UnreachableError (default
   * 1 000 ms, as `fence --dial-timeout`). 0 waits for the retry budget.
   */
  dialTimeoutMs?: number;
  /** The clock of sessions' keepalives and safe-until deadlines (default: performance.now() and Node's timers); tests pass a fake. */
  clock?: Clock;
}

/** The headers the client sends and reads (api/fence/v1/headers.go). */
const followLeaderHeader = "Fence-Follow-Leader";
const clusterIDHeader = "Fence-Cluster-Id";

/** How long a node that did not answer in time is passed over. */
const silentForMs = 3_000;

/** One node: its URL and the service clients on it. */
export class Endpoint {
  readonly sessions: ServiceClient<typeof SessionService>;
  readonly locks: ServiceClient<typeof LockService>;
  readonly kv: ServiceClient<typeof KVService>;
  readonly cluster: ServiceClient<typeof ClusterService>;
  /** Until when (Date.now()) retries pass this node over: it did not answer in time. */
  silentUntil = 0;
  /** Set once the node turned out to be of another group: it is never used again. */
  foreign = false;

  constructor(
    readonly url: string,
    transport: Transport,
  ) {
    this.sessions = createClient(SessionService, transport);
    this.locks = createClient(LockService, transport);
    this.kv = createClient(KVService, transport);
    this.cluster = createClient(ClusterService, transport);
  }

  silent(): boolean {
    return this.foreign || Date.now() < this.silentUntil;
  }
}

/** An attempt that a node did not answer in time. */
class NoAnswerError extends UnavailableError {}

/**
 * A call runs on one node at a time: given the node and the signal of the
 * attempt, it returns the answer or throws what the call threw.
 */
export type Attempt<T> = (ep: Endpoint, signal: AbortSignal | undefined) => Promise<T>;

/**
 * Client talks to a fence group. One per process is enough; it is safe to
 * share between any number of concurrent calls and sessions.
 *
 * Calls that fail because a node is not the leader or cannot be reached
 * move on to the next endpoint and are retried, with backoff: straight to
 * the leader a node names, within the retry budget. Only calls that are
 * safe to repeat are retried (writes carry idempotency keys, acquires
 * request ids). Until one call has succeeded, a call that no node answers
 * fails after the dial timeout with UnreachableError, naming the
 * endpoints tried: most likely no node runs there. Every call takes an
 * optional AbortSignal; aborting it ends the call with the signal's reason.
 */
export class Client {
  /** The fenced key-value store. */
  readonly kv: KV;
  readonly retryBudgetMs: number;
  readonly attemptTimeoutMs: number;
  readonly dialTimeoutMs: number;
  readonly clock: Clock;

  #endpoints: Endpoint[] = [];
  readonly #sessions = new Set<Session>();
  #current = 0;
  #answered = false;
  #clusterID = "";
  readonly #tls: TLSOptions | undefined;
  readonly #interceptors: Interceptor[];

  constructor(options: ClientOptions = {}) {
    const endpoints = options.endpoints ?? [DEFAULT_ENDPOINT];
    if (endpoints.length === 0) {
      throw new TypeError("fence: no endpoints");
    }
    this.retryBudgetMs = options.retryBudgetMs ?? 15_000;
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? 1_000;
    this.dialTimeoutMs = options.dialTimeoutMs ?? 1_000;
    this.clock = options.clock ?? realClock;
    if (!(this.attemptTimeoutMs > 0)) {
      throw new TypeError(`fence: attempt timeout ${this.attemptTimeoutMs} must be positive`);
    }
    this.#tls = options.tls;
    this.#interceptors = [this.#headers(options.token)];
    for (const raw of endpoints) {
      this.#endpoints.push(this.#newEndpoint(this.#url(raw)));
    }
    this.kv = new KV(this);
  }

  /** Creates a session and starts keeping it alive; see Session. */
  async session(options: SessionOptions = {}): Promise<Session> {
    const s = await Session.create(this, options);
    this.#sessions.add(s);
    s.signal.addEventListener("abort", () => this.#sessions.delete(s), { once: true });
    return s;
  }

  /**
   * Closes every session of the client that still lives, releasing what
   * they hold, as Session.close does each. The client can still be used
   * afterwards; a program that closes its sessions need not call this.
   */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#sessions].map((s) => s.close()));
  }

  /**
   * Takes the lock `name` in one call, for a program that cannot keep a
   * session alive; fails at once with LockedError when it is held. See Lease.
   */
  lease(name: string, options: LeaseOptions): Promise<Lease> {
    return takeLease(this, name, options);
  }

  /** The API addresses the client knows: the configured ones first, then leaders it was pointed to. */
  get endpoints(): string[] {
    return this.#endpoints.map((ep) => ep.url);
  }

  /** Describes the node at the first endpoint that answers. */
  status(options: { signal?: AbortSignal } = {}): Promise<StatusResponse> {
    return this.unary((ep, signal) => ep.cluster.status({}, { signal }), options.signal);
  }

  /**
   * Lists the locks whose names start with prefix, in name order, with
   * their holders and waiters; linearizable unless stale.
   */
  async locks(prefix: string, options: { stale?: boolean; signal?: AbortSignal } = {}): Promise<LockInfo[]> {
    const out: LockInfo[] = [];
    let pageToken = "";
    do {
      const page = await this.call(
        (ep, signal) => ep.locks.listLocks({ prefix, stale: options.stale ?? false, pageToken }, { signal }),
        options.signal,
      );
      out.push(...page.locks);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /**
   * Asks whether token is the lock's current grant (linearizable): the
   * strongest fence, for a resource that can reach the service.
   */
  async check(lock: string, token: bigint, options: { signal?: AbortSignal } = {}): Promise<{ current: boolean; held: boolean; currentToken: bigint }> {
    const r = await this.unary((ep, signal) => ep.locks.check({ lock, token }, { signal }), options.signal);
    return { current: r.current, held: r.held, currentToken: r.currentToken };
  }

  /**
   * Closes the session id, whoever holds it, as if it had expired: its
   * locks are released (each after the lock-delay its holder asked for) and
   * its bound keys deleted. Revoking a session that does not exist
   * succeeds. The session's own client learns of it at its next keepalive
   * (its signal aborts with SessionNotFoundError).
   */
  async revokeSession(id: bigint, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.unary((ep, signal) => ep.cluster.revokeSession({ sessionId: id }, { signal }), options.signal);
  }

  /** The leader of the election name, as observeLeader reports it. */
  async leader(name: string, options: { signal?: AbortSignal } = {}): Promise<LeaderState> {
    return leaderOf(this, name, options.signal);
  }

  /**
   * Reports the leader of the election name as it changes: first the
   * current state, then each new leader, each proclaim and each loss of
   * leadership. The iteration ends when signal aborts (or the loop breaks).
   */
  observeLeader(name: string, options: { signal?: AbortSignal } = {}): AsyncIterable<LeaderState> {
    return observeLeader(this, name, options.signal);
  }

  /**
   * Runs fn against the node that answered last and, while it fails with
   * UnavailableError, follows the leader the error names or moves on to the
   * next node, backing off once all were tried, within the retry budget
   * (counted from the first failure of the streak). fn must be safe to
   * repeat. A client that never reached its group gives up after the dial
   * timeout with UnreachableError.
   * @internal
   */
  async call<T>(fn: Attempt<T>, signal?: AbortSignal): Promise<T> {
    const start = monotonicNow();
    let failingSince: number | undefined;
    let backoff = 20;
    let i = this.#current;
    let tried = 0, hints = 0, refused = 0, attempts = 0;
    let reached = this.#answered;
    let heard = false;
    let foreign: unknown;
    const giveUp = (err: unknown, raw: unknown): unknown => {
      if (!heard && unanswered(raw)) {
        err = this.#unreachable(monotonicNow() - start, raw);
      }
      return foreign === undefined ? err : new UnavailableError(`${String(err)}; and ${String(foreign)}`, { cause: err });
    };
    for (;;) {
      i = this.#skipSilent(i);
      const ep = this.#endpointAt(i);
      let raw: unknown;
      try {
        const out = await fn(ep, signal);
        ep.silentUntil = 0;
        this.#current = this.#endpoints.indexOf(ep);
        this.#answered = true;
        return out;
      } catch (e) {
        raw = e;
      }
      signal?.throwIfAborted();
      attempts++;
      if (!unanswered(raw)) {
        reached = heard = true;
      }
      if (!reached && this.dialTimeoutMs > 0 && attempts >= this.#endpoints.length && monotonicNow() - start >= this.dialTimeoutMs) {
        throw giveUp(fromConnect(raw), raw);
      }
      const err = fromConnect(raw);
      if (err instanceof WrongClusterError) {
        ep.foreign = true;
        if (this.#endpoints.every((e) => e.foreign)) {
          throw err;
        }
        foreign = err;
        i++;
        continue;
      }
      if (err instanceof UnauthenticatedError) {
        // This node refused the TLS handshake (or we its certificate), or
        // the credential: another may not. Give up once every node has.
        if (++refused < this.#endpoints.length) {
          i++;
          continue;
        }
        throw err;
      }
      if (!(err instanceof UnavailableError)) {
        throw err;
      }
      const now = monotonicNow();
      failingSince ??= now;
      if (err.leaderAddress !== "" && hints < 3) {
        hints++;
        const j = this.#endpointFor(err.leaderAddress);
        if (j !== i % this.#endpoints.length) {
          this.#endpointAt(j).silentUntil = 0; // it leads, and its followers hear from it
          i = j;
          continue;
        }
      }
      i++;
      if (++tried < this.#endpoints.length) {
        continue; // try the other endpoints before backing off
      }
      if (now - failingSince + backoff > this.retryBudgetMs) {
        throw giveUp(err, raw);
      }
      try {
        await sleep(backoff, signal);
      } catch {
        signal?.throwIfAborted();
      }
      tried = hints = 0;
      heard = false;
      backoff = Math.min(2 * backoff, 250);
    }
  }

  /** call for calls answered at once: each attempt on a node gets the attempt timeout. @internal */
  unary<T>(fn: Attempt<T>, signal?: AbortSignal): Promise<T> {
    return this.call((ep, s) => this.withAttemptDeadline(ep, this.attemptTimeoutMs, s, (a) => fn(ep, a)), signal);
  }

  /**
   * Runs one attempt of a call on ep, giving up on it after ms: a node
   * that accepts the connection but does not answer (paused, a stuck disk)
   * fails the attempt as unavailable, so that call moves on to the next.
   * @internal
   */
  async withAttemptDeadline<T>(ep: Endpoint, ms: number, signal: AbortSignal | undefined, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const attempt = abortable(signal);
    let expired: NoAnswerError | undefined; // made only when needed: an error's stack costs a call's worth of CPU
    const timer = setTimeout(() => attempt.abort((expired = new NoAnswerError(`${ep.url} did not answer within ${ms} ms`))), ms);
    try {
      return await fn(attempt.signal);
    } catch (err) {
      if (expired && attempt.signal.reason === expired && !signal?.aborted) {
        ep.silentUntil = Date.now() + silentForMs;
        throw expired;
      }
      throw err;
    } finally {
      clearTimeout(timer);
      attempt.dispose();
    }
  }

  /** Calls fn on every node the client knows, at once, for what can go anywhere (abandoning a session). @internal */
  async everyNode(fn: (ep: Endpoint) => Promise<void>): Promise<void> {
    await Promise.allSettled(this.#endpoints.filter((ep) => !ep.foreign).map(fn));
  }

  /** The index of the endpoint at addr, added when the client did not know it. @internal */
  endpointFor(addr: string): Endpoint {
    return this.#endpointAt(this.#endpointFor(addr));
  }

  #endpointFor(addr: string): number {
    const url = this.#url(addr);
    const i = this.#endpoints.findIndex((ep) => ep.url === url);
    if (i >= 0) {
      return i;
    }
    this.#endpoints.push(this.#newEndpoint(url));
    return this.#endpoints.length - 1;
  }

  #endpointAt(i: number): Endpoint {
    return this.#endpoints[i % this.#endpoints.length]!;
  }

  /** The first index from i on whose node has not lately failed to answer in time; i if every node has. */
  #skipSilent(i: number): number {
    for (let k = 0; k < this.#endpoints.length; k++) {
      if (!this.#endpointAt(i + k).silent()) {
        return i + k;
      }
    }
    return i;
  }

  #url(raw: string): string {
    raw = raw.trim();
    if (raw.includes("://")) {
      return raw.replace(/\/+$/, "");
    }
    if (!/^(\[[^\]]+\]|[^:]+):\d+$/.test(raw)) {
      throw new TypeError(`fence: endpoint ${JSON.stringify(raw)}: want host:port or a URL`);
    }
    return (this.#tls ? "https://" : "http://") + raw;
  }

  #newEndpoint(url: string): Endpoint {
    // HTTP/1.1, as the Go client's default: it costs less per call than
    // HTTP/2 on a local network. A blocked acquire holds a connection.
    const tls = this.#tls;
    const transport = createConnectTransport({
      baseUrl: url,
      httpVersion: "1.1",
      useBinaryFormat: true,
      interceptors: this.#interceptors,
      nodeOptions: tls ? { ca: tls.ca, cert: tls.cert, key: tls.key } : {},
    });
    return new Endpoint(url, transport);
  }

  /**
   * The headers of every call: follow the leader ourselves (a follower
   * answers its address rather than forward), the bearer token, and the
   * group's id once known, so that a node of another group refuses the
   * call rather than act on it.
   */
  #headers(token: string | undefined): Interceptor {
    return (next) => async (req) => {
      req.header.set(followLeaderHeader, "1");
      if (token) {
        req.header.set("Authorization", `Bearer ${token}`);
      }
      if (this.#clusterID !== "") {
        req.header.set(clusterIDHeader, this.#clusterID);
      }
      const res = await next(req);
      this.#learnCluster(res.header.get(clusterIDHeader) ?? "", req.url);
      return res;
    };
  }

  #learnCluster(id: string, url: string): void {
    if (id === "" || id === this.#clusterID) {
      return;
    }
    if (this.#clusterID !== "") {
      throw new WrongClusterError(`fence: ${url} is a node of group ${id}, not of ${this.#clusterID}`);
    }
    this.#clusterID = id;
  }

  #unreachable(ms: number, last: unknown): UnreachableError {
    return new UnreachableError(
      `fence: no node could be reached: tried ${this.endpoints.join(", ")} for ${Math.round(ms)} ms (${String(fromConnect(last))}); is a node running? Start one with \`fence serve\`, or check the endpoints`,
      { cause: last },
    );
  }
}

/** Reports whether err is an attempt that no node answered: its connection failed, or nothing came back in time. */
function unanswered(err: unknown): boolean {
  return err instanceof NoAnswerError || connectionFailed(err);
}
