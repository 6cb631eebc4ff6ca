import { InvalidArgumentError, NotHolderError, StaleTokenError } from "../errors.js";

/**
 * A TokenStore keeps the highest fencing token each key of a resource has
 * accepted, and admits writes by the fenced write rule: a token lower than
 * the key's highest is refused with StaleTokenError and its write not run;
 * otherwise the write runs and, if it succeeds, its token becomes the key's
 * highest. Writers of one key run one at a time.
 */
export interface TokenStore {
  admit<T>(key: string, token: bigint, write: () => Promise<T>): Promise<T>;
  highest(key: string): Promise<bigint>;
}

/** Checks a token with the lock service; a Client is one. */
export interface TokenChecker {
  check(lock: string, token: bigint): Promise<{ current: boolean; held: boolean; currentToken: bigint }>;
}

/** Refuses token for key unless it is at least highest, as Go's fence.CheckToken does. */
export function checkToken(key: string, token: bigint, highest: bigint): void {
  if (token <= 0n) {
    throw new InvalidArgumentError("fence: invalid argument: a fenced write needs a fencing token (tokens start at 1)");
  }
  if (token < highest) {
    throw new StaleTokenError(`stale fencing token ${token} < ${highest} for key ${key}`, { key, have: highest, got: token });
  }
}

/**
 * The TokenStore of one process, in memory: the tokens are lost when the
 * process ends. Keys are serialized on a chain of promises each.
 */
export class MemoryStore implements TokenStore {
  readonly #keys = new Map<string, { highest: bigint; tail: Promise<unknown> }>();

  async admit<T>(key: string, token: bigint, write: () => Promise<T>): Promise<T> {
    let k = this.#keys.get(key);
    if (!k) {
      k = { highest: 0n, tail: Promise.resolve() };
      this.#keys.set(key, k);
    }
    const entry = k;
    const run = entry.tail.then(async () => {
      checkToken(key, token, entry.highest);
      const out = await write();
      entry.highest = token;
      return out;
    });
    entry.tail = run.catch(() => {});
    return run;
  }

  async highest(key: string): Promise<bigint> {
    return this.#keys.get(key)?.highest ?? 0n;
  }
}

/**
 * A Guard applies the fenced write rule in front of a resource: through
 * its store, and, with a checker, in strict mode too, where a token must
 * also be its lock's current grant (NotHolderError otherwise), asked of
 * the lock service before each write.
 */
export class Guard {
  constructor(
    readonly store: TokenStore = new MemoryStore(),
    readonly checker?: TokenChecker,
  ) {}

  /** Admits a write of key under lock's token, and runs it; see TokenStore.admit. */
  async admit<T>(key: string, lock: string, token: bigint, write: () => Promise<T>): Promise<T> {
    if (key === "") {
      throw new InvalidArgumentError("fence: invalid argument: the resource key is empty");
    }
    if (this.checker) {
      await this.#checkCurrent(lock, token);
    }
    return this.store.admit(key, token, write);
  }

  async #checkCurrent(lock: string, token: bigint): Promise<void> {
    if (lock === "") {
      throw new InvalidArgumentError("fence: invalid argument: strict fencing needs the lock name with the token");
    }
    const res = await this.checker!.check(lock, token);
    if (res.current) {
      return;
    }
    if (!res.held) {
      throw new NotHolderError(`fence: not the lock's holder: token ${token} is not a current grant: lock ${JSON.stringify(lock)} is not held`);
    }
    throw new NotHolderError(`fence: not the lock's holder: token ${token} is not the current grant of lock ${JSON.stringify(lock)} (the current token is ${res.currentToken})`);
  }
}
