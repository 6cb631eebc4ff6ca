// The errors of the client, one class per reason the service gives (as Go's
// sentinel errors), so that a caller writes `err instanceof StaleTokenError`,
// never a match on a message. fromConnect turns a Connect error into one of
// them, as Go's internal/rpcerr does: the reason in the error's detail
// decides, and the status code where a peer sends no detail.

import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorDetail, ErrorDetailSchema, Reason } from "./gen/fence/v1/fence_pb.js";

/** What a FenceError may carry besides its message. */
export interface FenceErrorOptions {
  /** The Connect status code the service answered, if it answered. */
  code?: Code;
  /** The service's structured detail, when it sent one. */
  detail?: ErrorDetail;
  cause?: unknown;
}

/**
 * The base of every error the client throws for a reason of its own or of
 * the service. Errors of the caller's own making (an aborted signal) are
 * thrown as they are: the signal's reason.
 */
export class FenceError extends Error {
  /** The Connect status code the service answered, or Code.Unknown. */
  readonly code: Code;
  /** The service's structured detail, when it sent one. */
  readonly detail: ErrorDetail | undefined;

  constructor(message: string, options: FenceErrorOptions = {}) {
    super(message, { cause: options.cause });
    this.code = options.code ?? Code.Unknown;
    this.detail = options.detail;
  }

  override get name(): string {
    return this.constructor.name;
  }
}

/** A malformed request: a bad lock name, a TTL out of bounds, an oversized value. Retrying fails again. */
export class InvalidArgumentError extends FenceError {}

/** The session does not exist or has expired; everything it held has been released. */
export class SessionNotFoundError extends FenceError {}

/** A lock could not be taken without waiting (tryLock, a lease). */
export class LockedError extends FenceError {
  /** The lock's name. */
  readonly lock: string;
  /** The session that holds it, and its grant's token (0n when the service did not say). */
  readonly holderSession: bigint;
  readonly holderToken: bigint;

  constructor(message: string, options: FenceErrorOptions = {}) {
    super(message, options);
    this.lock = options.detail?.lock ?? "";
    this.holderSession = options.detail?.holderSessionId ?? 0n;
    this.holderToken = options.detail?.holderToken ?? 0n;
  }
}

/** A release, a strict write or a check by a session or token that does not hold the lock. */
export class NotHolderError extends FenceError {}

/**
 * A write whose fencing token is lower than one the resource (the fenced
 * KV store, a middleware's guard, a pgfence table) has accepted for the
 * key. Nothing of the write was applied.
 */
export class StaleTokenError extends FenceError {
  /** The key the write was for. */
  readonly key: string;
  /** The token the key has: the highest it accepted. */
  readonly have: bigint;
  /** The token the write sent, lower than have. */
  readonly got: bigint;

  constructor(message: string, options: FenceErrorOptions & { key?: string; have?: bigint; got?: bigint } = {}) {
    super(message, options);
    this.key = options.key ?? options.detail?.lock ?? "";
    this.have = options.have ?? options.detail?.currentToken ?? 0n;
    this.got = options.got ?? options.detail?.token ?? 0n;
  }
}

/** A compare-and-swap whose expected revision was not the key's. Nothing was written. */
export class RevisionMismatchError extends FenceError {}

/** A lock was not granted within its wait timeout; the wait was given up. */
export class WaitTimeoutError extends FenceError {}

/**
 * The service could not answer: no leader right now, the node is shutting
 * down, or no node could be reached. The call may be retried; a write that
 * failed so may or may not have been applied.
 */
export class UnavailableError extends FenceError {
  /** The leader's API address the node named, "" if none. */
  get leaderAddress(): string {
    return this.detail?.leaderAddress ?? "";
  }
}

/** A write failed because a node's disk is full; another leader may accept the retry. */
export class DiskFullError extends UnavailableError {}

/** No node answered within the dial timeout (a client that never reached its group) or the retry budget. */
export class UnreachableError extends UnavailableError {}

/** A configured limit was reached: sessions, waiters, request size, a user's quota. */
export class LimitError extends FenceError {}

/** A watch from a revision older than the changes the node keeps: list again, and watch from there. */
export class CompactedError extends FenceError {}

/** An acquire whose request was given up (CancelAcquire): it was not granted, and will not be. */
export class CancelledError extends FenceError {}

/** A node of another group than the one the client talks to. */
export class WrongClusterError extends FenceError {}

/**
 * The node did not accept the client's credentials, or the client the
 * node's: a TLS certificate not trusted, TLS on one side only, a missing
 * or revoked bearer token, a session's secret. Retrying does not help.
 */
export class UnauthenticatedError extends FenceError {}

/** A call acting as a session without its secret, or with another. */
export class SessionSecretError extends UnauthenticatedError {}

/** With auth on, a call without a credential the service accepts (bearer token, client certificate). */
export class AuthFailedError extends UnauthenticatedError {}

/** With auth on, the caller's roles do not grant the permission the call needs. */
export class PermissionDeniedError extends FenceError {}

/** A membership change the leader refused. */
export class MembershipError extends FenceError {}

/** A call the group cannot serve yet (a member runs an older version). */
export class UnsupportedError extends FenceError {}

/**
 * The session may have expired on the service: its safe-until passed
 * without a renewal (keepalives got no answer in time, or the process was
 * paused), or what a failed operation took could not be given back. Every
 * lock taken through it must be presumed held by someone else.
 */
export class SessionLostError extends FenceError {}

/** The cause of a grant's end after its release, or a session's after close. */
export class ReleasedError extends FenceError {}

/**
 * The cause of a grant's end when someone else (another client, an
 * operator) released it while its session lived on; the session learns of
 * it from its next keepalive, within a third of its TTL.
 */
export class RevokedError extends FenceError {}

type ErrorClass = new (message: string, options: FenceErrorOptions) => FenceError;

const byReason: ReadonlyMap<Reason, ErrorClass> = new Map<Reason, ErrorClass>([
  [Reason.INVALID_ARGUMENT, InvalidArgumentError],
  [Reason.SESSION_NOT_FOUND, SessionNotFoundError],
  [Reason.LOCKED, LockedError],
  [Reason.NOT_HOLDER, NotHolderError],
  [Reason.STALE_TOKEN, StaleTokenError],
  [Reason.WAIT_TIMEOUT, WaitTimeoutError],
  [Reason.NOT_LEADER, UnavailableError],
  [Reason.LIMIT, LimitError],
  [Reason.REVISION_MISMATCH, RevisionMismatchError],
  [Reason.COMPACTED, CompactedError],
  [Reason.CANCELLED, CancelledError],
  [Reason.DISK_FULL, DiskFullError],
  [Reason.WRONG_CLUSTER, WrongClusterError],
  [Reason.SESSION_SECRET, SessionSecretError],
  [Reason.MEMBERSHIP, MembershipError],
  [Reason.PERMISSION_DENIED, PermissionDeniedError],
  [Reason.AUTH, AuthFailedError],
  [Reason.UNSUPPORTED, UnsupportedError],
]);

const byCode: ReadonlyMap<Code, ErrorClass> = new Map<Code, ErrorClass>([
  [Code.Unavailable, UnavailableError],
  [Code.InvalidArgument, InvalidArgumentError],
  [Code.NotFound, SessionNotFoundError],
  [Code.ResourceExhausted, LimitError],
  [Code.Unauthenticated, UnauthenticatedError],
  [Code.PermissionDenied, PermissionDeniedError],
  [Code.Unimplemented, UnsupportedError],
]);

/** Node's codes of a connection that failed or broke under a call: the node is down or restarting. */
const connectionCodes = new Set(["ECONNREFUSED", "ECONNRESET", "EPIPE", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN", "ECONNABORTED"]);

/** OpenSSL's and Node's codes of a TLS handshake that one side refused. */
const tlsCodes = /^(ERR_TLS_|ERR_SSL_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|CERT_|EPROTO$)/;

/** The `code` strings of err and its causes. */
function nodeCodes(err: unknown): string[] {
  const codes: string[] = [];
  for (let e = err; e instanceof Object && codes.length < 8; e = (e as { cause?: unknown }).cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") {
      codes.push(code);
    }
  }
  return codes;
}

/**
 * Reports whether err is a connection that failed or broke: no node answered the call.
 * @internal
 */
export function connectionFailed(err: unknown): boolean {
  return nodeCodes(err).some((c) => connectionCodes.has(c));
}

/**
 * Converts what a Connect call threw into the client's error: a FenceError
 * of the reason in the error's detail (or of its code, for peers that send
 * none). A broken connection is an UnavailableError, to be retried
 * elsewhere; a refused TLS handshake an UnauthenticatedError, not retried.
 * Errors that are not Connect errors are returned as they are.
 */
export function fromConnect(err: unknown): unknown {
  if (err instanceof FenceError || !(err instanceof ConnectError)) {
    return err;
  }
  const [detail] = err.findDetails(ErrorDetailSchema);
  const message = err.rawMessage;
  const options: FenceErrorOptions = { code: err.code, detail, cause: err };
  if (nodeCodes(err).some((c) => tlsCodes.test(c))) {
    return new UnauthenticatedError(`TLS with the node failed: ${message}`, { ...options, code: Code.Unauthenticated });
  }
  if (connectionFailed(err)) {
    return new UnavailableError(message, { ...options, code: Code.Unavailable });
  }
  const cls = (detail && byReason.get(detail.reason)) ?? byCode.get(err.code) ?? FenceError;
  return new cls(message, options);
}
