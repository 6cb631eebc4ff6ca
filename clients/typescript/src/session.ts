import type { Client, Endpoint } from "./client.js";
import {
  InvalidArgumentError,
  ReleasedError,
  RevokedError,
  SessionLostError,
  SessionNotFoundError,
  UnavailableError,
  fromConnect,
} from "./errors.js";
import type { HeldGrants } from "./gen/fence/v1/fence_pb.js";
import { Election } from "./election.js";
import { type Grant, type LockOptions, Mutex, RWMutex, Semaphore } from "./mutex.js";
import { type Abortable, type ClockTimer, abortable, fromDuration, toDuration } from "./time.js";

/** The options of a session; every one has a default. */
export interface SessionOptions {
  /** Time to live without a keepalive (default 10 000 ms; the server allows 1 s to 1 h). */
  ttlMs?: number;
  /** A label shown in listings, such as "worker-3 pid 4121". */
  owner?: string;
  /** The bound on clock drift between client and leader (default 0.01, 1%). */
  drift?: number;
  /** The safety margin taken off safe-until (default 100 ms). */
  marginMs?: number;
  signal?: AbortSignal;
}

/** What a session needs to know of a live grant: when it was received, and how to end it. @internal */
export interface TrackedGrant {
  readonly token: bigint;
  readonly signal: AbortSignal;
  end(reason: unknown): void;
}

/**
 * A Session is a client's lease on the service: every lock taken through
 * it is released when it is closed or expires. It renews itself in the
 * background every third of its TTL. Each renewal that succeeds makes it
 * safe until sent + TTL×(1−drift) − margin, counted on this process's
 * monotonic clock (performance.now()) from before the renewal was sent;
 * when that instant passes without a renewal, or the service says the
 * session is gone, the session ends: `signal` aborts with the reason
 * (SessionLostError, SessionNotFoundError, ReleasedError after close), and
 * every lock taken through it must be presumed lost. A renewal sent at or
 * after safe-until extends nothing, whatever its answer: by then the
 * service may have expired the session and granted its locks to others
 * while this process, paused, believed it held them. A session that ended
 * stays ended; create another.
 *
 * This narrows the window in which a paused holder believes it holds a
 * lock the service gave away; it does not close it. Fencing tokens do.
 *
 * A live session keeps the process running (its keepalive timer) until it
 * is closed or ends. Create one with Client.session.
 */
export class Session implements AsyncDisposable {
  readonly client: Client;
  /** The session's id on the service; public (listings show it). */
  readonly id: bigint;
  /** The TTL the service granted. */
  readonly ttlMs: number;

  /** The secret that acting as the session takes; answered to this client alone. */
  readonly #secret: string;
  readonly #drift: number;
  readonly #marginMs: number;
  readonly #intervalMs: number;
  readonly #ended = new AbortController();
  /** Ends a renewal in flight when the session is closed or ends. */
  readonly #stopRenew: Abortable = abortable(this.#ended.signal);
  #safeUntil: number;
  #due: number;
  #lapsed = false;
  #stopped = false;
  #closing = false;
  #renewing = false;
  #renewals = 0;
  #requests = 0n;
  readonly #grants = new Map<TrackedGrant, number>();
  #dueTimer: ClockTimer | undefined;
  #lostTimer: ClockTimer | undefined;

  private constructor(client: Client, id: bigint, secret: string, ttlMs: number, drift: number, marginMs: number, sent: number) {
    this.client = client;
    this.id = id;
    this.#secret = secret;
    this.ttlMs = ttlMs;
    this.#drift = drift;
    this.#marginMs = marginMs;
    this.#intervalMs = ttlMs / 3;
    this.#due = sent + this.#intervalMs;
    this.#safeUntil = this.#deadlineFrom(sent);
    this.#rearm();
  }

  /** Creates a session on the service and starts keeping it alive. Use Client.session. @internal */
  static async create(client: Client, options: SessionOptions): Promise<Session> {
    const drift = options.drift ?? 0.01;
    const marginMs = options.marginMs ?? 100;
    if (!(drift >= 0 && drift < 1) || !(marginMs >= 0)) {
      throw new InvalidArgumentError("fence: drift must be in [0, 1) and margin not negative");
    }
    const req = { ttl: toDuration(options.ttlMs ?? 10_000), owner: options.owner ?? "" };
    let sent = 0;
    // No idempotency key: the service answers a session's secret once, so
    // a retry creates a session of its own, and one whose answer was lost
    // expires after its TTL.
    const resp = await client.unary((ep, signal) => {
      sent = client.clock.now();
      return ep.sessions.createSession(req, { signal });
    }, options.signal);
    return new Session(client, resp.sessionId, resp.sessionSecret, fromDuration(resp.ttl), drift, marginMs, sent);
  }

  /** Aborts when the session ends: closed, lost or expired; its reason says which. */
  get signal(): AbortSignal {
    return this.#ended.signal;
  }

  /** Until when, on performance.now()'s clock (the client's clock), the session is known to be alive. */
  get safeUntil(): number {
    return this.#safeUntil;
  }

  /** Takes the lock `name` exclusively, waiting for it; see Mutex.lock. */
  lock(name: string, options: LockOptions = {}): Promise<Grant> {
    return new Mutex(this, name, options).lock(options);
  }

  /** A mutex on the lock `name`, held through this session. */
  mutex(name: string, options: LockOptions = {}): Mutex {
    return new Mutex(this, name, options);
  }

  /** A read-write mutex on the lock `name`, held through this session. */
  rwMutex(name: string, options: LockOptions = {}): RWMutex {
    return new RWMutex(this, name, options);
  }

  /** A semaphore of `permits` on the lock `name`, held through this session. */
  semaphore(name: string, permits: number, options: LockOptions = {}): Semaphore {
    return new Semaphore(this, name, permits, options);
  }

  /** An election on `name`, campaigned through this session. */
  election(name: string): Election {
    return new Election(this, name);
  }

  /**
   * Ends the session and releases everything it holds. After a failed
   * close the session still ends here, and expires on the service after
   * its TTL. Calls after the first do nothing.
   */
  async close(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.#closing) {
      return;
    }
    this.#closing = true;
    this.#stopRenew.abort(new ReleasedError("fence: session closed"));
    this.#stopKeepAlive();
    if (this.#ended.signal.aborted) {
      return; // lost or ended already: the service has expired it, or been asked to abandon it
    }
    this.#end(new ReleasedError(`fence: session ${this.id} closed`));
    await this.client.unary((ep, signal) => ep.sessions.closeSession({ sessionId: this.id, sessionSecret: this.#secret }, { signal }), options.signal);
  }

  /** Closes the session: `await using s = await c.session()`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /** The secret, for the calls that act as the session (locks, bound keys). @internal */
  get secret(): string {
    return this.#secret;
  }

  /** Numbers the session's acquires (their request ids). @internal */
  nextRequestId(): bigint {
    return ++this.#requests;
  }

  /** Counts g among the live grants, from now: a keepalive sent after this that does not list it means it was revoked. @internal */
  track(g: TrackedGrant): void {
    this.#grants.set(g, this.#renewals);
  }

  /** Forgets a grant that ended. @internal */
  untrack(g: TrackedGrant): void {
    this.#grants.delete(g);
  }

  /**
   * The releases of each lock name on their way: the service's grant is the
   * session's, whichever Mutex took it, so an acquire of the name waits for
   * them (waitReleased) rather than be handed the grant being released.
   */
  readonly #releases = new Map<string, { n: number; done: Promise<void>; resolve: () => void }>();

  /** Records a release of the lock name on its way, until the function it returns is called. @internal */
  beginRelease(name: string): () => void {
    let p = this.#releases.get(name);
    if (!p) {
      let resolve!: () => void;
      const done = new Promise<void>((r) => (resolve = r));
      p = { n: 0, done, resolve };
      this.#releases.set(name, p);
    }
    const pending = p;
    pending.n++;
    let ended = false;
    return () => {
      if (ended) {
        return;
      }
      ended = true;
      if (--pending.n === 0) {
        this.#releases.delete(name);
        pending.resolve();
      }
    };
  }

  /** Waits until no release of the lock name is on its way. @internal */
  async waitReleased(name: string, signal?: AbortSignal): Promise<void> {
    const p = this.#releases.get(name);
    if (!p) {
      return;
    }
    const stop = signal ? AbortSignal.any([signal, this.signal]) : this.signal;
    stop.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(stop.reason);
      stop.addEventListener("abort", onAbort, { once: true });
      void p.done.then(() => {
        stop.removeEventListener("abort", onAbort);
        resolve();
      });
    });
  }

  /**
   * Throws unless the session lives and its safe-until has not passed. A
   * safe-until that passed unnoticed (the process was paused, and the
   * session's timers have not run since) ends the session as lost here, as
   * its timer would have.
   * @internal
   */
  checkSafe(): void {
    this.signal.throwIfAborted();
    if (this.#lapse(this.client.clock.now())) {
      void this.lose(new SessionLostError(`fence: session ${this.id} passed its safe-until unrenewed (the process was paused); its locks may be held by others`));
    }
    this.signal.throwIfAborted();
  }

  /** A signal for giving back what a failed operation took: bounded by the TTL and the session's life. @internal */
  undoSignal(): AbortSignal {
    return AbortSignal.any([this.signal, AbortSignal.timeout(this.ttlMs)]);
  }

  /**
   * Ends the session, unless it ended already, because what could not be
   * given back (err says why) would otherwise stay held for as long as it
   * lives: the session is lost, so that the service releases it all.
   * @internal
   */
  giveUp(what: string, err: unknown): void {
    if (this.signal.aborted) {
      return;
    }
    if (err instanceof SessionNotFoundError) {
      this.#end(err);
      return;
    }
    void this.lose(new SessionLostError(`fence: could not give up ${what} (${String(err)}), so the session is given up instead`, { cause: err }));
  }

  /**
   * Ends a session that may have expired on the service, then abandons it
   * there, best effort, so that the locks it held are released now rather
   * than at expiry (each after the lock-delay its holder asked for). The
   * call goes to every node the client knows at once, for a second.
   * @internal
   */
  async lose(cause: SessionLostError): Promise<void> {
    this.#end(cause);
    const signal = AbortSignal.timeout(1_000);
    await this.client.everyNode((ep) => this.#abandonAt(ep, signal));
  }

  async #abandonAt(ep: Endpoint, signal: AbortSignal): Promise<void> {
    const req = { sessionId: this.id, sessionSecret: this.#secret, abandon: true };
    try {
      await ep.sessions.closeSession(req, { signal });
    } catch (err) {
      const e = fromConnect(err);
      if (e instanceof UnavailableError && e.leaderAddress !== "") {
        await this.client.endpointFor(e.leaderAddress).sessions.closeSession(req, { signal }).catch(() => {});
      }
    }
  }

  #end(reason: unknown): void {
    this.#stopKeepAlive();
    this.#ended.abort(reason);
  }

  #deadlineFrom(sent: number): number {
    return sent + this.ttlMs * (1 - this.#drift) - this.#marginMs;
  }

  /** Reports whether safe-until is not after now, and then marks the session lapsed: no renewal answered later extends it. */
  #lapse(now: number): boolean {
    if (now < this.#safeUntil) {
      return false;
    }
    this.#lapsed = true;
    return true;
  }

  /** Sets the timers to the schedule: the next renewal at due, the end at safe-until. */
  #rearm(): void {
    if (this.#stopped) {
      return;
    }
    this.#dueTimer?.clear();
    this.#lostTimer?.clear();
    const clock = this.client.clock;
    const now = clock.now();
    this.#dueTimer = clock.setTimer(() => void this.#onDue(), Math.max(0, this.#due - now));
    this.#lostTimer = clock.setTimer(() => this.#onLost(), Math.max(0, this.#safeUntil - now));
  }

  #stopKeepAlive(): void {
    this.#stopped = true;
    this.#dueTimer?.clear();
    this.#lostTimer?.clear();
  }

  /** Renews the session, every third of its TTL; a failed renewal is retried sooner. */
  async #onDue(): Promise<void> {
    if (this.#stopped || this.#renewing) {
      return;
    }
    const now = this.client.clock.now();
    if (this.#due > now) {
      this.#rearm();
      return;
    }
    // A process that was paused must not renew a session whose safe-until
    // passed while it slept.
    if (this.#lapse(now)) {
      void this.lose(new SessionLostError(`fence: session ${this.id} was not renewed before its safe-until`));
      return;
    }
    this.#renewing = true;
    try {
      await this.#renew();
    } catch (err) {
      if (err instanceof SessionNotFoundError) {
        this.#end(err);
        return;
      }
      this.#due = this.client.clock.now() + Math.min(this.#intervalMs, 250);
    } finally {
      this.#renewing = false;
    }
    this.#rearm();
  }

  /** Ends the session when its safe-until passed without a renewal (one in flight included). */
  #onLost(): void {
    if (this.#stopped) {
      return;
    }
    if (!this.#lapse(this.client.clock.now())) {
      this.#rearm(); // renewed as this fired
      return;
    }
    void this.lose(new SessionLostError(`fence: no renewal of session ${this.id} reached the service in time; its locks may be held by others`));
  }

  /**
   * Sends one keepalive. The call may not outlive the session's
   * safe-until, and an attempt on one node may not outlive a quarter of the
   * TTL, so that the other nodes are tried well before.
   */
  async #renew(): Promise<void> {
    const call = abortable(this.#stopRenew.signal);
    const clock = this.client.clock;
    const timer = clock.setTimer(() => call.abort(new SessionLostError("fence: keepalive unanswered at safe-until")), Math.max(0, this.#safeUntil - clock.now()));
    const round = ++this.#renewals;
    let sent = 0;
    try {
      const resp = await this.client.call((ep, signal) => {
        sent = clock.now();
        return this.client.withAttemptDeadline(ep, this.ttlMs / 4, signal, (s) =>
          ep.sessions.keepAlive({ sessionId: this.id, sessionSecret: this.#secret }, { signal: s }),
        );
      }, call.signal);
      this.#renewed(sent, round, resp.held);
    } finally {
      timer.clear();
      call.dispose();
    }
  }

  /**
   * Takes in a keepalive's success: the keepalive number round, sent at
   * sent. One sent at or after safe-until renews nothing; nor does an
   * answer that comes after the session ended.
   */
  #renewed(sent: number, round: number, held: HeldGrants | undefined): void {
    if (sent >= this.#safeUntil || this.#lapsed || this.signal.aborted) {
      return;
    }
    this.#safeUntil = Math.max(this.#safeUntil, this.#deadlineFrom(sent));
    this.#due = Math.max(this.#due, sent + this.#intervalMs);
    if (held) {
      this.#checkHeld(round, held.tokens);
    }
  }

  /**
   * Ends the grants that someone else released: those received before
   * keepalive number round was sent whose tokens the answer no longer lists.
   */
  #checkHeld(round: number, held: bigint[]): void {
    const tokens = new Set(held);
    for (const [g, since] of this.#grants) {
      if (since < round && !g.signal.aborted && !tokens.has(g.token)) {
        this.#grants.delete(g);
        g.end(new RevokedError(`fence: the session no longer holds the grant of token ${g.token}: someone else released it`));
      }
    }
  }
}

