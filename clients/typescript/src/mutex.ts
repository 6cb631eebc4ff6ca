import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  AuthFailedError,
  CancelledError,
  InvalidArgumentError,
  LimitError,
  LockedError,
  NotHolderError,
  PermissionDeniedError,
  ReleasedError,
  SessionNotFoundError,
  WaitTimeoutError,
  fromConnect,
} from "./errors.js";
import { type AcquireRequestSchema, type AcquireResponse, Mode } from "./gen/fence/v1/fence_pb.js";
import type { Session } from "./session.js";
import { type Abortable, abortable, monotonicNow, toDuration } from "./time.js";

/** How a lock is taken; every option has a default. */
export interface LockOptions {
  /**
   * If this grant ends otherwise than by its holder's release or close (the
   * session expires, an operator revokes it, the client gives it up), the
   * lock goes to nobody else until this has passed, so that writes of the
   * lost holder still in flight can drain. At most 60 000 ms.
   */
  lockDelayMs?: number;
  /** Give up waiting after this long, with WaitTimeoutError. Unset: wait until the signal aborts. */
  waitTimeoutMs?: number;
  /** Aborting gives up the wait, and leaves nothing held or queued. */
  signal?: AbortSignal;
}

/**
 * A held lock: its name, its fencing token, and a signal that aborts when
 * the lock may be lost. Send the token with every write to a fenced
 * resource, and pass the signal to the work done under the lock
 * (`fetch(url, { signal: grant.signal })`), so that it stops by itself.
 *
 * The signal aborts, with a reason that says why, when the grant is
 * released (ReleasedError), when someone else released it (RevokedError,
 * learned within a third of the TTL), or when its session ends
 * (SessionLostError at the session's safe-until, SessionNotFoundError,
 * ReleasedError after close). Release with `release()`, `await using`, or
 * in a `finally`.
 */
export class Grant implements AsyncDisposable {
  readonly #ended: Abortable;
  readonly #session: Session;

  /** Made by a Mutex; releaser releases the grant on the service. @internal */
  constructor(
    /** The lock's name. */
    readonly lock: string,
    /** The grant's fencing token: tokens strictly increase across all grants of the service. */
    readonly token: bigint,
    session: Session,
    private readonly releaser: (g: Grant, signal?: AbortSignal) => Promise<void>,
  ) {
    this.#session = session;
    this.#ended = abortable(session.signal);
    session.track(this);
  }

  /** Aborts when the grant ends; its reason says why. */
  get signal(): AbortSignal {
    return this.#ended.signal;
  }

  /**
   * Whether the grant may be lost: it ended, or its session's safe-until
   * has passed. It is read from the clock when asked, so a process that was
   * paused (and whose timers have not run since it woke) learns it before
   * it writes; the signal then aborts at once. Ask it before each write.
   */
  get lost(): boolean {
    if (!this.signal.aborted) {
      try {
        this.#session.checkSafe();
      } catch {
        // the session ended: the signal has aborted with its reason
      }
    }
    return this.signal.aborted;
  }

  /**
   * Releases the lock. The signal aborts first, so work under it stops before the lock is handed on;
   * a caller's signal that aborts only because of it (this signal, or one that follows it) does not cut the release short.
   * Such a signal is then no bound at all: an AbortSignal cannot say what else it follows, so one made with
   * `AbortSignal.any([grant.signal, AbortSignal.timeout(ms)])` loses its timeout. To bound the release, pass
   * a signal that does not follow the grant's (`AbortSignal.timeout(ms)`).
   */
  release(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.releaser(this, options.signal);
  }

  /** Releases the lock unless it ended already: `await using g = await s.lock("orders")`. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.signal.aborted) {
      await this.release();
    }
  }

  /** Ends the grant here, with reason; the session calls it for a revoked grant. @internal */
  end(reason: unknown): void {
    this.#ended.dispose();
    this.#ended.abort(reason);
  }
}

/**
 * An exclusive lock held through a session. Waiters are granted in FIFO
 * order. A Mutex is one holder: to contend for a lock, use one session per
 * contender.
 */
export class Mutex {
  #grant: Grant | undefined;
  readonly #lockDelayMs: number;
  readonly #waitTimeoutMs: number;

  constructor(
    readonly session: Session,
    /** The lock's name. */
    readonly name: string,
    options: LockOptions = {},
    readonly mode: Mode = Mode.EXCLUSIVE,
    readonly permits = 0,
  ) {
    this.#lockDelayMs = options.lockDelayMs ?? 0;
    this.#waitTimeoutMs = options.waitTimeoutMs ?? 0;
  }

  /** The current grant, or undefined when the mutex is not held. */
  get grant(): Grant | undefined {
    return this.#grant;
  }

  /**
   * Waits until the lock is granted and returns the grant. It fails when
   * the signal aborts (with its reason), the wait timeout passes
   * (WaitTimeoutError) or the session ends (with the session's reason). A
   * failed, timed-out or aborted acquire gives up its request on the
   * service (CancelAcquire), so it leaves nothing held or queued; a grant
   * whose answer arrives as the signal aborts is given up too. A grant is
   * returned only while the session's safe-until has not passed. Locking a
   * mutex already held returns the same grant.
   */
  lock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#acquire(false, options.signal);
  }

  /** Takes the lock if it is free and nobody waits for it; fails with LockedError otherwise, without waiting. */
  tryLock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#acquire(true, options.signal);
  }

  /** Releases the lock; see Grant.release. Fails with NotHolderError when the mutex is not held. */
  async unlock(options: { signal?: AbortSignal } = {}): Promise<void> {
    const g = this.#grant;
    if (!g) {
      throw new NotHolderError(`fence: ${this.#kind()} ${JSON.stringify(this.name)} is not held`);
    }
    await this.#release(g, options.signal);
  }

  /**
   * Releases g. If no node can be told before signal aborts or the client's
   * retry budget is spent, the error is thrown, and the release is not left
   * undone for as long as the session lives: one the caller stopped waiting
   * for goes on within the session's TTL, and when the service still cannot
   * be told the session is given up, so that its end releases the lock.
   * A refusal that a retry would not pass (PermissionDeniedError, say)
   * gives the session up too, and with it every lock it holds. Meanwhile
   * an acquire of the name through the session waits for the release.
   */
  async #release(g: Grant, signal?: AbortSignal): Promise<void> {
    if (this.#grant === g) {
      this.#grant = undefined;
    }
    const gaveUp = signal?.aborted;
    g.end(new ReleasedError(`fence: ${this.#kind()} ${JSON.stringify(this.name)} released`));
    if (signal?.aborted && !gaveUp) {
      // The grant's own signal, or one that follows it, aborted because the
      // release ended the grant: that is not the caller giving up.
      signal = undefined;
    }
    const s = this.session;
    s.untrack(g);
    const end = s.beginRelease(this.name);
    let sent = false; // an attempt may have reached a node, and released it
    const req = { sessionId: s.id, sessionSecret: s.secret, lock: this.name, token: g.token };
    const send = (sig?: AbortSignal) =>
      s.client.unary(async (ep, attemptSignal) => {
        try {
          await ep.locks.release(req, { signal: attemptSignal });
        } catch (err) {
          if (sent && fromConnect(err) instanceof NotHolderError) {
            return; // an earlier attempt, whose answer was lost, released it
          }
          sent = true;
          throw err;
        }
      }, sig);
    try {
      await send(signal);
      end();
    } catch (err) {
      if (err instanceof NotHolderError || err instanceof SessionNotFoundError || s.signal.aborted) {
        end(); // nothing is held
        throw err;
      }
      const giveUp = (why: unknown) => {
        if (!(why instanceof SessionNotFoundError)) {
          s.giveUp(`the release of ${JSON.stringify(this.name)}`, why);
        }
      };
      if (!signal?.aborted) {
        giveUp(err); // the retry budget is spent: another try would spend it again
        end();
        throw err;
      }
      void send(s.undoSignal()) // the caller stopped waiting: it goes on within the TTL
        .catch(giveUp)
        .finally(end);
      throw err;
    }
  }

  async #acquire(tryOnly: boolean, caller: AbortSignal | undefined): Promise<Grant> {
    const s = this.session;
    s.checkSafe();
    caller?.throwIfAborted();
    if (this.#grant && !this.#grant.signal.aborted) {
      return this.#grant;
    }
    await s.waitReleased(this.name, caller);
    const req: MessageInitShape<typeof AcquireRequestSchema> = {
      sessionId: s.id,
      sessionSecret: s.secret,
      lock: this.name,
      try: tryOnly,
      mode: this.mode,
      permits: this.permits,
      requestId: s.nextRequestId(),
    };
    if (this.#lockDelayMs > 0) {
      req.lockDelay = toDuration(this.#lockDelayMs);
    }
    // The wait is given up as soon as the session ends.
    const wait = abortable(caller, s.signal);
    let attempts = 0;
    let resp: AcquireResponse;
    try {
      resp = await this.#wait(req, wait.signal, () => attempts++);
    } catch (err) {
      if (!leftNothing(err, attempts)) {
        await this.#abandon(req.requestId!);
      }
      s.signal.throwIfAborted();
      caller?.throwIfAborted();
      throw err;
    } finally {
      wait.dispose();
    }
    // A grant whose answer came as the caller gave up is given up, not
    // returned: the caller would not release it.
    if (caller?.aborted) {
      await this.#abandon(req.requestId!);
      caller.throwIfAborted();
    }
    // A grant answered after the session's safe-until (the process was
    // paused meanwhile) is no grant: losing the session gives it up.
    s.checkSafe();
    if (this.#grant?.token === resp.token && !this.#grant.signal.aborted) {
      return this.#grant;
    }
    this.#grant = new Grant(this.name, resp.token, s, (g, signal) => this.#release(g, signal));
    return this.#grant;
  }

  /**
   * Calls Acquire until it answers a grant. Each attempt is bounded, so
   * that a node that stops answering is left for the next: a wait answers
   * "still waiting" after a poll and is taken up again where it stands.
   */
  async #wait(req: MessageInitShape<typeof AcquireRequestSchema>, signal: AbortSignal, counted: () => void): Promise<AcquireResponse> {
    const client = this.session.client;
    const attempt = client.attemptTimeoutMs;
    let limit = attempt;
    let poll = attempt / 2; // short first, so that a lock free at once moves on from a hung node as quickly as any call
    const waitUntil = this.#waitTimeoutMs > 0 ? monotonicNow() + this.#waitTimeoutMs : 0;
    return client.call(async (ep, sig) => {
      // After a failed attempt the next one takes the request over rather
      // than resume a wait that attempt may have changed.
      req.resumeAttempt = 0n;
      for (;;) {
        counted();
        if (!req.try) {
          req.poll = toDuration(poll);
        }
        if (waitUntil > 0) {
          req.waitTimeout = toDuration(Math.max(1, waitUntil - monotonicNow()));
        }
        const r = await client.withAttemptDeadline(ep, limit, sig, (s) => ep.locks.acquire(req, { signal: s }));
        if (!r.waiting) {
          return r;
        }
        req.resumeAttempt = r.attempt;
        poll = attempt;
        limit = attempt + attempt / 2;
      }
    }, signal);
  }

  /**
   * Gives up the acquire requestId after it failed, so that it leaves
   * nothing held or queued, and no retry of it still on its way can take
   * the lock later. If the service cannot be told within the session's
   * TTL, the session itself is given up: its end releases everything.
   */
  async #abandon(requestId: bigint): Promise<void> {
    const s = this.session;
    if (s.signal.aborted) {
      return; // the session's end releases everything
    }
    const req = { sessionId: s.id, sessionSecret: s.secret, lock: this.name, requestId };
    try {
      await s.client.unary((ep, signal) => ep.locks.cancelAcquire(req, { signal }), s.undoSignal());
    } catch (err) {
      s.giveUp(`a failed acquire of ${JSON.stringify(this.name)}`, fromConnect(err));
    }
  }

  #kind(): string {
    switch (this.mode) {
      case Mode.SHARED:
        return "read lock";
      case Mode.SEMAPHORE:
        return "semaphore";
    }
    return "mutex";
  }
}

/**
 * Reports whether a failed acquire certainly left nothing held or queued:
 * its only attempt was refused. Any other failure (aborted, an answer
 * lost, a retry) may have left a wait or a grant nobody would learn of.
 */
function leftNothing(err: unknown, attempts: number): boolean {
  if (attempts !== 1) {
    return false;
  }
  return [InvalidArgumentError, LockedError, LimitError, SessionNotFoundError, WaitTimeoutError, CancelledError, PermissionDeniedError, AuthFailedError].some(
    (cls) => err instanceof cls,
  );
}

/**
 * A lock held either by one writer (lock) or by any number of readers
 * (rLock). Waiters are granted in FIFO order: a waiting writer holds back
 * readers that come after it. Each grant, shared ones included, has its
 * own fencing token. One session holds the lock in one mode at a time.
 */
export class RWMutex {
  readonly #w: Mutex;
  readonly #r: Mutex;

  constructor(session: Session, name: string, options: LockOptions = {}) {
    this.#w = new Mutex(session, name, options);
    this.#r = new Mutex(session, name, options, Mode.SHARED);
  }

  /** Waits for the lock in exclusive mode; see Mutex.lock. */
  lock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#w.lock(options);
  }

  /** Takes the lock in exclusive mode without waiting, or fails with LockedError. */
  tryLock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#w.tryLock(options);
  }

  /** Releases an exclusive grant. */
  unlock(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#w.unlock(options);
  }

  /** Waits for the lock in shared mode. */
  rLock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#r.lock(options);
  }

  /** Takes the lock in shared mode without waiting, or fails with LockedError. */
  tryRLock(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#r.tryLock(options);
  }

  /** Releases a shared grant. */
  rUnlock(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#r.unlock(options);
  }
}

/**
 * A Semaphore admits up to `permits` holders at once, each through its own
 * session, one permit each; waiters are granted in FIFO order as permits
 * free up. Every holder and waiter must name the same number of permits.
 * Each permit has a fencing token of its own: since permit holders run at
 * the same time, fence each holder's own keys, not one key for them all.
 */
export class Semaphore {
  readonly #m: Mutex;

  constructor(session: Session, name: string, permits: number, options: LockOptions = {}) {
    if (!Number.isInteger(permits) || permits < 1 || permits > 0xffffffff) {
      throw new InvalidArgumentError(`fence: semaphore ${JSON.stringify(name)}: permits ${permits} must be at least 1`);
    }
    this.#m = new Mutex(session, name, options, Mode.SEMAPHORE, permits);
  }

  /** Waits for a permit and returns its grant; see Mutex.lock. */
  acquire(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#m.lock(options);
  }

  /** Takes a permit if one is free and nobody waits, or fails with LockedError. */
  tryAcquire(options: { signal?: AbortSignal } = {}): Promise<Grant> {
    return this.#m.tryLock(options);
  }

  /** Gives the permit back; the next waiter gets it in the same commit. */
  release(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#m.unlock(options);
  }

  /** The current grant, or undefined when no permit is held. */
  get grant(): Grant | undefined {
    return this.#m.grant;
  }
}
