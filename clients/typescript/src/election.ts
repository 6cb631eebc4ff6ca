import type { Client } from "./client.js";
import {
  InvalidArgumentError,
  LimitError,
  NotHolderError,
  PermissionDeniedError,
  RevisionMismatchError,
  SessionNotFoundError,
  StaleTokenError,
  UnauthenticatedError,
  WrongClusterError,
} from "./errors.js";
import { EventType, type KeyValue } from "./gen/fence/v1/fence_pb.js";
import { type Grant, Mutex } from "./mutex.js";
import type { Session } from "./session.js";

/** An election's leader, as Client.leader and Client.observeLeader report it. */
export interface LeaderState {
  /** False while nobody leads. */
  elected: boolean;
  /** The leader's value and leadership token (0n while nobody leads). */
  value: string;
  token: bigint;
}

/** A won election: the leader's grant (its token and signal) and value. */
export interface Leadership {
  grant: Grant;
  value: string;
}

const decoder = new TextDecoder();
const nobody: LeaderState = { elected: false, value: "", token: 0n };

/** The lock, and the KV key, of the election name. */
function electionKey(name: string): string {
  return `election/${name}`;
}

/**
 * Elects one leader among the sessions that campaign on a name, like
 * etcd's Election: the leader holds the lock "election/" + name, and its
 * value is kept in the fenced KV store under the same key, written with the
 * leadership's token in strict mode (so a deposed leader cannot overwrite
 * its successor's record) and bound to the leader's session (so it goes
 * when the session ends). Pass the leadership's token with the leader's
 * writes. Get one with Session.election.
 */
export class Election {
  readonly #session: Session;
  readonly #key: string;
  readonly #m: Mutex;

  constructor(session: Session, name: string) {
    this.#session = session;
    this.#key = electionKey(name);
    this.#m = new Mutex(session, this.#key);
  }

  /**
   * Waits until this session leads, then records value as the leader's. A
   * campaign that fails after it was elected (the value cannot be
   * recorded: too long, no permission, a quota) gives leadership up again,
   * so that the next campaigner is elected: it deletes the record if the
   * failed write may have made it, then releases the lock; if the service
   * cannot be told, it gives up the session instead, whose end releases
   * both. Campaigning while leading is proclaim.
   */
  async campaign(value: string, options: { signal?: AbortSignal } = {}): Promise<Leadership> {
    const held = this.#m.grant;
    const grant = await this.#m.lock(options);
    try {
      await this.proclaim(value, options);
    } catch (err) {
      if (grant !== held) {
        await this.#giveUp(grant, err);
      }
      throw err;
    }
    return { grant, value };
  }

  /** Changes the leader's value without giving up leadership; NotHolderError when this session no longer leads. */
  async proclaim(value: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    const grant = this.#m.grant;
    if (!grant) {
      throw new NotHolderError(`fence: not the leader of ${this.#key}`);
    }
    await this.#session.client.kv.put(this.#key, value, { grant, strict: true, boundTo: this.#session, signal: options.signal });
  }

  /** Gives up leadership: the record is deleted and the lock released, so the next campaigner is elected at once. */
  async resign(options: { signal?: AbortSignal } = {}): Promise<void> {
    const grant = this.#m.grant;
    if (!grant) {
      return;
    }
    await this.#session.client.kv.delete(this.#key, { grant, strict: true, signal: options.signal });
    await this.#m.unlock(options);
  }

  /** Undoes a campaign whose proclaim failed with written: the record it may have made, then the lock. */
  async #giveUp(grant: Grant, written: unknown): Promise<void> {
    const s = this.#session;
    if (s.signal.aborted) {
      return; // the session's end releases everything
    }
    const signal = s.undoSignal();
    try {
      if (mayHaveApplied(written)) {
        await s.client.kv.delete(this.#key, { grant, strict: true, signal }).catch((err: unknown) => {
          if (!(err instanceof NotHolderError || err instanceof StaleTokenError)) {
            throw err;
          }
        });
      }
      await this.#m.unlock({ signal }).catch((err: unknown) => {
        if (!(err instanceof NotHolderError)) {
          throw err;
        }
      });
    } catch (err) {
      s.giveUp(`${JSON.stringify(this.#key)} after a failed campaign`, err);
    }
  }
}

/** Reports whether a write that failed with err may have been applied: it was not refused outright. */
function mayHaveApplied(err: unknown): boolean {
  const refused = [InvalidArgumentError, LimitError, PermissionDeniedError, UnauthenticatedError, NotHolderError, StaleTokenError, RevisionMismatchError, SessionNotFoundError, WrongClusterError];
  return !refused.some((cls) => err instanceof cls);
}

/**
 * Whether kv, the election key's value, is a leader's record: written under the election's lock
 * (campaign, proclaim), and so, strictly fenced, by its holder at the time. A write no leader made
 * (no fence, or another lock's) elects nobody.
 */
function leaderRecord(key: string, kv: KeyValue | undefined): kv is KeyValue {
  return kv !== undefined && kv.lock === key && kv.token !== 0n;
}

/** The state an election's record kv (undefined: none) stands for: its leader leads while the record's token is the lock's current grant. */
async function stateOf(c: Client, key: string, kv: KeyValue | undefined, signal?: AbortSignal): Promise<LeaderState> {
  if (!leaderRecord(key, kv)) {
    return nobody;
  }
  const res = await c.check(key, kv.token, { signal });
  return res.current ? { elected: true, value: decoder.decode(kv.value), token: kv.token } : nobody;
}

/** The leader of the election name, linearizably. */
export async function leaderOf(c: Client, name: string, signal?: AbortSignal): Promise<LeaderState> {
  const key = electionKey(name);
  return stateOf(c, key, await c.kv.get(key, { signal }), signal);
}

/** See Client.observeLeader. */
export async function* observeLeader(c: Client, name: string, signal?: AbortSignal): AsyncGenerator<LeaderState> {
  const key = electionKey(name);
  // Read, then watch from the revision after the read: every change is
  // seen once, in order, and none older than the state first reported.
  const l = await c.kv.list(key, { signal });
  let last = await stateOf(c, key, l.kvs.find((kv) => kv.key === key), signal);
  const w = await c.kv.watch(key, { fromRevision: l.revision + 1n, signal });
  try {
    yield last;
    for await (const ev of w) {
      if (ev.kv?.key !== key) {
        continue; // another election whose name starts with this one
      }
      const st = ev.type === EventType.PUT && leaderRecord(key, ev.kv) ? { elected: true, value: decoder.decode(ev.kv.value), token: ev.kv.token } : nobody;
      if (st.elected === last.elected && st.value === last.value && st.token === last.token) {
        continue;
      }
      last = st;
      yield st;
    }
  } finally {
    w.close();
  }
}
