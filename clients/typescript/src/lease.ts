import { randomBytes } from "node:crypto";
import type { Client } from "./client.js";
import { InvalidArgumentError, SessionNotFoundError } from "./errors.js";
import { fromDuration, toDuration } from "./time.js";

/** How a lease is taken. */
export interface LeaseOptions {
  /** How long the lease lasts without a renew (the server allows 1 s to 1 h). */
  ttlMs: number;
  /** As LockOptions.lockDelayMs: if the lease expires instead of being released, the lock goes to nobody else for this long. */
  lockDelayMs?: number;
  /** A label shown in listings, such as "backup.sh on db-2". */
  owner?: string;
  /** The bound on clock drift (default 0.01) and the margin (default 100 ms) taken off safeUntil. */
  drift?: number;
  marginMs?: number;
  signal?: AbortSignal;
}

/**
 * A Lease is a lock taken in one call, for a program that cannot keep a
 * session alive (a cron job, a serverless function): Redis's SET NX PX
 * with a fencing token. Nothing renews it in the background and nothing
 * tells its holder that it lapsed: renew it before safeUntil passes, and
 * stop acting on the lock once it has. Send the token with every write, so
 * that the resource refuses one made after the lease was lost. Take one
 * with Client.lease.
 */
export class Lease {
  /** The lease's id (its session's), and the secret that renews and releases it: keep it as a password. */
  readonly id: bigint;
  readonly secret: string;
  /** The lock it holds, and the grant's fencing token. */
  readonly lock: string;
  readonly token: bigint;
  #safeUntil = 0;
  #ttlMs = 0;

  /** @internal */
  constructor(
    readonly client: Client,
    init: { id: bigint; secret: string; lock: string; token: bigint },
    readonly drift: number,
    readonly marginMs: number,
  ) {
    this.id = init.id;
    this.secret = init.secret;
    this.lock = init.lock;
    this.token = init.token;
  }

  /** Until when, on performance.now()'s clock, the lease is known to hold (0 once released). */
  get safeUntil(): number {
    return this.#safeUntil;
  }

  /** The TTL the service granted at the last take or renewal. */
  get ttlMs(): number {
    return this.#ttlMs;
  }

  /** Extends the lease by its TTL, counted from when this call was sent. */
  async renew(options: { signal?: AbortSignal } = {}): Promise<void> {
    let sent = 0;
    const r = await this.client.unary((ep, signal) => {
      sent = this.client.clock.now();
      return ep.locks.renewLease({ leaseId: this.id, leaseSecret: this.secret }, { signal });
    }, options.signal);
    this.renewed(sent, fromDuration(r.ttl));
  }

  /**
   * Ends the lease and releases its lock. Fails with SessionNotFoundError
   * when the lease had ended before (it expired or was revoked): the lock
   * may have been another's meanwhile.
   */
  async release(options: { signal?: AbortSignal } = {}): Promise<void> {
    let retried = false;
    const r = await this.client.unary(async (ep, signal) => {
      try {
        return await ep.locks.releaseLease({ leaseId: this.id, leaseSecret: this.secret }, { signal });
      } catch (err) {
        retried = true;
        throw err;
      }
    }, options.signal);
    if (!r.released && !retried) {
      throw new SessionNotFoundError(`fence: lease ${this.id} had ended (it expired, or was revoked) before it was released; ${JSON.stringify(this.lock)} may have been another's meanwhile`);
    }
    this.#safeUntil = 0;
  }

  /** Takes in a take or renewal sent at sent that granted ttlMs. @internal */
  renewed(sent: number, ttlMs: number): void {
    this.#ttlMs = ttlMs;
    this.#safeUntil = Math.max(this.#safeUntil, sent + ttlMs * (1 - this.drift) - this.marginMs);
  }
}

/** See Client.lease. */
export async function takeLease(c: Client, name: string, o: LeaseOptions): Promise<Lease> {
  const drift = o.drift ?? 0.01;
  const marginMs = o.marginMs ?? 100;
  if (!(drift >= 0 && drift < 1) || !(marginMs >= 0)) {
    throw new InvalidArgumentError("fence: drift must be in [0, 1) and margin not negative");
  }
  // The lease's secret is drawn here and sent with the call, so that a retry
  // after an attempt whose answer was lost is answered the lease that
  // attempt took.
  const req = {
    lock: name,
    ttl: toDuration(o.ttlMs),
    owner: o.owner ?? "",
    leaseSecret: randomBytes(32).toString("base64url"),
    ...(o.lockDelayMs ? { lockDelay: toDuration(o.lockDelayMs) } : {}),
  };
  let sent = 0;
  const r = await c.unary((ep, signal) => {
    sent = c.clock.now();
    return ep.locks.lease(req, { signal });
  }, o.signal);
  const l = new Lease(c, { id: r.leaseId, secret: r.leaseSecret, lock: r.lock, token: r.token }, drift, marginMs);
  l.renewed(sent, fromDuration(r.ttl));
  return l;
}
