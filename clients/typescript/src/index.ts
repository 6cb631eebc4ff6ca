/**
 * The fence client for Node: sessions kept alive in the background, locks
 * with fencing tokens and a signal that aborts when a lock may be lost, the
 * fenced key-value store, elections and leases; and the resource side,
 * which refuses writes with stale tokens (HTTP middleware, PostgreSQL).
 *
 * ```ts
 * const c = new Client({ endpoints: ["127.0.0.1:7420"] });
 * const s = await c.session({ ttlMs: 10_000 });
 * const g = await s.lock("orders");
 * await c.kv.put("orders/17", "paid", { token: g.token });
 * await g.release(); await s.close();
 * ```
 *
 * @module
 */
export { Client, DEFAULT_ENDPOINT, type ClientOptions, type TLSOptions } from "./client.js";
export { Session, type SessionOptions } from "./session.js";
export { type Clock, type ClockTimer } from "./time.js";
export { Grant, Mutex, RWMutex, Semaphore, type LockOptions } from "./mutex.js";
export { KV, Watch, type Event, type FenceOptions, type KeyValue, type Listing, type TxnCompare, type TxnOperation, type TxnResponse, type Value, type WriteOptions } from "./kv.js";
export { Election, type LeaderState, type Leadership } from "./election.js";
export { Lease, type LeaseOptions } from "./lease.js";
export * from "./errors.js";
export { Guard, MemoryStore, checkToken, type TokenChecker, type TokenStore } from "./fencing/guard.js";
export {
  HEADER_LOCK,
  HEADER_TOKEN,
  errorResponse,
  fencingHook,
  fencingMiddleware,
  parseToken,
  type ErrorBody,
  type MiddlewareOptions,
  type ReplyLike,
  type RequestLike,
  type ResponseLike,
} from "./fencing/http.js";
export * as pgfence from "./fencing/pg.js";
